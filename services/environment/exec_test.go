package environment_test

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	"github.com/secbear/neuron/pkg/errs"
)

// execStream is one Exec call a test drives message by message.
type execStream struct {
	t              *testing.T
	st             environmentv1.EnvironmentService_ExecClient
	stdout, stderr strings.Builder
	exit           *environmentv1.ExecExit
	err            error
	done           bool
}

// startExec starts an Exec of start in a call bounded by ctx.
func (e *env) startExec(ctx context.Context, t *testing.T, start *environmentv1.ExecStart) *execStream {
	t.Helper()
	st, err := e.client.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	x := &execStream{t: t, st: st}
	x.send(&environmentv1.ExecRequest{Kind: &environmentv1.ExecRequest_Start{Start: start}})
	return x
}

func (x *execStream) send(m *environmentv1.ExecRequest) {
	x.t.Helper()
	if err := x.st.Send(m); err != nil && !errors.Is(err, io.EOF) {
		x.t.Fatalf("send %v: %v", m, err)
	}
}

func (x *execStream) stdin(s string) {
	x.send(&environmentv1.ExecRequest{Kind: &environmentv1.ExecRequest_Stdin{Stdin: []byte(s)}})
}

func (x *execStream) signal(s string) {
	x.send(&environmentv1.ExecRequest{Kind: &environmentv1.ExecRequest_Signal{Signal: s}})
}

// recv takes one message; it reports false at the end of the call.
func (x *execStream) recv() bool {
	if x.done {
		return false
	}
	m, err := x.st.Recv()
	if err != nil {
		x.done = true
		if !errors.Is(err, io.EOF) {
			x.err = err
		}
		return false
	}
	x.stdout.WriteString(string(m.GetStdout()))
	x.stderr.WriteString(string(m.GetStderr()))
	if m.GetExit() != nil {
		x.exit = m.GetExit()
	}
	return true
}

// until receives until stdout holds want. The call's context bounds it:
// output that is not streamed makes it fail at that deadline.
func (x *execStream) until(want string) {
	x.t.Helper()
	for !strings.Contains(x.stdout.String(), want) {
		if !x.recv() {
			x.t.Fatalf("the call ended (%v) before stdout held %q; stdout:\n%s\nstderr:\n%s", x.err, want, x.stdout.String(), x.stderr.String())
		}
	}
}

// finish closes the client's side and receives the rest.
func (x *execStream) finish() {
	_ = x.st.CloseSend()
	for x.recv() {
	}
}

// newSandbox creates a process-backend sandbox.
func (e *env) newSandbox(t *testing.T) string {
	t.Helper()
	sb, err := e.client.CreateSandbox(context.Background(), &environmentv1.CreateSandboxRequest{Spec: &environmentv1.EnvironmentSpec{
		Isolation: []*environmentv1.IsolationBoundary{{Kind: &environmentv1.IsolationBoundary_Process{Process: &environmentv1.ProcessIsolation{}}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = e.client.CloseSandbox(context.Background(), &environmentv1.CloseSandboxRequest{SandboxId: sb.GetSandboxId()})
	})
	return sb.GetSandboxId()
}

// TestExecStreams: Exec is a conversation with the running command. The
// client sees the command's first output before it sends any input (it
// only sends stdin once that output arrived, so a service that sent
// output only at the end would leave this test waiting until its
// deadline); a prompt without a newline arrives too; a signal reaches
// the command's process group (a trap runs; a command without a handler
// ends by the signal); megabytes of output arrive whole and in order.
func TestExecStreams(t *testing.T) {
	requireSandbox(t)
	e := startEnv(t, envOptions{})
	id := e.newSandbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := func(argv ...string) *environmentv1.ExecStart {
		return &environmentv1.ExecStart{SandboxId: id, Argv: argv}
	}

	x := e.startExec(ctx, t, start("sh", "-c", `echo first; read line; echo "second $line"; echo to-stderr >&2; exit 4`))
	x.until("first\n")
	if strings.Contains(x.stdout.String(), "second") {
		t.Fatalf("output before any input: %q", x.stdout.String())
	}
	x.stdin("hello\n")
	x.finish()
	if x.err != nil || x.stdout.String() != "first\nsecond hello\n" || x.stderr.String() != "to-stderr\n" || x.exit.GetCode() != 4 {
		t.Errorf("interactive command: stdout %q stderr %q exit %v err %v", x.stdout.String(), x.stderr.String(), x.exit, x.err)
	}

	x = e.startExec(ctx, t, start("sh", "-c", `printf 'name? '; read n; echo "hi $n"`))
	x.until("name? ")
	x.stdin("bob\n")
	x.finish()
	if x.stdout.String() != "name? hi bob\n" || x.exit.GetCode() != 0 {
		t.Errorf("prompt: stdout %q exit %v err %v", x.stdout.String(), x.exit, x.err)
	}

	// A signal the command handles: its trap runs.
	x = e.startExec(ctx, t, start("sh", "-c", `trap 'echo trapped; exit 7' TERM; echo ready; while :; do sleep 1; done`))
	x.until("ready\n")
	x.signal("SIGTERM")
	x.finish()
	if !strings.Contains(x.stdout.String(), "trapped") || x.exit.GetCode() != 7 {
		t.Errorf("trapped SIGTERM: stdout %q exit %v err %v", x.stdout.String(), x.exit, x.err)
	}
	// One it does not: it ends by it.
	x = e.startExec(ctx, t, start("perl", "-e", `$| = 1; print "ready\n"; sleep 1000`))
	x.until("ready\n")
	x.signal("sigint")
	x.finish()
	if x.err != nil || x.exit.GetSignal() != "SIGINT" || x.exit.GetCode() != -1 {
		t.Errorf("SIGINT: exit %v err %v", x.exit, x.err)
	}

	// Output far past one chunk, and past a pipe's buffer, whole.
	x = e.startExec(ctx, t, start("seq", "1", "400000"))
	x.finish()
	var want strings.Builder
	for i := 1; i <= 400000; i++ {
		want.WriteString(strconv.Itoa(i) + "\n")
	}
	if x.err != nil || x.stdout.String() != want.String() {
		t.Errorf("seq: %d bytes (want %d), err %v", x.stdout.Len(), want.Len(), x.err)
	}
	if n := len(sandboxProcesses(t, "sleep 1000")); n > 0 {
		t.Errorf("%d processes left", n)
	}
}

// TestExecTerminal: with tty the command runs on a pseudo-terminal of
// the size asked for (stdin and stdout are terminals; stty reports the
// size), and a resize is seen by the command.
func TestExecTerminal(t *testing.T) {
	requireSandbox(t)
	e := startEnv(t, envOptions{})
	id := e.newSandbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	x := e.startExec(ctx, t, &environmentv1.ExecStart{SandboxId: id, Tty: true, Size: &environmentv1.TerminalSize{Rows: 30, Cols: 100},
		Argv: []string{"sh", "-c", `if test -t 0 && test -t 1 && test -t 2; then echo TERMINAL; fi; stty size; read x; stty size`}})
	x.until("30 100")
	if !strings.Contains(x.stdout.String(), "TERMINAL") {
		t.Errorf("no terminal: %q", x.stdout.String())
	}
	x.send(&environmentv1.ExecRequest{Kind: &environmentv1.ExecRequest_Resize{Resize: &environmentv1.TerminalSize{Rows: 40, Cols: 120}}})
	x.stdin("go\n")
	x.until("40 120")
	x.finish()
	if x.err != nil || x.exit.GetCode() != 0 {
		t.Errorf("terminal command: stdout %q exit %v err %v", x.stdout.String(), x.exit, x.err)
	}
}

// tiocsti tries to type into every terminal the command can reach: its
// standard streams (TIOCSTI) and the terminal devices by path.
const tiocsti = `for my $fd (0, 1, 2) { open(my $fh, "+<&=", $fd) or next; my $c = "Q"; ` +
	`print ioctl($fh, 0x5412, $c) ? "INJECTED fd$fd\n" : "refused fd$fd: $!\n" } ` +
	`for my $p ("/dev/tty", "/dev/ptmx", "/dev/console", "/dev/pts/0", "/dev/tty0", "/dev/tty1") { ` +
	`if (open(my $fh, "+<", $p)) { my $c = "Q"; print ioctl($fh, 0x5412, $c) ? "INJECTED $p\n" : "OPENED $p\n" } ` +
	`else { print "no $p: $!\n" } }`

// TestExecTerminalAttack: the pseudo-terminal opens no way out of the
// sandbox. TIOCSTI, which pushes characters into a terminal's input as
// if typed (into the shell that reads next: the classic escape from a
// program given a terminal), is refused on the command's own terminal,
// and no other terminal (the service's, the console, another session's)
// exists in its view of /dev; without a terminal the same holds.
func TestExecTerminalAttack(t *testing.T) {
	requireSandbox(t)
	e := startEnv(t, envOptions{})
	id := e.newSandbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, tty := range []bool{true, false} {
		x := e.startExec(ctx, t, &environmentv1.ExecStart{SandboxId: id, Tty: tty, Argv: []string{"perl", "-e", tiocsti}})
		x.finish()
		out := x.stdout.String()
		if x.err != nil || x.exit.GetCode() != 0 || !strings.Contains(out, "/dev/tty1") {
			t.Fatalf("tty %v: the probe did not run: %q %q %v %v", tty, out, x.stderr.String(), x.exit, x.err)
		}
		if strings.Contains(out, "INJECTED") || strings.Contains(out, "OPENED") || strings.Contains(out, "Q") {
			t.Errorf("tty %v: the command reached a terminal:\n%s", tty, out)
		}
		if tty && !strings.Contains(out, "refused fd0: Operation not permitted") {
			t.Errorf("TIOCSTI on its own terminal was not refused by the seccomp filter:\n%s", out)
		}
	}
}

// TestExecBackpressure: a client that starts a command writing as fast
// as it can and never reads holds it to the bound, not memory: the
// command's writes wait on the full pipe once the one chunk in flight,
// the scrubber's partial line and gRPC's flow-control windows are full.
// The command counts the 64 KiB blocks it got written into a file of
// the workspace until spec.timeout (3 s) kills it; the count, read
// back, stays under 48 MiB worth (16 MiB is gRPC's largest window),
// where a service reading ahead of its client lets the same loop write
// gigabytes. The sandbox runs commands after it.
func TestExecBackpressure(t *testing.T) {
	requireSandbox(t)
	e := startEnv(t, envOptions{})
	sb, err := e.client.CreateSandbox(context.Background(), &environmentv1.CreateSandboxRequest{Spec: &environmentv1.EnvironmentSpec{
		Isolation: []*environmentv1.IsolationBoundary{{Kind: &environmentv1.IsolationBoundary_Process{Process: &environmentv1.ProcessIsolation{}}}},
		Timeout:   durationpb.New(3 * time.Second),
	}})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.GetSandboxId()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Never Recv'd.
	x := e.startExec(ctx, t, &environmentv1.ExecStart{SandboxId: id, Argv: []string{"bash", "-c",
		`s=$(head -c 65536 /dev/zero | tr '\0' x); i=0; while :; do printf %s "$s"; i=$((i+1)); echo $i > count; done`}})
	x.send(&environmentv1.ExecRequest{Kind: &environmentv1.ExecRequest_CloseStdin{CloseStdin: true}})
	ref := &environmentv1.WorkspaceRef{Kind: &environmentv1.WorkspaceRef_SandboxId{SandboxId: id}}
	// The workspace is stored once the timeout ended the command.
	var count string
	for {
		got, err := e.readFile(t, ref, "count")
		if err == nil {
			count = strings.TrimSpace(got)
			break
		}
		if errs.Code(err) != codes.NotFound {
			t.Fatal(err)
		}
		select {
		case <-ctx.Done():
			t.Fatal("the command's workspace never showed its count")
		case <-time.After(100 * time.Millisecond):
		}
	}
	n, err := strconv.Atoi(count)
	if err != nil {
		t.Fatalf("count %q", count)
	}
	t.Logf("the command wrote %d blocks of 64 KiB (%d MiB) to a client that read none", n, n/16)
	if n == 0 || n > 48*16 {
		t.Errorf("the command wrote %d blocks of 64 KiB to a client that read none: want some, and at most 48 MiB worth", n)
	}
	cancel()
	r := e.exec(t, id, "", "", "echo", "after")
	if r.err != nil || r.stdout != "after\n" {
		t.Errorf("the next command: %+v", r)
	}
}
