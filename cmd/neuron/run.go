package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/shopspring/decimal"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
)

const runHelp = `Dispatch AGENT (an id from the orchestrator's agent registry) with TASK
through the orchestrator and wait for the answer. While it runs, the
model's text is printed as it arrives, each tool call as one line
(→ tool(input), ← result (n bytes)), delegated agents' indented, and the
workflow's durable events: each operator call with its exit, effects and
cost, each effect applied (memory writes, delegations), budget events,
approvals. Then the answer, the model, the tool calls, the total cost and
what happened to every effect. A broken watch stream is reconnected
without showing anything twice.

When the workflow stops to ask a person before a tool runs, run prints
the pending calls with the 'neuron approve' command that decides them and
exits 4; with --wait-approval it waits for the decision and goes on.

--no-stream shows the lifecycle events only (a live status line on a
terminal), as before the orchestrator streamed. With --json one protojson
object per line: {"event": LifecycleEvent} and {"progress": StepProgress}
while it runs, {"approvals": [PendingApproval]} when it waits, then
{"result": DispatchResponse} or {"error": {...}}.

Exit codes: 0 completed, 3 the workflow ended without completing (e.g. it
hit max_turns), 4 it waits for approval, 10+N a gRPC status code N (15 NOT_FOUND: unknown agent;
24 UNAVAILABLE: is 'neuron up' running?; 18 RESOURCE_EXHAUSTED: budget spent).`

// drainWait bounds how long run waits, after Dispatch has returned, for
// the workflow's last events (the orchestrator publishes the end of a
// workflow just after recording it).
const drainWait = 2 * time.Second

// runFlags are the flags of `neuron run`.
type runFlags struct {
	conn     conn
	session  string
	workflow string
	budget   string
	metadata string
	quiet    bool
	// noStream follows the lifecycle events instead of WatchWorkflow
	// (no text as it arrives); waitApproval keeps a run that waits for
	// approval going until it is decided and ends.
	noStream, waitApproval bool
}

// cmdRun is `neuron run`: one dispatch with its progress.
func (c *cli) cmdRun(ctx context.Context, args []string) error {
	var f runFlags
	fs := newFlagSet("run", "neuron run AGENT TASK... [flags]", runHelp, c.stdout)
	f.conn.bind(fs, c, "orchestrator", "NEURON_ORCHESTRATOR_ADDR", defaultOrchestratorAddr, 10*time.Minute)
	fs.StringVar(&f.session, "session", "", "session id: the agent sees the session's earlier turns and its memory (needs agents run on the operator directly)")
	fs.StringVar(&f.workflow, "workflow", "", "workflow id to run in (default: a new run-<random> id); repeating one returns its recorded result")
	fs.StringVar(&f.budget, "budget", "", "workflow budget in USD across every agent it runs, e.g. 0.50 (default: the agent's)")
	fs.StringVar(&f.metadata, "metadata", "", `JSON object passed in the input's metadata, e.g. '{"scripted": {"turns": [{"text": "hi"}]}}' for the scripted model`)
	fs.BoolVar(&f.quiet, "quiet", false, "print only the answer")
	fs.BoolVar(&f.noStream, "no-stream", false, "do not stream the answer's text and tool calls: show the lifecycle events only, as before WatchWorkflow")
	fs.BoolVar(&f.waitApproval, "wait-approval", false, "when the workflow waits for approval, wait for the decision (neuron approve, from another terminal) and go on to its end instead of exiting 4")
	pos, err := parseArgs(fs, "run", args)
	if err != nil {
		return err
	}
	if len(pos) < 2 {
		return usageErrorf("run", "want AGENT and TASK, e.g. neuron run assistant \"what is layer0?\"")
	}
	req, err := f.request(pos[0], strings.Join(pos[1:], " "))
	if err != nil {
		return err
	}
	cc, err := f.conn.dial()
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, f.conn.timeout)
	defer cancel()
	var p progress
	switch {
	case f.conn.json:
		p = &jsonProgress{w: c.stdout}
	default:
		p = newTextProgress(c.stdout, req.GetAgentId(), c.terminal && !f.quiet, f.quiet)
	}
	f.conn.hints = map[codes.Code]string{
		codes.NotFound:          "`neuron agents list` shows the agents there are; define one with `neuron agents apply -f FILE`",
		codes.ResourceExhausted: "the workflow budget is spent; pass a larger --budget",
	}
	if !f.noStream {
		streamed, err := c.runStream(ctx, cc, req, &f)
		if streamed {
			return err
		}
		if err != nil {
			return f.conn.wrap(err)
		}
	}
	resp, err := dispatch(ctx, cc, req, p)
	if err != nil {
		return f.conn.wrap(err)
	}
	if k := resp.GetOutput().GetExitReason().GetKind(); k != operatorv1.ExitKind_EXIT_KIND_COMPLETE {
		return &exitError{code: exitNotCompleted, msg: fmt.Sprintf("workflow %s ended without completing: exit %s", resp.GetWorkflowId(), strings.TrimPrefix(k.String(), "EXIT_KIND_"))}
	}
	return nil
}

// request builds the DispatchRequest of a run.
func (f *runFlags) request(agent, task string) (*orchestratorv1.DispatchRequest, error) {
	in := &operatorv1.OperatorInput{Message: content.Text(task), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_USER}
	if f.session != "" {
		in.SessionId = &f.session
	}
	if f.metadata != "" {
		md := &structpb.Struct{}
		if err := protojson.Unmarshal([]byte(f.metadata), md); err != nil {
			return nil, usageErrorf("run", "--metadata: want a JSON object: %v", err)
		}
		in.Metadata = md
	}
	req := &orchestratorv1.DispatchRequest{AgentId: agent, Input: in, WorkflowId: f.workflow}
	if f.budget != "" {
		d, err := decimal.NewFromString(f.budget)
		if err != nil || d.IsNegative() {
			return nil, usageErrorf("run", "--budget %q: want an amount of USD such as 0.50", f.budget)
		}
		req.Budget = &typesv1.Money{Amount: strings.TrimPrefix(f.budget, "+")}
	}
	if req.WorkflowId == "" {
		req.WorkflowId = newWorkflowID()
	}
	return req, nil
}

// newWorkflowID is a fresh workflow id: run- and 12 random hex digits.
func newWorkflowID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "run-" + hex.EncodeToString(b)
}

// dispatch runs req through the orchestrator on cc and reports the
// workflow's lifecycle events to p while it runs, then the result (or
// the error). req.WorkflowId must be set: it filters the events.
//
// So that no event is missed, dispatch first publishes a
// neuron.run.requested event for the workflow and subscribes from the
// sequence it was given: every event of the workflow comes after it. A
// service that refuses the publish (a credential that may not) still gets
// a live subscription, which may miss the first events.
func dispatch(ctx context.Context, cc grpc.ClientConnInterface, req *orchestratorv1.DispatchRequest, p progress) (*orchestratorv1.DispatchResponse, error) {
	lc := lifecyclev1.NewLifecycleServiceClient(cc)
	after, err := markRun(ctx, lc, req)
	if err != nil {
		p.fail(err)
		return nil, err
	}
	p.start(req.GetWorkflowId())
	subCtx, stopSub := context.WithCancel(ctx)
	defer stopSub()
	events := make(chan *lifecyclev1.LifecycleEvent, 64)
	go follow(subCtx, lc, req.GetWorkflowId(), after, events)

	type result struct {
		resp *orchestratorv1.DispatchResponse
		err  error
	}
	results := make(chan result, 1)
	go func() {
		resp, err := orchestratorv1.NewOrchestratorServiceClient(cc).Dispatch(ctx, req)
		results <- result{resp, err}
	}()
	var (
		final          *result
		started, ended bool
		grace          <-chan time.Time
	)
	finish := func() (*orchestratorv1.DispatchResponse, error) {
		if final.err != nil {
			p.fail(final.err)
			return nil, final.err
		}
		p.done(final.resp)
		return final.resp, nil
	}
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				events = nil
				if final != nil {
					return finish()
				}
				continue
			}
			p.event(ev)
			if ev.GetObservable().GetEventType() == "orchestrator.workflow.started" {
				started = true
			}
			if workflowEnded(ev) {
				ended = true
				if final != nil {
					return finish()
				}
			}
		case r := <-results:
			final, results = &r, nil
			// A dispatch refused before its workflow started (unknown
			// agent, bad request, ...) has no more events to wait for.
			if ended || events == nil || (r.err != nil && !started) {
				return finish()
			}
			grace = time.After(drainWait)
		case <-grace:
			return finish()
		}
	}
}

// markRun publishes the neuron.run.requested event of req's workflow and
// returns the sequence to replay events after. An unreachable service is
// an error; a refused publish is not (nil: subscribe live).
func markRun(ctx context.Context, lc lifecyclev1.LifecycleServiceClient, req *orchestratorv1.DispatchRequest) (*uint64, error) {
	data, _ := structpb.NewValue(map[string]any{"agent_id": req.GetAgentId(), "client": "neuron run"})
	resp, err := lc.Publish(ctx, &lifecyclev1.PublishRequest{Event: &lifecyclev1.LifecycleEvent{
		WorkflowId: req.GetWorkflowId(),
		AgentId:    req.GetAgentId(),
		Event: &lifecyclev1.LifecycleEvent_Observable{Observable: &lifecyclev1.ObservableEvent{
			EventType: eventRunRequested, Data: data,
		}},
	}})
	switch status.Code(err) {
	case codes.OK:
		after := resp.GetSequence() - 1
		return &after, nil
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return nil, err
	}
	return nil, nil
}

// follow sends the lifecycle events of workflow wf to out until ctx ends
// or the stream does, then closes out. When the replay point is no longer
// buffered it subscribes live instead.
func follow(ctx context.Context, lc lifecyclev1.LifecycleServiceClient, wf string, after *uint64, out chan<- *lifecyclev1.LifecycleEvent) {
	defer close(out)
	for {
		stream, err := lc.Subscribe(ctx, &lifecyclev1.SubscribeRequest{WorkflowId: wf, AfterSequence: after})
		if err != nil {
			return
		}
		got := false
		for {
			resp, err := stream.Recv()
			if err != nil {
				if !got && after != nil && status.Code(err) == codes.OutOfRange {
					after = nil
					break
				}
				return
			}
			got = true
			select {
			case out <- resp.GetEvent():
			case <-ctx.Done():
				return
			}
		}
	}
}

// progress shows a dispatch as it runs.
type progress interface {
	// start is called once the run is announced, before any event.
	start(workflowID string)
	event(ev *lifecyclev1.LifecycleEvent)
	// done or fail is called last.
	done(resp *orchestratorv1.DispatchResponse)
	fail(err error)
}

// jsonProgress prints one protojson object per line.
type jsonProgress struct{ w io.Writer }

func (j *jsonProgress) start(string) {}

func (j *jsonProgress) event(ev *lifecyclev1.LifecycleEvent) {
	printJSONLine(j.w, map[string]any{"event": rawProto(ev)})
}

func (j *jsonProgress) done(resp *orchestratorv1.DispatchResponse) {
	printJSONLine(j.w, map[string]any{"result": rawProto(resp)})
}

func (j *jsonProgress) fail(err error) {
	st, _ := status.FromError(err)
	printJSONLine(j.w, map[string]any{"error": map[string]any{
		"code": codeName(st.Code()), "message": st.Message(), "exit_code": exitCodeFor(st.Code()),
	}})
}
