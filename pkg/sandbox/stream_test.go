package sandbox_test

import (
	"bufio"
	"context"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/secbear/neuron/pkg/sandbox"
)

// pidNamespace is a pid namespace (with a user namespace when not root).
func pidNamespace() sandbox.Namespaces {
	return sandbox.Namespaces{PID: true, User: os.Geteuid() != 0}
}

// TestStreamedOutputAndSignals: with Stdout a pipe, the caller reads
// what the command writes while it runs; a signal sent on Signals
// reaches it, and a SIGTERM that the init of its pid namespace has no
// handler for still ends it (reported as SIGTERM), where the kernel
// alone would drop it and the run would last until its timeout.
func TestStreamedOutputAndSignals(t *testing.T) {
	requireLandlock(t)
	p := policy(t)
	p.Namespaces = pidNamespace()
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer outR.Close()
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer inW.Close() // never written: the command waits on it
	signals := make(chan syscall.Signal, 1)
	p.Stdout, p.Signals = outW, signals
	done := make(chan *sandbox.Result, 1)
	go func() {
		res, err := sandbox.Run(context.Background(), p, []string{"/bin/sh", "-c", "echo ready; read x; echo never"}, inR)
		if err != nil {
			t.Error(err)
		}
		outW.Close()
		inR.Close()
		done <- res
	}()
	line, err := bufio.NewReader(outR).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	signals <- syscall.SIGTERM
	res := <-done
	if res == nil {
		t.FailNow()
	}
	if res.TimedOut || res.Signal != "SIGTERM" || len(res.Stdout) != 0 {
		t.Errorf("result %+v; want ended by SIGTERM, output streamed rather than captured", res)
	}
}

// TestTerminal: with Terminal the command's stdin, stdout and stderr are
// the pseudo-terminal, of the size the caller set, and it is the
// command's controlling terminal.
func TestTerminal(t *testing.T) {
	requireLandlock(t)
	ctl, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pseudo-terminal here: %v", err)
	}
	defer ctl.Close()
	if err := pty.Setsize(tty, &pty.Winsize{Rows: 7, Cols: 33}); err != nil {
		t.Fatal(err)
	}
	p := policy(t)
	p.Namespaces = pidNamespace()
	p.Stdout, p.Stderr, p.Terminal = tty, tty, true
	out := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(ctl) // ends with EIO once the follower is closed
		out <- string(b)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := sandbox.Run(ctx, p, []string{"/bin/sh", "-c", `test -t 0 && test -t 1 && test -t 2 && echo TERMINAL; stty size; ` +
		`perl -MPOSIX -e 'print POSIX::tcgetpgrp(0) == getpgrp() ? "CTTY\n" : "NOT CTTY: $!\n"'`}, tty)
	tty.Close()
	if err != nil {
		t.Fatal(err)
	}
	got := <-out
	if res.ExitCode != 0 || !strings.Contains(got, "TERMINAL") || !strings.Contains(got, "7 33") || !strings.Contains(got, "CTTY\r\n") {
		t.Errorf("output %q, result %+v; want a terminal of 7x33 that is its controlling terminal", got, res)
	}
	// A terminal needs the follower as the command's output.
	p.Stdout = nil
	if _, err := sandbox.Run(ctx, p, []string{"/bin/true"}, tty); err == nil || !strings.Contains(err.Error(), "Terminal") {
		t.Errorf("Terminal without its follower as Stdout: %v", err)
	}
}
