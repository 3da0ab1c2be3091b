// Package proc runs a service binary for a crash test: start it with
// exactly the flags given (nothing from the test's environment under the
// service's variable prefix), wait until it is SERVING, SIGKILL it or
// stop it with SIGTERM, and show the tail of its log when the test
// fails. Build the binary first (internal/testenv.BuildStatic): no clock
// here covers a build.
package proc

import (
	"bufio"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Timeouts of the waits, long enough for a loaded 2-core machine.
const (
	ServingTimeout = 30 * time.Second
	KillTimeout    = 10 * time.Second
	StopTimeout    = 20 * time.Second
)

// Options configure Start.
type Options struct {
	// Name is how messages call the process, e.g. "orchestrator".
	Name string
	// LogPath receives the process's stdout and stderr.
	LogPath string
	// EnvPrefix: the test's environment variables with this prefix and an
	// underscore are not passed on (flags are the whole config).
	EnvPrefix string
	// Context, when set, kills the process when it ends. Crash tests
	// usually leave it nil, so that a test that ran out of time can still
	// ask the process what is stuck.
	Context context.Context
	// TailLines of the log are shown on failures; 0 means 40.
	TailLines int
}

// Proc is one run of a binary.
type Proc struct {
	opts    Options
	cmd     *exec.Cmd
	exited  chan struct{} // closed once the process has been waited for
	waitErr error
}

// Start runs bin with args. The process is killed, if still running, when
// the test ends, and its log's tail is shown if the test failed.
func Start(t testing.TB, bin string, opts Options, args ...string) *Proc {
	t.Helper()
	if opts.TailLines <= 0 {
		opts.TailLines = 40
	}
	if opts.Name == "" {
		opts.Name = filepath.Base(bin)
	}
	logFile, err := os.Create(opts.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close() // the child has its own descriptor
	var cmd *exec.Cmd
	if opts.Context != nil {
		cmd = exec.CommandContext(opts.Context, bin, args...)
	} else {
		cmd = exec.Command(bin, args...)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if opts.EnvPrefix != "" {
		cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, opts.EnvPrefix+"_") })
	}
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &Proc{opts: opts, cmd: cmd, exited: make(chan struct{})}
	go func() { p.waitErr = cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("log of %s:\n%s", filepath.Base(opts.LogPath), p.Tail())
		}
	})
	return p
}

// Pid is the process's id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited is closed once the process is gone.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Log is the process's whole log so far.
func (p *Proc) Log() string {
	b, _ := os.ReadFile(p.opts.LogPath)
	return string(b)
}

// Tail is the end of the process's log.
func (p *Proc) Tail() string { return Tail(p.opts.LogPath, p.opts.TailLines) }

// WaitServing polls health until service (a gRPC service name; "" for the
// server as a whole) is SERVING. It fails the test when the process
// exits first or ServingTimeout passes.
func (p *Proc) WaitServing(ctx context.Context, t testing.TB, health healthpb.HealthClient, service string, poll time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, ServingTimeout)
	defer cancel()
	for {
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		resp, err := health.Check(cctx, &healthpb.HealthCheckRequest{Service: service})
		ccancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		select {
		case <-p.exited:
			t.Fatalf("%s exited while starting: %v; log:\n%s", p.opts.Name, p.waitErr, p.Tail())
		case <-ctx.Done():
			t.Fatalf("%s not SERVING in time (last: %v, %v); log:\n%s", p.opts.Name, resp.GetStatus(), err, p.Tail())
		case <-time.After(poll):
		}
	}
}

// Kill sends SIGKILL and waits until the process is gone. A process that
// had already exited on its own fails the test: a crash test must kill a
// live one.
func (p *Proc) Kill(t testing.TB) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL %s: %v", p.opts.Name, err)
	}
	select {
	case <-p.exited:
	case <-time.After(KillTimeout):
		t.Fatalf("%s did not die within %v of SIGKILL", p.opts.Name, KillTimeout)
	}
	if p.cmd.ProcessState.Exited() {
		t.Fatalf("%s exited on its own (%v) before the SIGKILL; log:\n%s", p.opts.Name, p.waitErr, p.Tail())
	}
}

// Terminate asks for a graceful stop (SIGTERM) and expects a clean exit
// within StopTimeout.
func (p *Proc) Terminate(t testing.TB) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM %s: %v", p.opts.Name, err)
	}
	select {
	case <-p.exited:
	case <-time.After(StopTimeout):
		t.Fatalf("%s did not stop within %v of SIGTERM", p.opts.Name, StopTimeout)
	}
	if p.waitErr != nil {
		t.Errorf("graceful stop of %s: %v; log:\n%s", p.opts.Name, p.waitErr, p.Tail())
	}
}

// FreeAddr is a loopback address free a moment ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	if err := lis.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// Tail is the last n lines of the file at path.
func Tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
