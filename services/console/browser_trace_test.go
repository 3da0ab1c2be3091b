//go:build linux

package console_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/sandbox"
)

// jaegerVersion is the Jaeger v2 scripts/jaeger.sh builds.
const jaegerVersion = "v1.76.0"

// jaegerBinary is the Jaeger v2 scripts/jaeger.sh built
// ($NEURON_JAEGER overrides), or a skip saying how to build it.
func jaegerBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("NEURON_JAEGER"); p != "" {
		return p
	}
	cache := os.Getenv("NEURON_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "neuron")
	}
	p := filepath.Join(cache, "jaeger-"+jaegerVersion, "jaeger")
	if _, err := os.Stat(p); err != nil {
		t.Skipf("Jaeger is not built (scripts/jaeger.sh builds it into %s; make test runs it)", p)
	}
	return p
}

// TestBrowserTrace is issue 23's done-when in a real browser: `neuron up
// --demo --isolation process --jaeger` (a real Jaeger v2, built by
// scripts/jaeger.sh, started by neuron up, the services' traces sent to
// it and the console reading its query API), then
// trace.test.cjs in headless Chromium opens the demo workflow's page,
// follows its trace link and checks the waterfall: spans of the four
// services, the sandboxed operator's invoke_agent nested under the
// workflow span, a chat span's GenAI attributes on click, and axe-core.
// Screenshots go to the artifacts dir (trace.png, trace-span.png). It
// skips, saying why, without Jaeger, chromium, the npm modules, or the
// sandbox the four-service trace needs.
func TestBrowserTrace(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Jaeger, neuron up and a browser; skipped with -short")
	}
	if err := sandbox.Supported(); err != nil {
		t.Skipf("the demo runs its agents in the environment's sandbox (the four services' trace) only where Landlock is: %v", err)
	}
	if err := sandbox.CgroupSupported(); err != nil {
		t.Skipf("the demo runs its agents in the environment's sandbox (the four services' trace) only with a cgroup: %v", err)
	}
	jaeger := jaegerBinary(t)
	node, modules := browserDeps(t)
	bin := testenv.BuildStaticDir(t,
		"github.com/secbear/neuron/cmd/neuron",
		"github.com/secbear/neuron/services/state/cmd/state",
		"github.com/secbear/neuron/services/operator/cmd/operator",
		"github.com/secbear/neuron/services/environment/cmd/environment",
		"github.com/secbear/neuron/services/orchestrator/cmd/orchestrator",
		"github.com/secbear/neuron/services/console/cmd/console")

	up := exec.Command(filepath.Join(bin, "neuron"), "up", "--data-dir", t.TempDir(), "--demo", "--isolation", "process",
		"--orchestrator-addr", freeAddr(t), "--operator-addr", freeAddr(t), "--state-addr", freeAddr(t), "--environment-addr", freeAddr(t),
		"--console-addr", "127.0.0.1:0", "--jaeger")
	up.Env = append(cleanEnv(), "NEURON_JAEGER="+jaeger)
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
	consoleURL, workflowID := make(chan string, 1), make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		reURL := regexp.MustCompile(`^console\s+(http://\S+)`)
		reWF := regexp.MustCompile(`neuron workflows show (\S+)`)
		for sc.Scan() {
			mu.Lock()
			out.WriteString(sc.Text() + "\n")
			mu.Unlock()
			if m := reURL.FindStringSubmatch(sc.Text()); m != nil {
				consoleURL <- m[1]
			}
			if m := reWF.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case workflowID <- m[1]:
				default:
				}
			}
		}
	}()
	output := func() string { mu.Lock(); defer mu.Unlock(); return out.String() }
	var url, wf string
	for url == "" || wf == "" {
		select {
		case url = <-consoleURL:
		case wf = <-workflowID:
		case <-time.After(5 * time.Minute):
			t.Fatalf("neuron up did not print the console's URL and the demo's workflow:\n%s", output())
		}
	}

	art := artifactsDir(t)
	if err := os.MkdirAll(art, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(repoRoot(t), "services", "console", "browser", "trace.test.cjs"))
	cmd.Env = append(cleanEnv(), "CONSOLE_URL="+url, "WORKFLOW_ID="+wf, "ARTIFACTS="+art, "NODE_PATH="+modules)
	res, err := cmd.CombinedOutput()
	t.Logf("trace.test.cjs (screenshots in %s):\n%s", art, res)
	if err != nil || !strings.Contains(string(res), "PASS") {
		t.Fatalf("the browser test failed: %v\nneuron up:\n%s", err, output())
	}
}
