package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/secbear/neuron/pkg/sandbox"
)

func TestMain(m *testing.M) {
	sandbox.Main()
	if what := os.Getenv(probeEnv); what != "" {
		runProbe(what) // this binary, run inside the sandbox by a test
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// requireLandlock skips a test that needs the kernel to confine.
func requireLandlock(t *testing.T) {
	t.Helper()
	if err := sandbox.Supported(); err != nil {
		t.Skipf("Landlock unavailable, confinement cannot be tested: %v", err)
	}
}

// policy returns a policy with a fresh workspace.
func policy(t *testing.T) sandbox.Policy {
	t.Helper()
	return sandbox.Policy{Workspace: t.TempDir(), Timeout: 30 * time.Second}
}

// run runs argv under p and fails the test if it did not start.
func run(t *testing.T, p sandbox.Policy, argv ...string) *sandbox.Result {
	t.Helper()
	res, err := sandbox.Run(context.Background(), p, argv, nil)
	if err != nil {
		t.Fatalf("Run(%q): %v", argv, err)
	}
	return res
}

// sh runs a /bin/sh script under p.
func sh(t *testing.T, p sandbox.Policy, script string) *sandbox.Result {
	t.Helper()
	return run(t, p, "/bin/sh", "-c", script)
}

func checkExit(t *testing.T, res *sandbox.Result, code int, stdout, stderr string) {
	t.Helper()
	if res.ExitCode != code || string(res.Stdout) != stdout || string(res.Stderr) != stderr {
		t.Errorf("got exit %d signal %q stdout %q stderr %q; want exit %d stdout %q stderr %q",
			res.ExitCode, res.Signal, res.Stdout, res.Stderr, code, stdout, stderr)
	}
}

// readPid reads a pid the child wrote to a file in the workspace.
func readPid(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	state := strings.Fields(string(b[i+1:]))[0]
	return state != "Z" && state != "X"
}

// checkGroupGone asserts that no live process is left in group pgid and
// that the listed pids are gone.
func checkGroupGone(t *testing.T, pgid int, pids ...int) {
	t.Helper()
	for _, pid := range append([]int{pgid}, pids...) {
		if alive(pid) {
			t.Errorf("process %d survived", pid)
		}
	}
	if err := syscall.Kill(-pgid, 0); !errors.Is(err, syscall.ESRCH) {
		// Only zombies awaiting init may remain.
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || !alive(pid) {
				continue
			}
			if g, _ := syscall.Getpgid(pid); g == pgid {
				t.Errorf("process %d of group %d survived", pid, pgid)
			}
		}
	}
}

func TestSupported(t *testing.T) {
	err := sandbox.Supported()
	if err != nil && !errors.Is(err, sandbox.ErrUnsupported) {
		t.Fatalf("Supported() = %v, want nil or ErrUnsupported", err)
	}
	if err != nil {
		_, runErr := sandbox.Run(context.Background(), policy(t), []string{"true"}, nil)
		if !errors.Is(runErr, sandbox.ErrUnsupported) {
			t.Fatalf("Run on an unsupported kernel = %v, want ErrUnsupported (fail closed)", runErr)
		}
	}
}

func TestWorkspaceReadWrite(t *testing.T) {
	requireLandlock(t)
	p := policy(t)
	res := sh(t, p, `echo hi > f && mkdir -p d/e && mv f d/e/g && ln -s d/e/g link && cat link && rm -r d link && ls -A`)
	checkExit(t, res, 0, "hi\n", "")
	entries, err := os.ReadDir(p.Workspace)
	if err != nil || len(entries) != 0 {
		t.Errorf("workspace after clean-up: %v %v, want empty", entries, err)
	}
	res = sh(t, p, `printf data > out`)
	checkExit(t, res, 0, "", "")
	if b, err := os.ReadFile(filepath.Join(p.Workspace, "out")); err != nil || string(b) != "data" {
		t.Errorf("file written in the sandbox: %q %v, want \"data\"", b, err)
	}
}

func TestOutsideWorkspaceRefused(t *testing.T) {
	requireLandlock(t)
	outside := t.TempDir() // a sibling of the workspace
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte("s3cret"), 0o644); err != nil {
		t.Fatal(err)
	}
	home, err := os.UserHomeDir()
	if err != nil {
		t.Fatal(err)
	}
	p := policy(t)
	link := filepath.Join(p.Workspace, "link")
	if err := os.Symlink(secret, link); err != nil {
		t.Fatal(err)
	}
	dirLink := filepath.Join(p.Workspace, "dirlink")
	if err := os.Symlink(outside, dirLink); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		argv   []string
		code   int
		stderr string
	}{
		{"read sibling", []string{"cat", secret}, 1, "cat: " + secret + ": Permission denied\n"},
		{"write sibling", []string{"touch", filepath.Join(outside, "new")}, 1, "touch: cannot touch '" + filepath.Join(outside, "new") + "': Permission denied\n"},
		{"truncate sibling", []string{"truncate", "-s", "0", secret}, 1, "truncate: cannot open '" + secret + "' for writing: Permission denied\n"},
		{"symlink to file outside", []string{"cat", link}, 1, "cat: " + link + ": Permission denied\n"},
		{"symlink to dir outside", []string{"cat", filepath.Join(dirLink, "secret")}, 1, "cat: " + filepath.Join(dirLink, "secret") + ": Permission denied\n"},
		{"list home", []string{"ls", home}, 2, "ls: cannot open directory '" + home + "': Permission denied\n"},
		{"list /root", []string{"ls", "/root"}, 2, "ls: cannot open directory '/root': Permission denied\n"},
		{"read /etc/shadow", []string{"cat", "/etc/shadow"}, 1, "cat: /etc/shadow: Permission denied\n"},
		{"read another process's environment", []string{"cat", fmt.Sprintf("/proc/%d/environ", os.Getpid())}, 1, fmt.Sprintf("cat: /proc/%d/environ: Permission denied\n", os.Getpid())},
		{"write /tmp", []string{"touch", "/tmp/sandbox-escape"}, 1, "touch: cannot touch '/tmp/sandbox-escape': Permission denied\n"},
		// Landlock reports a refused link across its rules as EXDEV.
		{"hard link outside file in", []string{"ln", secret, "hard"}, 1, "ln: failed to create hard link 'hard' => '" + secret + "': Invalid cross-device link\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := run(t, p, tt.argv...)
			checkExit(t, res, tt.code, "", tt.stderr)
		})
	}
	if b, err := os.ReadFile(secret); err != nil || string(b) != "s3cret" {
		t.Errorf("secret after the runs: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(outside, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("file created outside the workspace: %v", err)
	}
}

func TestEnvironmentNotInherited(t *testing.T) {
	requireLandlock(t)
	t.Setenv("ANTHROPIC_API_KEY", "secret")
	p := policy(t)
	res := run(t, p, "env")
	checkExit(t, res, 0, strings.Join(sandbox.DefaultEnv(p.Workspace), "\n")+"\n", "")

	p.Env = []string{"ONLY=this"}
	res = run(t, p, "/usr/bin/env")
	checkExit(t, res, 0, "ONLY=this\n", "")

	p.Env = []string{}
	res = run(t, p, "/usr/bin/env")
	checkExit(t, res, 0, "", "")
}

func TestPrivateTmp(t *testing.T) {
	requireLandlock(t)
	p := policy(t)
	p.PrivateTmp = true
	res := sh(t, p, `f=$(mktemp) && echo x > "$f" && cat "$f" && echo "$TMPDIR" > tmpdir`)
	checkExit(t, res, 0, "x\n", "")
	b, err := os.ReadFile(filepath.Join(p.Workspace, "tmpdir"))
	if err != nil {
		t.Fatal(err)
	}
	dir := strings.TrimSpace(string(b))
	if dir == p.Workspace || !strings.HasPrefix(dir, os.TempDir()) {
		t.Errorf("TMPDIR = %q, want a directory under %s", dir, os.TempDir())
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("private tmp %s left behind: %v", dir, err)
	}
}

func TestStdin(t *testing.T) {
	requireLandlock(t)
	res, err := sandbox.Run(context.Background(), policy(t), []string{"tr", "a-z", "A-Z"}, strings.NewReader("hello"))
	if err != nil {
		t.Fatal(err)
	}
	checkExit(t, res, 0, "HELLO", "")
}

func TestExitCode(t *testing.T) {
	requireLandlock(t)
	res := sh(t, policy(t), "echo out; echo err >&2; exit 3")
	checkExit(t, res, 3, "out\n", "err\n")
	if res.Signal != "" || res.TimedOut {
		t.Errorf("signal %q timed out %v, want neither", res.Signal, res.TimedOut)
	}
}

func TestProgramNotFound(t *testing.T) {
	requireLandlock(t)
	_, err := sandbox.Run(context.Background(), policy(t), []string{"no-such-program"}, nil)
	want := `sandbox: exec no-such-program: executable file not found in PATH "/usr/local/bin:/usr/bin:/bin"`
	if err == nil || err.Error() != want {
		t.Fatalf("err = %v, want %s", err, want)
	}
}

func TestTimeoutKillsProcessGroup(t *testing.T) {
	requireLandlock(t)
	p := policy(t)
	p.Timeout = 500 * time.Millisecond
	start := time.Now()
	res := sh(t, p, `echo $$ > pgid; sleep 100 & echo $! > bg; sleep 100 & echo $! > bg2; sleep 100; wait`)
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Errorf("Run took %v after a 500ms timeout", elapsed)
	}
	if !res.TimedOut || res.Signal != "SIGKILL" || res.ExitCode != -1 {
		t.Errorf("timed out %v signal %q exit %d, want true SIGKILL -1", res.TimedOut, res.Signal, res.ExitCode)
	}
	if res.Duration < p.Timeout {
		t.Errorf("Duration %v shorter than the timeout", res.Duration)
	}
	pgid := readPid(t, filepath.Join(p.Workspace, "pgid"))
	checkGroupGone(t, pgid, readPid(t, filepath.Join(p.Workspace, "bg")), readPid(t, filepath.Join(p.Workspace, "bg2")))
}

func TestBackgroundJobsDoNotOutliveRun(t *testing.T) {
	requireLandlock(t)
	p := policy(t)
	start := time.Now()
	// The background job holds stdout open; Run must not wait for it.
	res := sh(t, p, `echo $$ > pgid; sleep 100 & echo $! > bg; echo done`)
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Errorf("Run took %v waiting for a background job", elapsed)
	}
	checkExit(t, res, 0, "done\n", "")
	checkGroupGone(t, readPid(t, filepath.Join(p.Workspace, "pgid")), readPid(t, filepath.Join(p.Workspace, "bg")))
}

func TestContextCancelKills(t *testing.T) {
	requireLandlock(t)
	p := policy(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Cancel once the command has started its background sleep (a fixed
	// delay failed on a loaded machine before the shell had run at all).
	cancelled := make(chan time.Time, 1)
	go func() {
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if b, err := os.ReadFile(filepath.Join(p.Workspace, "bg")); err == nil && len(b) > 0 && b[len(b)-1] == '\n' {
				break
			}
		}
		cancelled <- time.Now()
		cancel()
	}()
	res, err := sandbox.Run(ctx, p, []string{"/bin/sh", "-c", `echo $$ > pgid; sleep 100 & echo $! > bg; sleep 100`}, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if elapsed := time.Since(<-cancelled); elapsed > 5*time.Second {
		t.Errorf("Run took %v after cancel", elapsed)
	}
	if res == nil || res.Signal != "SIGKILL" || res.TimedOut {
		t.Fatalf("result %+v, want killed by SIGKILL, not timed out", res)
	}
	checkGroupGone(t, readPid(t, filepath.Join(p.Workspace, "pgid")), readPid(t, filepath.Join(p.Workspace, "bg")))

	if _, err := sandbox.Run(ctx, p, []string{"true"}, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("Run with a cancelled context: %v, want context.Canceled", err)
	}
}

func TestOutputTruncation(t *testing.T) {
	requireLandlock(t)
	p := policy(t)
	p.MaxOutput = 10
	res := sh(t, p, `head -c 100000 /dev/zero | tr '\0' a; printf 'errors here' >&2`)
	checkExit(t, res, 0, "aaaaaaaaaa", "errors her")
	if res.StdoutSize != 100000 || res.StderrSize != 11 {
		t.Errorf("sizes %d %d, want 100000 11", res.StdoutSize, res.StderrSize)
	}
}

func TestFileSizeLimit(t *testing.T) {
	requireLandlock(t)
	p := policy(t)
	p.Limits.FileSizeBytes = 4096
	res := sh(t, p, `exec head -c 10000 /dev/zero > big`)
	if res.Signal != "SIGXFSZ" || res.ExitCode != -1 {
		t.Errorf("signal %q exit %d, want SIGXFSZ -1", res.Signal, res.ExitCode)
	}
	fi, err := os.Stat(filepath.Join(p.Workspace, "big"))
	if err != nil || fi.Size() != 4096 {
		t.Errorf("file: %v %v, want 4096 bytes", fi, err)
	}
}

func TestCPULimit(t *testing.T) {
	requireLandlock(t)
	p := policy(t)
	p.Limits.CPUSeconds = 1
	res := sh(t, p, `while :; do :; done`)
	if res.Signal != "SIGXCPU" || res.TimedOut {
		t.Errorf("signal %q timed out %v, want SIGXCPU, not timed out", res.Signal, res.TimedOut)
	}
}

func TestOpenFilesLimit(t *testing.T) {
	requireLandlock(t)
	p := policy(t)
	p.Limits.OpenFiles = 5
	res := run(t, p, "/bin/bash", "-c", `ulimit -n; ulimit -Hn; exec 7>f`)
	checkExit(t, res, 1, "5\n5\n", "/bin/bash: line 1: 7: Bad file descriptor\n")
}

func TestNoCapabilitiesNoNewPrivs(t *testing.T) {
	requireLandlock(t)
	p := policy(t)
	// /proc/self resolves to the trampoline, which becomes grep.
	p.ReadOnly = []string{"/proc/self"}
	res := run(t, p, "grep", "-E", "^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs):", "/proc/self/status")
	checkExit(t, res, 0, "CapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\n", "")

	// Landlock refuses device nodes in the workspace (and the missing
	// CAP_MKNOD would too).
	res = run(t, policy(t), "mknod", "disk", "b", "8", "0")
	checkExit(t, res, 1, "", "mknod: disk: Permission denied\n")
}

func TestCannotSignalOutside(t *testing.T) {
	requireLandlock(t)
	res := run(t, policy(t), "/bin/bash", "-c", fmt.Sprintf("kill -0 %d", os.Getpid()))
	checkExit(t, res, 1, "", fmt.Sprintf("/bin/bash: line 1: kill: (%d) - Operation not permitted\n", os.Getpid()))
}

func TestRestrictNetwork(t *testing.T) {
	requireLandlock(t)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	script := fmt.Sprintf("exec 3<>/dev/tcp/127.0.0.1/%d && echo connected", ln.Addr().(*net.TCPAddr).Port)
	p := policy(t)
	checkExit(t, run(t, p, "/bin/bash", "-c", script), 0, "connected\n", "")

	p.RestrictNetwork = true
	res, err := sandbox.Run(context.Background(), p, []string{"/bin/bash", "-c", script}, nil)
	if errors.Is(err, sandbox.ErrUnsupported) {
		t.Skipf("kernel cannot restrict TCP: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	checkExit(t, res, 1, "", fmt.Sprintf("/bin/bash: connect: Permission denied\n/bin/bash: line 1: /dev/tcp/127.0.0.1/%d: Permission denied\n", ln.Addr().(*net.TCPAddr).Port))
}

func TestNamespaces(t *testing.T) {
	requireLandlock(t)
	// A host loopback listener: reachable without a network namespace,
	// not from inside one (its loopback is down and empty).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	probe := fmt.Sprintf("(echo x > /dev/tcp/127.0.0.1/%d) 2>/dev/null && echo REACHED || echo ISOLATED", ln.Addr().(*net.TCPAddr).Port)
	tests := []struct {
		name   string
		ns     sandbox.Namespaces
		argv   []string
		stdout string
	}{
		{"pid", sandbox.Namespaces{PID: true}, []string{"/bin/sh", "-c", "echo $$"}, "1\n"},
		{"net", sandbox.Namespaces{Net: true}, []string{"/bin/bash", "-c", probe}, "ISOLATED\n"},
		{"no net", sandbox.Namespaces{}, []string{"/bin/bash", "-c", probe}, "REACHED\n"},
		{"uts", sandbox.Namespaces{UTS: true, User: true}, []string{"/bin/sh", "-c", "hostname"}, mustHostname(t) + "\n"},
		{"user", sandbox.Namespaces{User: true}, []string{"/bin/sh", "-c", "id -u; id -g"}, "0\n0\n"},
		{"all", sandbox.Namespaces{User: true, PID: true, Net: true, IPC: true, UTS: true, Mount: true},
			[]string{"/bin/bash", "-c", "echo $$; " + probe}, "1\nISOLATED\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := policy(t)
			p.Namespaces = tt.ns
			res, err := sandbox.Run(context.Background(), p, tt.argv, nil)
			if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EINVAL) {
				t.Skipf("creating namespaces is not permitted here: %v", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			checkExit(t, res, 0, tt.stdout, "")
		})
	}
}

func TestPIDNamespaceKillsEscapedProcesses(t *testing.T) {
	requireLandlock(t)
	p := policy(t)
	p.Namespaces = sandbox.Namespaces{PID: true}
	p.Timeout = 500 * time.Millisecond
	// setsid leaves the process group, so only the pid namespace ends it.
	// (Without Namespaces.PID this "sleep 101" survives Run.)
	res, err := sandbox.Run(context.Background(), p, []string{"/bin/sh", "-c", "setsid sleep 101 & sleep 100"}, nil)
	if errors.Is(err, syscall.EPERM) {
		t.Skipf("creating a pid namespace is not permitted here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if !res.TimedOut {
		t.Fatalf("result %+v, want timed out", res)
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !alive(pid) {
			continue
		}
		if cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); string(cmdline) == "sleep\x00101\x00" {
			t.Errorf("escaped process %d survived", pid)
		}
	}
}

func mustHostname(t *testing.T) string {
	h, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestInvalidPolicy(t *testing.T) {
	ws := t.TempDir()
	file := filepath.Join(ws, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		p    sandbox.Policy
		argv []string
		want string
	}{
		{"no argv", sandbox.Policy{Workspace: ws}, nil, "sandbox: empty argv"},
		{"relative workspace", sandbox.Policy{Workspace: "ws"}, []string{"true"}, `sandbox: workspace "ws" must be an absolute path`},
		{"root workspace", sandbox.Policy{Workspace: "/"}, []string{"true"}, `sandbox: workspace must not be "/"`},
		{"relative read-only path", sandbox.Policy{Workspace: ws, ReadOnly: []string{"etc"}}, []string{"true"}, `sandbox: path "etc" must be absolute`},
		{"bad env", sandbox.Policy{Workspace: ws, Env: []string{"NOEQUALS"}}, []string{"true"}, `sandbox: environment entry "NOEQUALS" is not KEY=VALUE`},
		{"marker in env", sandbox.Policy{Workspace: ws, Env: []string{"NEURON_SANDBOX_TRAMPOLINE=1"}}, []string{"true"}, "sandbox: environment must not contain NEURON_SANDBOX_TRAMPOLINE"},
		{"workspace is a file", sandbox.Policy{Workspace: file}, []string{"true"}, fmt.Sprintf("sandbox: workspace %q is not a directory", file)},
		{"missing read-write path", sandbox.Policy{Workspace: ws, ReadWrite: []string{"/nonexistent"}}, []string{"true"}, "sandbox: stat /nonexistent: no such file or directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := tt.p
			p.AllowUnconfined = true // reach validation on any kernel
			res, err := sandbox.Run(context.Background(), p, tt.argv, nil)
			if err == nil || err.Error() != tt.want || res != nil {
				t.Errorf("Run = %v, %v; want error %q", res, err, tt.want)
			}
		})
	}
}

func TestConcurrentRuns(t *testing.T) {
	requireLandlock(t)
	const n = 8
	errc := make(chan error, n)
	for i := range n {
		go func() {
			p := policy(t)
			res, err := sandbox.Run(context.Background(), p, []string{"/bin/sh", "-c", fmt.Sprintf("echo %d; echo %d >&2", i, -i)}, nil)
			switch {
			case err != nil:
				errc <- err
			case string(res.Stdout) != fmt.Sprintf("%d\n", i) || string(res.Stderr) != fmt.Sprintf("%d\n", -i):
				errc <- fmt.Errorf("run %d: stdout %q stderr %q", i, res.Stdout, res.Stderr)
			default:
				errc <- nil
			}
		}()
	}
	for range n {
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}
}

// TestNestedSandbox runs this test binary inside a sandbox, where it runs
// a second, narrower sandbox: what the environment service's process
// backend does with an operator whose bash tool uses the sandbox.
func TestNestedSandbox(t *testing.T) {
	requireLandlock(t)
	if os.Getenv("SANDBOX_NESTED") == "1" {
		return // the inner side runs TestNestedInner only
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := policy(t)
	p.ReadOnly = []string{exe}
	p.Env = append(sandbox.DefaultEnv(p.Workspace), "SANDBOX_NESTED=1")
	p.Namespaces = sandbox.Namespaces{PID: true}
	res := run(t, p, exe, "-test.run=^TestNestedInner$", "-test.count=1")
	if res.ExitCode != 0 {
		t.Fatalf("inner test binary: exit %d signal %q\n%s%s", res.ExitCode, res.Signal, res.Stdout, res.Stderr)
	}
	if b, err := os.ReadFile(filepath.Join(p.Workspace, "inner", "ok")); err != nil || string(b) != "inner\n" {
		t.Errorf("inner sandbox output: %q %v", b, err)
	}
}

// TestNestedInner is the inside of TestNestedSandbox.
func TestNestedInner(t *testing.T) {
	if os.Getenv("SANDBOX_NESTED") != "1" {
		t.Skip("run by TestNestedSandbox")
	}
	ws, _ := os.Getwd()
	inner := filepath.Join(ws, "inner")
	if err := os.Mkdir(inner, 0o755); err != nil {
		t.Fatal(err)
	}
	p := sandbox.Policy{Workspace: inner, Timeout: 30 * time.Second}
	res := run(t, p, "/bin/sh", "-c", "echo inner > ok")
	checkExit(t, res, 0, "", "")
	if err := os.WriteFile(filepath.Join(ws, "outer-secret"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	res = run(t, p, "cat", "../outer-secret")
	checkExit(t, res, 1, "", "cat: ../outer-secret: Permission denied\n")
}
