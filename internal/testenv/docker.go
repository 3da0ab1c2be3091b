package testenv

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// DockerEngine is a running dockerd started for one test.
type DockerEngine struct {
	// Host is the engine's endpoint, "unix:///...", for DOCKER_HOST or a
	// client's WithHost.
	Host string
	// LogPath is the file holding dockerd's (and its containerd's) log,
	// removed with the engine when the test ends.
	LogPath string
}

// Bounds of starting and stopping a dockerd.
const (
	dockerStartTimeout = time.Minute
	dockerStopTimeout  = 30 * time.Second
)

// Docker starts a private dockerd for the calling test: its data root,
// exec root, pid file and API socket live in a fresh directory under
// os.TempDir() (short, because the socket path must fit in 108 bytes),
// and it runs its own containerd. Docker returns once the engine answers
// /_ping. When the test ends it stops the engine (SIGTERM, SIGKILL after
// 30s), unmounts whatever dockerd left mounted in its directory and
// removes it.
//
// No image can be pulled in this environment: build images FROM scratch
// holding a static binary (see BuildStatic). Each call starts a new
// engine (about two seconds), so share one between the subtests of a
// package.
//
// It skips the test when dockerd is not installed (apt-get install
// docker.io), when the test does not run as root, and when dockerd does
// not come up (the skip message quotes the end of its log).
func Docker(t testing.TB) *DockerEngine {
	t.Helper()
	bin, err := exec.LookPath("dockerd")
	if err != nil {
		t.Skip("dockerd is not installed: apt-get install -y docker.io")
	}
	if os.Geteuid() != 0 {
		t.Skip("dockerd needs root; run this test as root")
	}
	dir, err := os.MkdirTemp("", "dk")
	if err != nil {
		t.Fatalf("docker dir: %v", err)
	}
	t.Cleanup(func() { dockerRemoveDir(t, dir) })

	e := &DockerEngine{
		Host:    "unix://" + filepath.Join(dir, "d.sock"),
		LogPath: filepath.Join(dir, "dockerd.log"),
	}
	logFile, err := os.Create(e.LogPath)
	if err != nil {
		t.Fatalf("dockerd log: %v", err)
	}
	cmd := exec.Command(bin,
		"--data-root", filepath.Join(dir, "data"),
		"--exec-root", filepath.Join(dir, "x"),
		"--pidfile", filepath.Join(dir, "dockerd.pid"),
		"--host", e.Host,
		// Containers left running at the end are only stopped, never
		// waited for at length.
		"--shutdown-timeout", "2",
	)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		t.Skipf("dockerd could not start: %v", err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		logFile.Close()
		close(exited)
	}()
	// Registered after the directory's cleanup, so it runs first.
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(dockerStopTimeout):
			t.Logf("dockerd did not stop within %v of SIGTERM; killing it", dockerStopTimeout)
			_ = cmd.Process.Kill()
			<-exited
		}
	})

	ctx, cancel := context.WithTimeout(context.Background(), dockerStartTimeout)
	defer cancel()
	if err := dockerWaitPing(ctx, filepath.Join(dir, "d.sock"), exited); err != nil {
		if errors.Is(err, errDockerExited) {
			err = fmt.Errorf("%w (%v)", err, waitErr)
		}
		t.Skipf("dockerd did not come up: %v\n%s", err, dockerTail(e.LogPath))
	}
	return e
}

var errDockerExited = errors.New("dockerd exited")

// dockerWaitPing polls GET /_ping on the socket until it answers OK, the
// process exits or ctx ends.
func dockerWaitPing(ctx context.Context, sock string, exited <-chan struct{}) error {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	ping := func() error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://docker/_ping", nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64))
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/_ping: %s %q", resp.Status, body)
		}
		return nil
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		err := ping()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return errDockerExited
		case <-ctx.Done():
			return fmt.Errorf("no answer on %s within %v (last: %v)", sock, dockerStartTimeout, err)
		case <-tick.C:
		}
	}
}

// dockerRemoveDir unmounts every mount point under dir, deepest first
// (dockerd bind-mounts its data root and leaves overlay and namespace
// mounts behind when it is killed), then removes dir.
func dockerRemoveDir(t testing.TB, dir string) {
	mounts, err := dockerMountsUnder(dir)
	if err != nil {
		t.Logf("listing mounts under %s: %v", dir, err)
	}
	for _, m := range mounts {
		// Lazy, so a busy mount point does not stop the rest.
		if out, err := exec.Command("umount", "-l", m).CombinedOutput(); err != nil {
			t.Logf("umount %s: %v: %s", m, err, bytes.TrimSpace(out))
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Logf("removing the docker dir: %v", err)
	}
}

// dockerMountsUnder returns the mount points at or under dir, deepest
// first, from /proc/self/mountinfo (none on a system without it).
func dockerMountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options ...
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := dockerUnescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, sc.Err()
}

// dockerUnescapeMount undoes mountinfo's octal escapes (\040 for a
// space).
func dockerUnescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// dockerTail returns the last lines of dockerd's log, for skip and
// failure messages.
func dockerTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no dockerd log: " + err.Error() + ")"
	}
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// staticBuild is one package's build, done once per test binary.
type staticBuild struct {
	once sync.Once
	path string
	err  error
}

// staticBuilds caches BuildStatic's builds by package for the life of the
// test binary: every test of a package that needs the operator binary
// shares one build.
var staticBuilds = struct {
	sync.Mutex
	m map[string]*staticBuild
}{m: map[string]*staticBuild{}}

// BuildStatic builds pkg (an import path such as
// "github.com/secbear/neuron/services/operator/cmd/operator", or a path
// relative to the test's directory) as a static binary,
//
//	CGO_ENABLED=0 go build -trimpath -o DIR/NAME pkg
//
// where NAME is the last element of pkg, and returns its path. The build
// runs once per package per test binary. DIR is the same for every run
// of the same package from the same directory (under os.TempDir()), and
// each build replaces the binary atomically, so repeated runs leave one
// copy on disk rather than one per run. It skips the test when go is not
// on PATH and fails it when the build fails.
//
// A cold build of a large command takes minutes; later builds reuse Go's
// build cache. With PrebuiltEnv set (make test), the binary built before
// the tests is used instead.
func BuildStatic(t testing.TB, pkg string) string {
	t.Helper()
	if p := prebuilt(pkg); p != "" {
		return p
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go command is not on PATH; it is needed to build static binaries for images")
	}
	staticBuilds.Lock()
	b, ok := staticBuilds.m[pkg]
	if !ok {
		b = &staticBuild{}
		staticBuilds.m[pkg] = b
	}
	staticBuilds.Unlock()
	b.once.Do(func() { b.path, b.err = buildStatic(goBin, pkg) })
	if b.err != nil {
		t.Fatalf("building %s: %v", pkg, b.err)
	}
	return b.path
}

// PrebuiltEnv names a directory of static binaries built before the
// tests start (make test builds TEST_BINARIES there), so that no test's
// clock, and no package's -timeout, includes a build on a cold machine.
// BuildStatic and BuildStaticDir take a command's binary from it, by the
// last element of its package path, when it is there.
const PrebuiltEnv = "NEURON_TEST_BINARIES"

// prebuilt is pkg's binary in the PrebuiltEnv directory; "" when none.
func prebuilt(pkg string) string {
	dir := os.Getenv(PrebuiltEnv)
	if dir == "" {
		return ""
	}
	p := filepath.Join(dir, path.Base(path.Clean(filepath.ToSlash(pkg))))
	if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() {
		return ""
	}
	return p
}

// BuildStaticDir returns a directory holding the static binaries of all
// pkgs side by side (for a program that finds its siblings there), taken
// from the PrebuiltEnv directory when it has them all, else built into a
// directory of its own, once per test binary and set of packages.
func BuildStaticDir(t testing.TB, pkgs ...string) string {
	t.Helper()
	if dir := os.Getenv(PrebuiltEnv); dir != "" {
		all := true
		for _, pkg := range pkgs {
			all = all && prebuilt(pkg) != ""
		}
		if all {
			return dir
		}
	}
	dir := filepath.Dir(BuildStatic(t, pkgs[0]))
	for _, pkg := range pkgs[1:] {
		if d := filepath.Dir(BuildStatic(t, pkg)); d != dir {
			// Each package builds into its own directory: link them
			// into one.
			dir = linkDir(t, pkgs)
			break
		}
	}
	return dir
}

// linkDir is a directory of hard links (or copies) of pkgs' binaries.
func linkDir(t testing.TB, pkgs []string) string {
	t.Helper()
	dir := t.TempDir()
	for _, pkg := range pkgs {
		src := BuildStatic(t, pkg)
		dst := filepath.Join(dir, filepath.Base(src))
		if err := os.Link(src, dst); err != nil {
			b, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dst, b, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}

// buildStatic runs the build of BuildStatic.
func buildStatic(goBin, pkg string) (string, error) {
	name := path.Base(path.Clean(filepath.ToSlash(pkg)))
	if name == "." || name == "/" || name == ".." {
		return "", fmt.Errorf("package %q names no command", pkg)
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	key := sha256.Sum256([]byte(wd + "\x00" + pkg))
	dir := filepath.Join(os.TempDir(), "neuron-testenv-build", hex.EncodeToString(key[:8]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, name+".tmp*")
	if err != nil {
		return "", err
	}
	tmp.Close()
	defer os.Remove(tmp.Name()) // a no-op once renamed
	cmd := exec.Command(goBin, "build", "-trimpath", "-o", tmp.Name(), pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("CGO_ENABLED=0 go build -trimpath %s: %v\n%s", pkg, err, out.Bytes())
	}
	final := filepath.Join(dir, name)
	if err := os.Rename(tmp.Name(), final); err != nil {
		return "", err
	}
	return final, nil
}
