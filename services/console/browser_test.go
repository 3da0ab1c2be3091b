//go:build linux

package console_test

import (
	"bufio"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/secbear/neuron/internal/testenv"
)

// chromiumPath is the browser the test drives: Debian's chromium, never a
// downloaded one.
const chromiumPath = "/usr/bin/chromium"

// browserModules is where scripts/browser-deps.sh npm ci's playwright-core
// and axe-core (outside the repo).
func browserModules() string {
	cache := os.Getenv("NEURON_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "neuron")
	}
	return filepath.Join(cache, "console-browser", "node_modules")
}

// repoRoot is the repository's root (this file is services/console/).
func repoRoot(t *testing.T) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// browserDeps returns node and the modules directory, running
// scripts/browser-deps.sh first when something is missing; it skips,
// with the reason, only where chromium or the modules cannot be had.
func browserDeps(t *testing.T) (node, modules string) {
	t.Helper()
	modules = browserModules()
	have := func() bool {
		_, e1 := os.Stat(chromiumPath)
		_, e2 := os.Stat(filepath.Join(modules, "playwright-core"))
		_, e3 := os.Stat(filepath.Join(modules, "axe-core"))
		return e1 == nil && e2 == nil && e3 == nil
	}
	if !have() {
		out, err := exec.Command("bash", filepath.Join(repoRoot(t), "scripts", "browser-deps.sh")).CombinedOutput()
		t.Logf("scripts/browser-deps.sh: %v\n%s", err, out)
	}
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Skipf("no %s and scripts/browser-deps.sh could not install Debian's chromium here", chromiumPath)
	}
	if !have() {
		t.Skipf("playwright-core and axe-core are not in %s and scripts/browser-deps.sh could not npm ci them", modules)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("no node on PATH for playwright-core")
	}
	return node, modules
}

// artifactsDir is where screenshots go: $NEURON_ARTIFACTS/console, else
// bin/artifacts/console (gitignored).
func artifactsDir(t *testing.T) string {
	if d := os.Getenv("NEURON_ARTIFACTS"); d != "" {
		return filepath.Join(d, "console")
	}
	return filepath.Join(repoRoot(t), "bin", "artifacts", "console")
}

// cleanEnv is the environment without model credentials and neuron's
// own variables, so the services run the scripted model.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(name, "NEURON_"), strings.HasSuffix(name, "_API_KEY"), name == "OPENAI_BASE_URL":
			continue
		}
		env = append(env, kv)
	}
	return env
}

// TestBrowser is issue 22's done-when in a real browser: `neuron up`
// (with the console beside the services, scripted model), then
// console.test.cjs in headless Chromium: the agent editor refuses an
// invalid definition with the service's message and creates a valid
// one; a workflow that asks for approval is started, its text streams
// in, the call is approved by clicking, the result and the cost show; a
// keyboard-only path approves another; axe-core finds no serious
// violation on the main pages. Screenshots go to the artifacts dir.
func TestBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("starts neuron up and a browser; skipped with -short")
	}
	node, modules := browserDeps(t)
	bin := testenv.BuildStaticDir(t,
		"github.com/secbear/neuron/cmd/neuron",
		"github.com/secbear/neuron/services/state/cmd/state",
		"github.com/secbear/neuron/services/operator/cmd/operator",
		"github.com/secbear/neuron/services/environment/cmd/environment",
		"github.com/secbear/neuron/services/orchestrator/cmd/orchestrator",
		"github.com/secbear/neuron/services/console/cmd/console")

	// Four loopback ports free a moment ago (a parallel test could take
	// one; neuron up then says so and this test fails with its output).
	addrs := make([]string, 4)
	var lns []net.Listener
	for i := range addrs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		addrs[i] = ln.Addr().String()
	}
	for _, ln := range lns {
		ln.Close()
	}
	up := exec.Command(filepath.Join(bin, "neuron"), "up", "--data-dir", t.TempDir(), "--isolation", "none",
		"--orchestrator-addr", addrs[0], "--operator-addr", addrs[1], "--state-addr", addrs[2], "--environment-addr", addrs[3],
		"--console-addr", "127.0.0.1:0")
	// Every workflow may make one operator call and then asks for more
	// (the limit form of the workflow page): an approved call's resumed
	// call is the second.
	up.Env = append(cleanEnv(), "NEURON_ORCHESTRATOR_MAX_STEPS=1", "NEURON_ORCHESTRATOR_ON_LIMIT=ask")
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	up.Stdout, up.Stderr = pw, pw
	startUp(t, up, pw)
	var (
		mu  sync.Mutex
		out strings.Builder
	)
	consoleURL := make(chan string, 1)
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(pr)
		re := regexp.MustCompile(`^console\s+(http://\S+)`)
		for sc.Scan() {
			mu.Lock()
			out.WriteString(sc.Text() + "\n")
			mu.Unlock()
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				consoleURL <- m[1]
			}
		}
	}()
	output := func() string { mu.Lock(); defer mu.Unlock(); return out.String() }
	var url string
	select {
	case url = <-consoleURL:
	case <-time.After(2 * time.Minute):
		t.Fatalf("neuron up did not print the console's URL:\n%s", output())
	}

	// A second console of the same services outside dev mode, for the
	// login path (the dev services take any token).
	loginAddr := freeAddr(t)
	login := exec.Command(filepath.Join(bin, "console"), "--addr", loginAddr, "--plaintext",
		"--orchestrator-addr", addrs[0], "--state-addr", addrs[2], "--log-format", "text")
	login.Env = cleanEnv()
	if err := login.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = login.Process.Signal(syscall.SIGTERM); _ = login.Wait() })

	art := artifactsDir(t)
	if err := os.MkdirAll(art, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(repoRoot(t), "services", "console", "browser", "console.test.cjs"))
	cmd.Env = append(cleanEnv(), "CONSOLE_URL="+url, "LOGIN_URL=http://"+loginAddr, "OPERATOR_ADDR="+addrs[1], "ARTIFACTS="+art, "NODE_PATH="+modules)
	res, err := cmd.CombinedOutput()
	t.Logf("console.test.cjs (screenshots in %s):\n%s", art, res)
	if err != nil || !strings.Contains(string(res), "PASS") {
		t.Fatalf("the browser test failed: %v\nneuron up:\n%s", err, output())
	}
}

// freeAddr is a loopback address that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startUp starts neuron up; the cleanup stops it with SIGTERM.
func startUp(t *testing.T, up *exec.Cmd, pw *os.File) {
	t.Helper()
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	done := make(chan struct{})
	go func() { _ = up.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = up.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			_ = up.Process.Kill()
			<-done
			t.Error("neuron up did not stop within 60s of SIGTERM")
		}
	})
}
