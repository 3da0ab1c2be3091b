package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/secbear/neuron/internal/testenv"
)

// binaries returns the directory holding neuron and the four service
// binaries side by side (neuron up finds its services there): built
// before the tests by make test, else on first use, before any clock
// starts. It skips in -short mode.
func binaries(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the five binaries; skipped with -short")
	}
	return testenv.BuildStaticDir(t,
		"github.com/secbear/neuron/cmd/neuron",
		"github.com/secbear/neuron/services/state/cmd/state",
		"github.com/secbear/neuron/services/operator/cmd/operator",
		"github.com/secbear/neuron/services/environment/cmd/environment",
		"github.com/secbear/neuron/services/orchestrator/cmd/orchestrator")
}

// cleanEnv is the test's environment without model credentials and
// neuron's own variables, so every child runs the scripted model and the
// addresses come from flags only.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		drop := strings.HasPrefix(name, "NEURON_")
		for _, m := range modelEnv {
			drop = drop || name == m
		}
		if !drop {
			env = append(env, kv)
		}
	}
	return env
}

// freeAddrs returns n loopback addresses that were free a moment ago.
func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	var (
		addrs []string
		lns   []net.Listener
	)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		addrs = append(addrs, ln.Addr().String())
	}
	for _, ln := range lns {
		ln.Close()
	}
	return addrs
}

// refusingAddr is a loopback address that refuses connections for the whole
// test: a socket bound to it without listening (and without SO_REUSEADDR)
// keeps the port, so a server started by a parallel test cannot take it, and
// a connect gets a reset. A port that is merely closed again can be picked up
// by the next server to ask for a free one.
func refusingAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}

// result is a finished neuron command.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout ---\n%s--- stderr ---\n%s", r.code, r.stdout, r.stderr)
}

// neuron runs the neuron binary with args to its end (bounded by ctx).
func neuron(ctx context.Context, t *testing.T, args ...string) result {
	t.Helper()
	cmd := exec.CommandContext(ctx, filepath.Join(binaries(t), "neuron"), args...)
	cmd.Env = cleanEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("neuron %v: %v", args, err)
	}
	return r
}

// upArgs are the flags of a `neuron up` on fresh ports and a temp data dir.
type upSetup struct {
	dataDir                                string
	orchestrator, operator, state, environ string
}

func newUpSetup(t *testing.T) upSetup {
	a := freeAddrs(t, 4)
	return upSetup{dataDir: t.TempDir(), orchestrator: a[0], operator: a[1], state: a[2], environ: a[3]}
}

func (s upSetup) args(extra ...string) []string {
	return append([]string{"up", "--data-dir", s.dataDir,
		"--orchestrator-addr", s.orchestrator, "--operator-addr", s.operator,
		"--state-addr", s.state, "--environment-addr", s.environ}, extra...)
}

// upProc is a `neuron up` running in the background.
type upProc struct {
	upSetup
	cmd    *exec.Cmd
	mu     sync.Mutex
	out    bytes.Buffer // stdout and stderr
	exited chan struct{}
	// read is closed when all of the output has been read.
	read chan struct{}
	err  error
	// crashed: the test killed services under it, so it does not exit 0.
	crashed bool
}

func (p *upProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// startUp starts `neuron up` and waits until it says every service is
// SERVING (its "try" line). The cleanup sends SIGTERM and checks that it
// stops everything and exits 0.
func startUp(t *testing.T, extra ...string) *upProc {
	t.Helper()
	return startUpIn(t, newUpSetup(t), nil, extra...)
}

// startUpIn is startUp on the given addresses and data directory (a
// restart), with env added to the clean environment.
func startUpIn(t *testing.T, s upSetup, env []string, extra ...string) *upProc {
	t.Helper()
	p := &upProc{upSetup: s, exited: make(chan struct{}), read: make(chan struct{})}
	p.cmd = exec.Command(filepath.Join(binaries(t), "neuron"), p.args(extra...)...)
	p.cmd.Env = append(cleanEnv(), env...)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout, p.cmd.Stderr = pw, pw
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	ready := make(chan struct{})
	go func() {
		defer close(p.read)
		sc := bufio.NewScanner(pr)
		signalled := false
		for sc.Scan() {
			p.mu.Lock()
			p.out.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			if !signalled && strings.HasPrefix(sc.Text(), "try ") {
				signalled = true
				close(ready)
			}
		}
	}()
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
		select {
		case <-p.exited:
		case <-time.After(60 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
			t.Errorf("neuron up did not stop within 60s of SIGTERM:\n%s", p.output())
			return
		}
		select { // the last lines may still be in the pipe
		case <-p.read:
		case <-time.After(10 * time.Second):
		}
		if p.crashed {
			return
		}
		if p.err != nil {
			t.Errorf("neuron up after SIGTERM: %v, want exit 0:\n%s", p.err, p.output())
		}
		if out := p.output(); !strings.Contains(out, "all services stopped") {
			t.Errorf("neuron up after SIGTERM did not say it stopped everything:\n%s", out)
		}
	})
	select {
	case <-ready:
	case <-p.exited:
		t.Fatalf("neuron up exited before serving (%v):\n%s", p.err, p.output())
	case <-time.After(120 * time.Second):
		t.Fatalf("neuron up not serving within 120s:\n%s", p.output())
	}
	return p
}

// stop sends SIGTERM and waits for neuron up to exit (the cleanup still
// checks that it exited 0 and stopped everything).
func (p *upProc) stop(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("neuron up did not stop within 60s of SIGTERM:\n%s", p.output())
	}
	<-p.read
}

// ctxFor is a context bounding one neuron command in a test. The
// binaries are built first: the clock never includes a build.
func ctxFor(t *testing.T) context.Context {
	binaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}
