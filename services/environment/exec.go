package environment

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/structpb"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment/scrub"
	"github.com/secbear/neuron/services/environment/workspace"
)

// Exec streaming bounds.
const (
	// execQuiet is how long output that does not end a line yet is held
	// (so that the scrubber sees a credential whole however the command
	// splits its writes) before it is scrubbed and sent anyway: a prompt
	// without a newline still reaches the client.
	execQuiet = 20 * time.Millisecond
	// execDrain is how long, once a command has ended, Exec waits for a
	// client that reads none of the output still to send before it gives
	// up on it (DEADLINE_EXCEEDED).
	execDrain = 30 * time.Second
	// ExecTrigger is the OperatorInput.custom_trigger of the input the
	// exec-boundary middleware is shown for an Exec.
	ExecTrigger = "sandbox_exec"
)

// execSignals are the signals Exec delivers, by name.
var execSignals = map[string]syscall.Signal{
	"SIGHUP": syscall.SIGHUP, "SIGINT": syscall.SIGINT, "SIGQUIT": syscall.SIGQUIT,
	"SIGTERM": syscall.SIGTERM, "SIGKILL": syscall.SIGKILL, "SIGUSR1": syscall.SIGUSR1,
	"SIGUSR2": syscall.SIGUSR2, "SIGCONT": syscall.SIGCONT, "SIGSTOP": syscall.SIGSTOP,
	"SIGWINCH": syscall.SIGWINCH,
}

// Exec implements EnvironmentService.Exec: the command runs while its
// output is sent, its input received and its signals delivered. Before
// it runs, the exec-boundary middleware (ServerConfig.Exec) sees it as an
// input (execInput) and may refuse it (PERMISSION_DENIED) or rewrite it;
// after, it sees the exit status as an output (execOutput), and a HALT
// then ends the call PERMISSION_DENIED in place of the exit message.
func (s *Server) Exec(stream environmentv1.EnvironmentService_ExecServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	start := first.GetStart()
	if start == nil {
		return fmt.Errorf("the first message of Exec must be start: %w", errs.InvalidArgument)
	}
	if len(start.GetArgv()) == 0 || start.GetArgv()[0] == "" {
		return fmt.Errorf("start.argv must name a command: %w", errs.InvalidArgument)
	}
	if start.GetSize() != nil && !start.GetTty() {
		return fmt.Errorf("start.size is the size of a pseudo-terminal: set tty too, or leave size unset: %w", errs.InvalidArgument)
	}
	if err := checkSize(start.GetSize()); err != nil {
		return err
	}
	sb, err := s.lookup(start.GetSandboxId())
	if err != nil {
		return err
	}
	defer s.touch(sb)
	x := &execCall{s: s, sb: sb, stream: stream, tty: start.GetTty(), size: start.GetSize()}
	in := execInput(sb.id, start.GetArgv(), start.GetTty())
	var res *ExecResult
	resp, err := s.intercept(stream.Context(), &environmentv1.RunRequest{Input: in, Spec: sb.spec}, func(ctx context.Context, rr *environmentv1.RunRequest) (*environmentv1.RunResponse, error) {
		argv := execArgv(start.GetArgv(), in, rr.GetInput())
		r, err := x.run(ctx, argv)
		if err != nil {
			return nil, err
		}
		res = r
		return &environmentv1.RunResponse{Output: execOutput(r), Backend: sb.backend}, nil
	})
	if err != nil {
		return err
	}
	if out := resp.GetOutput(); out.GetExitReason().GetKind() == operatorv1.ExitKind_EXIT_KIND_MIDDLEWARE_HALT {
		if res == nil {
			return fmt.Errorf("the command was not run: %s: %w", out.GetExitReason().GetMessage(), errs.PermissionDenied)
		}
		return fmt.Errorf("the command ran (%s), then %s: %w", content.TextOf(execOutput(res).GetMessage()), out.GetExitReason().GetMessage(), errs.PermissionDenied)
	}
	if res == nil {
		return fmt.Errorf("the exec middleware answered without running the command: %w", errs.Internal)
	}
	return x.send(&environmentv1.ExecResponse{Kind: &environmentv1.ExecResponse_Exit{Exit: &environmentv1.ExecExit{
		Code: int32(res.Code), Signal: res.Signal, TimedOut: res.TimedOut, LimitsHit: res.LimitsHit,
	}}})
}

// checkSize refuses a terminal size outside 1..10000.
func checkSize(sz *environmentv1.TerminalSize) error {
	if sz == nil {
		return nil
	}
	if sz.GetRows() < 1 || sz.GetRows() > 10000 || sz.GetCols() < 1 || sz.GetCols() > 10000 {
		return fmt.Errorf("terminal size %dx%d: rows and cols must be 1 to 10000: %w", sz.GetRows(), sz.GetCols(), errs.InvalidArgument)
	}
	return nil
}

// execCall is one Exec.
type execCall struct {
	s      *Server
	sb     *sandboxSession
	stream environmentv1.EnvironmentService_ExecServer
	tty    bool
	size   *environmentv1.TerminalSize

	// sendMu serialises Send: stdout and stderr are sent from two
	// goroutines.
	sendMu  sync.Mutex
	sendErr error
	// recvErr is a bad message from the client, which stopped the
	// command.
	recvMu  sync.Mutex
	recvErr error
}

// send sends m unless an earlier send failed.
func (x *execCall) send(m *environmentv1.ExecResponse) error {
	x.sendMu.Lock()
	defer x.sendMu.Unlock()
	if x.sendErr == nil {
		x.sendErr = x.stream.Send(m)
	}
	return x.sendErr
}

// run runs argv in the sandbox, streaming, and returns how it ended.
func (x *execCall) run(ctx context.Context, argv []string) (*ExecResult, error) {
	s, sb := x.s, x.sb
	select {
	case s.running <- struct{}{}:
		defer func() { <-s.running }()
	default:
		return nil, fmt.Errorf("this environment service is already running its limit of %d concurrent invocations (max-concurrent); retry later: %w", s.cfg.MaxConcurrent, errs.ResourceExhausted)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	inv, backend, err := s.prepare(ctx, &environmentv1.RunRequest{Input: &operatorv1.OperatorInput{}, Spec: sb.spec})
	if err != nil {
		return nil, err
	}
	exe, ok := backend.(StreamExecutor)
	if !ok {
		return nil, fmt.Errorf("the %s backend runs no sandbox sessions: %w", backend.Name(), errs.FailedPrecondition)
	}
	inv.Workspace = &Workspace{Name: workspace.SandboxName(sb.id), store: s.cfg.Workspaces}
	unlock, err := s.cfg.Workspaces.Lock(ctx, inv.Workspace.Name)
	if err != nil {
		return nil, s.scrubError(inv.scrubber, err)
	}
	defer unlock()

	var p *execPipes
	if x.tty {
		// A backend that keeps the sandbox runs the command on a
		// terminal of its own: this one then only carries bytes.
		p, err = openTerminal(x.size, sb.host != nil)
	} else {
		p, err = openPipes()
	}
	if err != nil {
		return nil, fmt.Errorf("creating the command's standard streams: %v: %w", err, errs.Retryable)
	}
	defer p.closeParent()
	signals := make(chan syscall.Signal, 4)
	resizes := make(chan *environmentv1.TerminalSize, 4)
	ended := make(chan struct{})
	go x.receive(cancel, p, signals, resizes, ended)
	var pumps sync.WaitGroup
	for _, o := range p.outputs() {
		pumps.Add(1)
		go func() {
			defer pumps.Done()
			x.pump(inv.scrubber, o.f, o.msg)
		}()
	}
	inv.Log.Info("sandbox exec", "sandbox", sb.id, "backend", backend.Name(), "argv0", argv[0], "tty", x.tty)
	wiring := p.wiring(signals)
	wiring.Resizes = resizes
	res, err := exe.ExecStream(ctx, inv, argv, wiring)
	close(ended)
	// Every process of the command is gone: once what it wrote is read,
	// the readers see the end.
	p.closeChild()
	drained := make(chan struct{})
	go func() {
		pumps.Wait()
		close(drained)
	}()
	select {
	case <-drained:
	case <-time.After(execDrain):
		return nil, fmt.Errorf("the command ended, but its output was not read for %v: %w", execDrain, errs.DeadlineExceeded)
	}
	x.recvMu.Lock()
	recvErr := x.recvErr
	x.recvMu.Unlock()
	switch {
	case recvErr != nil:
		return nil, recvErr
	case err != nil:
		return nil, s.scrubError(inv.scrubber, err)
	}
	x.sendMu.Lock()
	sendErr := x.sendErr
	x.sendMu.Unlock()
	if sendErr != nil {
		return nil, sendErr
	}
	return res, nil
}

// receive handles the client's messages after start until the command
// ends: stdin is written to the command (blocking while it does not
// read), close_stdin (or the client closing its side) ends its input, a
// signal is delivered, a resize resizes the terminal. A bad message, or
// the client going away, stops the command.
func (x *execCall) receive(cancel context.CancelFunc, p *execPipes, signals chan<- syscall.Signal, resizes chan<- *environmentv1.TerminalSize, ended <-chan struct{}) {
	fail := func(err error) {
		x.recvMu.Lock()
		x.recvErr = err
		x.recvMu.Unlock()
		cancel()
	}
	closed := false
	for {
		m, err := x.stream.Recv()
		if errors.Is(err, io.EOF) {
			if !closed {
				p.closeInput()
			}
			return
		}
		if err != nil {
			cancel() // the client is gone
			return
		}
		switch k := m.GetKind().(type) {
		case *environmentv1.ExecRequest_Stdin:
			if closed {
				fail(fmt.Errorf("stdin after close_stdin: %w", errs.InvalidArgument))
				return
			}
			if _, err := p.stdin.Write(k.Stdin); err != nil {
				return // the command ended
			}
		case *environmentv1.ExecRequest_CloseStdin:
			if !closed {
				closed = true
				p.closeInput()
			}
		case *environmentv1.ExecRequest_Signal:
			sig, ok := execSignals[strings.ToUpper(k.Signal)]
			if !ok {
				fail(fmt.Errorf("signal %q: want one of %s: %w", k.Signal, strings.Join(slices.Sorted(mapKeys(execSignals)), ", "), errs.InvalidArgument))
				return
			}
			x.s.cfg.Log.Info("sandbox command signalled", "sandbox", x.sb.id, "signal", unix.SignalName(sig))
			select {
			case signals <- sig:
			case <-ended:
				return
			}
		case *environmentv1.ExecRequest_Resize:
			if !x.tty {
				fail(fmt.Errorf("resize without a pseudo-terminal (start.tty): %w", errs.InvalidArgument))
				return
			}
			if err := checkSize(k.Resize); err != nil {
				fail(err)
				return
			}
			if err := p.resize(k.Resize); err != nil {
				x.s.cfg.Log.Warn("resizing a sandbox terminal", "sandbox", x.sb.id, "error", err.Error())
			}
			select {
			case resizes <- k.Resize:
			default: // the backend is behind; the terminal has the size
			}
		default:
			fail(fmt.Errorf("a second start: %w", errs.InvalidArgument))
			return
		}
	}
}

// mapKeys returns an iterator over m's keys.
func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// pump reads what the command writes to f and sends it, scrubbed, as
// msg chunks of at most execChunk bytes, until the command's ends are
// closed. Sending blocks while the client does not read: the command's
// writes then wait on the full pipe; nothing else is buffered but the
// scrubber's partial line (at most about 1 MiB). After a failed send it
// keeps reading, and drops, so that the command never blocks on a client
// that went away.
func (x *execCall) pump(sc *scrub.Scrubber, f *os.File, msg func([]byte) *environmentv1.ExecResponse) {
	sink := execSink{x: x, msg: msg}
	w := sc.Writer(sink)
	buf := make([]byte, execChunk)
	held := false
	for {
		deadline := time.Time{}
		if held {
			deadline = time.Now().Add(execQuiet)
		}
		_ = f.SetReadDeadline(deadline)
		n, err := f.Read(buf)
		if n > 0 {
			_, _ = w.Write(buf[:n])
			held = true
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// The command paused: send what the scrubber holds.
			_ = w.Close()
			w = sc.Writer(sink)
			held = false
			continue
		}
		if err != nil { // EOF, or EIO from a terminal whose other end closed
			break
		}
	}
	_ = w.Close()
}

// execSink sends what the scrubber lets out, in chunks.
type execSink struct {
	x   *execCall
	msg func([]byte) *environmentv1.ExecResponse
}

func (s execSink) Write(b []byte) (int, error) {
	for rest := b; len(rest) > 0; {
		n := min(len(rest), execChunk)
		if err := s.x.send(s.msg(append([]byte(nil), rest[:n]...))); err != nil {
			return 0, err
		}
		rest = rest[n:]
	}
	return len(b), nil
}

func stdoutMsg(b []byte) *environmentv1.ExecResponse {
	return &environmentv1.ExecResponse{Kind: &environmentv1.ExecResponse_Stdout{Stdout: b}}
}

func stderrMsg(b []byte) *environmentv1.ExecResponse {
	return &environmentv1.ExecResponse{Kind: &environmentv1.ExecResponse_Stderr{Stderr: b}}
}

// execPipes are the two ends of a command's standard streams.
type execPipes struct {
	// The command's ends (with a terminal, all three the follower).
	childIn, childOut, childErr *os.File
	// The service's ends: it writes stdin and reads stdout and stderr
	// (with a terminal, stdin and stdout are the controller and stderr
	// is nil).
	stdin, stdout, stderr *os.File
	tty                   bool
	inputOnce             sync.Once
	childOnce             sync.Once
}

// openPipes makes three pipes.
func openPipes() (*execPipes, error) {
	p := &execPipes{}
	var err error
	if p.childIn, p.stdin, err = os.Pipe(); err != nil {
		return nil, err
	}
	if p.stdout, p.childOut, err = os.Pipe(); err != nil {
		p.closeAll()
		return nil, err
	}
	if p.stderr, p.childErr, err = os.Pipe(); err != nil {
		p.closeAll()
		return nil, err
	}
	return p, nil
}

// wiring is what the backend hands the command.
func (p *execPipes) wiring(signals <-chan syscall.Signal) ExecWiring {
	return ExecWiring{Stdin: p.childIn, Stdout: p.childOut, Stderr: p.childErr, TTY: p.tty, Signals: signals}
}

// outputs are the service's ends to read, with the message each makes.
func (p *execPipes) outputs() []struct {
	f   *os.File
	msg func([]byte) *environmentv1.ExecResponse
} {
	out := []struct {
		f   *os.File
		msg func([]byte) *environmentv1.ExecResponse
	}{{p.stdout, stdoutMsg}}
	if p.stderr != nil {
		out = append(out, struct {
			f   *os.File
			msg func([]byte) *environmentv1.ExecResponse
		}{p.stderr, stderrMsg})
	}
	return out
}

// closeInput ends the command's input: the pipe is closed; a terminal
// gets its end-of-file character (^D, which ends a read at the start of
// a line in canonical mode).
func (p *execPipes) closeInput() {
	p.inputOnce.Do(func() {
		if p.tty {
			_, _ = p.stdin.Write([]byte{4})
			return
		}
		_ = p.stdin.Close()
	})
}

// closeChild closes the command's ends (the service's copies).
func (p *execPipes) closeChild() {
	p.childOnce.Do(func() {
		for _, f := range []*os.File{p.childIn, p.childOut, p.childErr} {
			if f != nil {
				_ = f.Close()
			}
		}
	})
}

// closeParent closes the service's ends.
func (p *execPipes) closeParent() {
	p.closeChild()
	for _, f := range []*os.File{p.stdin, p.stdout, p.stderr} {
		if f != nil {
			_ = f.Close()
		}
	}
}

func (p *execPipes) closeAll() { p.closeParent() }

// execInput is what the exec-boundary middleware is shown of a command:
// its argv, shell-quoted, as the message; custom trigger "sandbox_exec";
// metadata sandbox_id, argv (a list) and tty.
func execInput(sandbox string, argv []string, tty bool) *operatorv1.OperatorInput {
	list := make([]any, len(argv))
	for i, a := range argv {
		list[i] = a
	}
	md, _ := structpb.NewStruct(map[string]any{"sandbox_id": sandbox, "argv": list, "tty": tty})
	return &operatorv1.OperatorInput{
		Message:       content.Text(shellJoin(argv)),
		Trigger:       operatorv1.TriggerType_TRIGGER_TYPE_CUSTOM,
		CustomTrigger: ExecTrigger,
		Metadata:      md,
	}
}

// execArgv is the command to run once the middleware answered got for
// orig (the input made of argv): a metadata argv that differs from argv
// replaces it; else a message that differs is run by /bin/sh -c; else
// argv runs as it is.
func execArgv(argv []string, orig, got *operatorv1.OperatorInput) []string {
	if got == nil || got == orig {
		return argv
	}
	if l := got.GetMetadata().GetFields()["argv"].GetListValue(); l != nil && len(l.GetValues()) > 0 {
		var repl []string
		for _, v := range l.GetValues() {
			s, ok := v.GetKind().(*structpb.Value_StringValue)
			if !ok {
				repl = nil
				break
			}
			repl = append(repl, s.StringValue)
		}
		if len(repl) > 0 && repl[0] != "" && !slices.Equal(repl, argv) {
			return repl
		}
	}
	if text := content.TextOf(got.GetMessage()); text != content.TextOf(orig.GetMessage()) && strings.TrimSpace(text) != "" {
		return []string{"/bin/sh", "-c", text}
	}
	return argv
}

// execOutput is what the exec-boundary middleware is shown, after, of how
// a command ended: "exit N", "signal S" or "timed out" as the message
// (COMPLETE for exit 0, else ERROR) and annotations code, signal,
// timed_out and limits_hit.
func execOutput(r *ExecResult) *operatorv1.OperatorOutput {
	text := fmt.Sprintf("exit %d", r.Code)
	switch {
	case r.TimedOut:
		text = "timed out"
	case r.Signal != "":
		text = "signal " + r.Signal
	}
	kind := operatorv1.ExitKind_EXIT_KIND_ERROR
	if r.Code == 0 && r.Signal == "" && !r.TimedOut {
		kind = operatorv1.ExitKind_EXIT_KIND_COMPLETE
	}
	limits := make([]any, len(r.LimitsHit))
	for i, l := range r.LimitsHit {
		limits[i] = l
	}
	ann, _ := structpb.NewStruct(map[string]any{"code": r.Code, "signal": r.Signal, "timed_out": r.TimedOut, "limits_hit": limits})
	return &operatorv1.OperatorOutput{
		Message:     content.Text(text),
		ExitReason:  &operatorv1.ExitReason{Kind: kind, Message: text},
		Annotations: ann,
	}
}

// shellJoin quotes argv for a POSIX shell.
func shellJoin(argv []string) string {
	out := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%") == "" {
			out[i] = a
			continue
		}
		out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(out, " ")
}
