package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shopspring/decimal"
	"golang.org/x/term"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/services/operator"
	"github.com/secbear/neuron/services/operator/provider"
)

const chatHelp = `Talk with AGENT: every line you type is a turn of one session (a workflow
of its own), and the answer is printed as it arrives, with a line per tool
call. The session id is printed at the start; pass it to --session to go on
with the same conversation later.

While an answer runs, Ctrl-C cancels it (the workflow is canceled) and the
chat goes on. When the agent asks before running a tool, the call is shown
and you answer inline: y approves, n rejects (with a reason told to the
model), e runs it with an input you type as JSON.

Commands: /history (the session's turns, from the State service), /cost
(what this chat spent), /quit (or Ctrl-D).

The session's history is kept by the operator: agents must run on the
operator directly (neuron up --isolation none) for it to be remembered.`

// errInterrupted is Ctrl-C at a prompt.
var errInterrupted = errors.New("interrupted")

// chatInput reads the lines a person types.
type chatInput interface {
	// readLine shows prompt and returns the line typed: io.EOF at the
	// end of input, errInterrupted for Ctrl-C.
	readLine(ctx context.Context, prompt string) (string, error)
}

// chatTurn is one message of this chat and what came of it.
type chatTurn struct {
	user, answer, workflow string
	status                 orchestratorv1.WorkflowStatus
	spent                  string
}

// chat is one `neuron chat`.
type chat struct {
	out            io.Writer
	client         orchestratorv1.OrchestratorServiceClient
	state          conn // the State service, for /history
	agent, session string
	addr           string
	in             chatInput
	sigint         <-chan os.Signal
	color          bool
	turns          []chatTurn
	spent          decimal.Decimal
	n              int
}

// cmdChat is `neuron chat AGENT`.
func (c *cli) cmdChat(ctx context.Context, args []string) error {
	var (
		cn        conn
		session   string
		stateAddr string
	)
	fs := newFlagSet("chat", "neuron chat AGENT [--session S] [flags]", chatHelp, c.stdout)
	cn.bind(fs, c, "orchestrator", "NEURON_ORCHESTRATOR_ADDR", defaultOrchestratorAddr, 30*time.Second)
	fs.StringVar(&session, "session", "", "go on with this session (default: a new chat-<random> one, printed at the start)")
	fs.StringVar(&stateAddr, "state-addr", c.envOr("NEURON_STATE_ADDR", defaultStateAddr), "address of the State service, for /history (env NEURON_STATE_ADDR)")
	pos, err := parseArgs(fs, "chat", args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErrorf("chat", "want the AGENT to talk with, e.g. neuron chat assistant")
	}
	if session == "" {
		session = "chat-" + strings.TrimPrefix(newWorkflowID(), "run-")
	}
	cc, err := cn.dial()
	if err != nil {
		return err
	}
	defer cc.Close()
	st := cn
	st.service, st.addr, st.timeout = "State service", stateAddr, 5*time.Second
	ch := &chat{
		out: &syncWriter{w: c.stdout}, client: orchestratorv1.NewOrchestratorServiceClient(cc), state: st,
		agent: pos[0], session: session, addr: cn.addr, sigint: c.interrupts, color: c.terminal,
	}
	if ch.sigint == nil {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt)
		defer signal.Stop(sig)
		ch.sigint = sig
	}
	if f, ok := c.stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		ch.in = newTTYInput(f, ch.out)
	} else {
		ch.in = &plainInput{r: c.stdin, w: ch.out, sigint: ch.sigint}
	}
	fmt.Fprintf(c.stdout, "chat with %s · session %s (go on later: neuron chat %s --session %s)\n", ch.agent, session, ch.agent, session)
	fmt.Fprintln(c.stdout, ch.dim("/history the session's turns · /cost what this chat spent · /quit leaves · Ctrl-C cancels a running answer"))
	return ch.loop(ctx)
}

// dim wraps s in the dim style on a terminal.
func (ch *chat) dim(s string) string {
	if ch.color {
		return styleDim + s + styleReset
	}
	return s
}

// loop reads lines until /quit, the end of input or SIGTERM.
func (ch *chat) loop(ctx context.Context) error {
	for {
		line, err := ch.in.readLine(ctx, "you> ")
		switch {
		case errors.Is(err, errInterrupted):
			fmt.Fprintln(ch.out, ch.dim("(nothing is running; /quit or Ctrl-D leaves)"))
			continue
		case errors.Is(err, io.EOF):
			fmt.Fprintln(ch.out)
			ch.bye()
			return nil
		case err != nil:
			if ctx.Err() != nil {
				ch.bye()
				return nil
			}
			return err
		}
		switch line = strings.TrimSpace(line); {
		case line == "":
		case line == "/quit" || line == "/exit" || line == "/q":
			ch.bye()
			return nil
		case line == "/history":
			ch.history(ctx)
		case line == "/cost":
			ch.cost()
		case line == "/help" || line == "/?":
			fmt.Fprintln(ch.out, "type a message to send it; /history the session's turns, /cost what this chat spent, /quit leaves; Ctrl-C cancels a running answer")
		case strings.HasPrefix(line, "/"):
			fmt.Fprintf(ch.out, "unknown command %s: /history, /cost or /quit (a message may not begin with /)\n", line)
		default:
			ch.turn(ctx, line)
		}
		if ctx.Err() != nil {
			ch.bye()
			return nil
		}
	}
}

// bye says how to come back.
func (ch *chat) bye() {
	fmt.Fprintf(ch.out, "session %s kept: go on with neuron chat %s --session %s\n", ch.session, ch.agent, ch.session)
}

// errorLine prints a failed call as neuron prints errors, and the chat
// goes on.
func (ch *chat) errorLine(err error) {
	re := &rpcError{service: "orchestrator", addr: ch.addr, err: err}
	if _, ok := status.FromError(err); !ok {
		fmt.Fprintf(ch.out, "neuron: %s\n", oneLine(err.Error()))
		return
	}
	_, line := statusLine(re)
	fmt.Fprintf(ch.out, "neuron: %s\n", line)
}

// turn sends one message as a workflow of the session and shows it to
// its end, asking for approvals on the way.
func (ch *chat) turn(ctx context.Context, text string) {
	ch.n++
	id := fmt.Sprintf("%s-%d-%s", ch.session, ch.n, strings.TrimPrefix(newWorkflowID(), "run-")[:6])
	in := &operatorv1.OperatorInput{Message: content.Text(text), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_USER, SessionId: &ch.session}
	if _, err := ch.client.StartWorkflow(ctx, &orchestratorv1.StartWorkflowRequest{WorkflowId: id, AgentId: ch.agent, Input: in}); err != nil {
		ch.errorLine(err)
		return
	}
	view := newStreamView(ch.out, ch.color, false, true)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	suspended := make(chan *lifecyclev1.LifecycleEvent, 16)
	w := &watcher{client: ch.client, id: id, onProgress: view.progress}
	w.onEvent = func(ev *lifecyclev1.LifecycleEvent) {
		view.event(ev)
		switch ev.GetObservable().GetEventType() {
		case eventSuspended:
			suspended <- ev
		case eventDispatchFailed:
			view.mu.Lock()
			view.line(view.dim("operator call failed: " + describe(ev)))
			view.mu.Unlock()
		}
	}
	ends := make(chan watchEnd, 1)
	go func() {
		wf, err := w.run(runCtx)
		ends <- watchEnd{wf, err}
	}()
	canceled := false
	cancel := func() {
		view.finish()
		if canceled {
			return
		}
		canceled = true
		fmt.Fprintln(ch.out, ch.dim("^C canceling this answer (the chat goes on)"))
		if _, err := ch.client.CancelWorkflow(ctx, &orchestratorv1.CancelWorkflowRequest{WorkflowId: id, Reason: "canceled in neuron chat (Ctrl-C)"}); err != nil {
			ch.errorLine(err)
			stop()
		}
	}
	for {
		select {
		case ev := <-suspended:
			view.finish()
			calls := pendingApprovals(ctx, ch.client, id, ev, nil)
			for {
				decisions, err := ch.ask(ctx, calls)
				if err != nil {
					cancel()
					break
				}
				// The answer goes on once decided: its lines wait for
				// this one.
				view.mu.Lock()
				resp, err := ch.client.DecideApprovals(ctx, &orchestratorv1.DecideApprovalsRequest{WorkflowId: id, Decisions: decisions})
				if err == nil {
					fmt.Fprintln(ch.out, ch.dim(fmt.Sprintf("decision recorded (sequence %d)", resp.GetSequence())))
				}
				view.mu.Unlock()
				if err != nil {
					ch.errorLine(err)
					continue // ask again
				}
				break
			}
		case e := <-ends:
			view.finish()
			ch.ended(text, id, e, view.streamed)
			return
		case <-ch.sigint:
			cancel()
		}
	}
}

// ended records and shows the end of a turn.
func (ch *chat) ended(text, id string, e watchEnd, streamed bool) {
	if e.err != nil {
		ch.errorLine(e.err)
		return
	}
	wf := e.wf
	t := chatTurn{user: text, workflow: id, status: wf.GetStatus(), spent: wf.GetSpent().GetAmount()}
	t.answer = strings.TrimSpace(content.TextOf(wf.GetLastOutput().GetMessage()))
	if !streamed && t.answer != "" {
		fmt.Fprintln(ch.out, t.answer)
	}
	if d, err := decimal.NewFromString(t.spent); err == nil {
		ch.spent = ch.spent.Add(d)
	}
	switch wf.GetStatus() {
	case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED:
		if k := wf.GetLastOutput().GetExitReason().GetKind(); k != operatorv1.ExitKind_EXIT_KIND_COMPLETE && k != operatorv1.ExitKind_EXIT_KIND_UNSPECIFIED {
			fmt.Fprintln(ch.out, ch.dim("(ended without completing: exit "+strings.TrimPrefix(k.String(), "EXIT_KIND_")+")"))
		}
	case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED:
		fmt.Fprintln(ch.out, ch.dim("(canceled)"))
	default:
		msg := statusName(wf.GetStatus())
		if f := wf.GetFailure(); f != nil {
			msg += ": " + oneLine(f.GetMessage())
		}
		fmt.Fprintln(ch.out, ch.dim("("+msg+")"))
	}
	ch.turns = append(ch.turns, t)
}

// ask asks about each pending call and returns the decisions; an error
// (Ctrl-C, the end of input) leaves them undecided.
func (ch *chat) ask(ctx context.Context, calls []*orchestratorv1.PendingApproval) ([]*operatorv1.ToolDecision, error) {
	fmt.Fprintf(ch.out, "%s asks before running %d tool call(s):\n", ch.agent, len(calls))
	var out []*operatorv1.ToolDecision
	for _, a := range calls {
		tc := a.GetToolCall()
		fmt.Fprintf(ch.out, "  %s(%s)\n", tc.GetName(), clip(jsonText(tc.GetInput()), 300))
		d := &operatorv1.ToolDecision{ToolUseId: tc.GetToolUseId(), DecidedBy: "neuron chat"}
	answer:
		for {
			ans, err := ch.in.readLine(ctx, "  approve? [y]es / [n]o / [e]dit: ")
			if err != nil {
				return nil, err
			}
			switch strings.ToLower(strings.TrimSpace(ans)) {
			case "y", "yes":
				d.Approved = true
				break answer
			case "n", "no":
				reason, err := ch.in.readLine(ctx, "  reason, told to the model (Enter: none): ")
				if err != nil {
					return nil, err
				}
				d.Reason = strings.TrimSpace(reason)
				break answer
			case "e", "edit":
				js, err := ch.in.readLine(ctx, "  input as a JSON object: ")
				if err != nil {
					return nil, err
				}
				v := &structpb.Value{}
				if err := protojson.Unmarshal([]byte(js), v); err != nil || v.GetStructValue() == nil {
					fmt.Fprintln(ch.out, "  not a JSON object; try again")
					continue
				}
				d.Approved, d.EditedInput = true, v
				break answer
			default:
				fmt.Fprintln(ch.out, "  answer y, n or e")
			}
		}
		out = append(out, d)
	}
	return out, nil
}

// cost prints what this chat spent.
func (ch *chat) cost() {
	fmt.Fprintf(ch.out, "spent %s in this chat (%d turn(s))\n", usd(ch.spent.String()), len(ch.turns))
	for i, t := range ch.turns {
		fmt.Fprintf(ch.out, "  %d  %s  %s  %s\n", i+1, usd(t.spent), statusName(t.status), t.workflow)
	}
}

// history prints the session's turns as the operator keeps them in the
// State service, or this chat's when they cannot be read.
func (ch *chat) history(ctx context.Context) {
	msgs, err := ch.storedHistory(ctx)
	if err == nil && len(msgs) > 0 {
		for _, m := range msgs {
			printMessage(ch.out, m)
		}
		return
	}
	if err != nil {
		fmt.Fprintf(ch.out, "%s\n", ch.dim(fmt.Sprintf("(the session's history could not be read from the State service at %s: %s; this chat's turns:)", ch.state.addr, oneLine(status.Convert(err).Message()))))
	}
	if len(ch.turns) == 0 {
		fmt.Fprintln(ch.out, "no turns yet in session "+ch.session)
		return
	}
	for _, t := range ch.turns {
		fmt.Fprintf(ch.out, "you: %s\n%s: %s\n", t.user, ch.agent, t.answer)
	}
}

// storedHistory reads the session's messages from the State service.
func (ch *chat) storedHistory(ctx context.Context) ([]provider.Message, error) {
	cc, err := ch.state.dial()
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, ch.state.timeout)
	defer cancel()
	return operator.NewStateHistory(statev1.NewStateServiceClient(cc), nil).Load(ctx, ch.session, 0)
}

// printMessage writes one stored message: who said it and its text, a
// line per tool call and result.
func printMessage(w io.Writer, m provider.Message) {
	who := "you"
	if m.Role != provider.User {
		who = strings.ToLower(m.Role.String())
	}
	for _, p := range m.Parts {
		switch {
		case p.ToolUse != nil:
			fmt.Fprintf(w, "%s: → %s(%s)\n", who, p.ToolUse.Name, clip(string(p.ToolUse.Input), 100))
		case p.ToolResult != nil:
			fmt.Fprintf(w, "%s: ← %s\n", who, clip(firstLine(p.ToolResult.Content), 100))
		case p.Image != nil:
			fmt.Fprintf(w, "%s: [image]\n", who)
		case strings.TrimSpace(p.Text) != "":
			fmt.Fprintf(w, "%s: %s\n", who, strings.TrimSpace(p.Text))
		}
	}
}

// plainInput reads lines from a pipe or file; Ctrl-C (SIGINT) at a
// prompt is errInterrupted.
type plainInput struct {
	r      io.Reader
	w      io.Writer
	sigint <-chan os.Signal
	once   sync.Once
	lines  chan string
	err    error
}

func (p *plainInput) readLine(ctx context.Context, prompt string) (string, error) {
	p.once.Do(func() {
		p.lines = make(chan string)
		go func() {
			defer close(p.lines)
			sc := bufio.NewScanner(p.r)
			for sc.Scan() {
				p.lines <- sc.Text()
			}
			p.err = sc.Err()
		}()
	})
	fmt.Fprint(p.w, prompt)
	select {
	case l, ok := <-p.lines:
		if !ok {
			if p.err != nil {
				return "", p.err
			}
			return "", io.EOF
		}
		return l, nil
	case <-p.sigint:
		fmt.Fprintln(p.w)
		return "", errInterrupted
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// ttyInput reads lines on a terminal with line editing and history
// (golang.org/x/term), in raw mode only while it reads: an answer streams
// in the terminal's normal mode, where Ctrl-C is SIGINT.
type ttyInput struct {
	f  *os.File
	t  *term.Terminal
	rd *ctrlC
}

// ctrlC passes a terminal's input on, turning Ctrl-C into Enter and
// remembering it: the line editor would take it for the end of input.
type ctrlC struct {
	r   io.Reader
	hit atomic.Bool
}

func (c *ctrlC) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	for i := range p[:n] {
		if p[i] == 3 {
			p[i] = '\r'
			c.hit.Store(true)
		}
	}
	return n, err
}

// newTTYInput reads lines from the terminal f, echoing to w.
func newTTYInput(f *os.File, w io.Writer) *ttyInput {
	rd := &ctrlC{r: f}
	return &ttyInput{f: f, rd: rd, t: term.NewTerminal(struct {
		io.Reader
		io.Writer
	}{rd, w}, "")}
}

func (t *ttyInput) readLine(_ context.Context, prompt string) (string, error) {
	fd := int(t.f.Fd())
	old, err := term.MakeRaw(fd)
	if err != nil {
		return "", fmt.Errorf("the terminal: %w", err)
	}
	defer term.Restore(fd, old)
	if w, h, err := term.GetSize(fd); err == nil {
		_ = t.t.SetSize(w, h)
	}
	t.rd.hit.Store(false)
	t.t.SetPrompt(prompt)
	line, err := t.t.ReadLine()
	if t.rd.hit.Load() {
		return "", errInterrupted
	}
	return line, err
}
