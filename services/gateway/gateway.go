package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
)

// Event types of the orchestrator's workflow log that the gateway acts on.
const (
	eventSuspended      = "orchestrator.workflow.suspended"
	eventSignalAccepted = "orchestrator.signal.accepted"
	// An agent's step (one operator call) finished.
	eventDispatchCompleted = "orchestrator.dispatch.completed"
)

// sessionPattern is what a session (an A2A context id, an MCP session
// argument, a chat front end's session) may look like: it becomes part of
// the workflow ids of its messages.
var sessionPattern = regexp.MustCompile(`^[A-Za-z0-9._:@-]{1,200}$`)

// taskSuffixLen is the length of the random part of a workflow id the
// gateway assigns: "~" and 16 hex digits after the session.
const taskSuffixLen = 17

// Gateway turns messages from the outside (A2A, MCP, chat front ends)
// into orchestrator workflows, one lane per session. It keeps no durable
// state: a task is the orchestrator's workflow, and its id names the
// session it belongs to.
type Gateway struct {
	orch   orchestratorv1.OrchestratorServiceClient
	agents *Agents
	lanes  *Lanes
	log    *slog.Logger
	// ctx is the gateway's lifetime: queued messages run under it, not
	// under the request that queued them.
	ctx context.Context

	mu     sync.Mutex
	queued map[string]*queuedMessage // accepted, waiting in a lane, not started yet

	// durable, when set, keeps the lanes in the State service instead
	// (durable.go).
	durable *durableLanes
	// chatSettled, when set, posts the answer of a settled durable-lane
	// message that came from a chat channel (its metadata says where),
	// before the message leaves its lane, whichever process accepted it;
	// it reports whether it handled the message.
	chatSettled func(meta map[string]any, s Settled) bool
	// sched, when set, keeps cron schedules in the State service
	// (schedule.go).
	sched *Scheduler
	// push, when set, keeps A2A push-notification configs in the State
	// service and delivers them (push.go).
	push *pusher
}

type queuedMessage struct {
	m        Message
	canceled bool
	starting bool
	started  chan struct{}
}

// Message is one message for an agent.
type Message struct {
	// Agent is the agent that answers it.
	Agent string
	// Session groups the messages of one conversation; they are run one
	// at a time in arrival order, and the operator keeps their history.
	Session string
	// Text is the message.
	Text string
	// Metadata goes into the invocation's metadata.
	Metadata map[string]any
}

// New returns a gateway in front of the orchestrator client orch, with
// the agents of agents and lanes of depth waiting messages each. Queued
// messages run under ctx: they stop when it ends.
func New(ctx context.Context, orch orchestratorv1.OrchestratorServiceClient, agents *Agents, depth int, log *slog.Logger) *Gateway {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Gateway{orch: orch, agents: agents, lanes: NewLanes(depth), log: log, ctx: ctx, queued: map[string]*queuedMessage{}}
}

// Orchestrator is the orchestrator client the gateway calls.
func (g *Gateway) Orchestrator() orchestratorv1.OrchestratorServiceClient { return g.orch }

// Agents is the gateway's view of the agents.
func (g *Gateway) Agents() *Agents { return g.agents }

// NewSession returns a fresh session id.
func NewSession() string { return "s-" + randomHex(8) }

// NewTaskID returns a new workflow id for a message of session.
func NewTaskID(session string) string { return session + "~" + randomHex(8) }

// SessionOf returns the session a workflow id of the gateway names, or
// "" for a workflow the gateway did not start.
func SessionOf(id string) string {
	if len(id) <= taskSuffixLen || id[len(id)-taskSuffixLen] != '~' {
		return ""
	}
	return id[:len(id)-taskSuffixLen]
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Accepted is a message queued on its lane.
type Accepted struct {
	// ID is its workflow id (the A2A task id).
	ID string
	// Started is closed once the workflow has been started (or could not
	// be: StartErr says why).
	Started <-chan struct{}
	// Settled receives the workflow once it has ended or waits for a
	// person, and is then closed; the error when it could not be followed.
	Settled <-chan Settled

	startErr *error
}

// StartErr is why the workflow could not be started, once Started is
// closed; nil when it was.
func (a *Accepted) StartErr() error { return *a.startErr }

// Settled is where a workflow stopped: ended, or waiting for a person.
type Settled struct {
	Workflow *orchestratorv1.Workflow
	Err      error
	// posted: a chat channel has posted the answer already (chatSettled).
	posted bool
}

// check validates m, filling in a new session when it has none.
func (g *Gateway) check(ctx context.Context, m *Message) error {
	if strings.TrimSpace(m.Text) == "" {
		return fmt.Errorf("the message has no text: send the question or task as text: %w", errs.InvalidArgument)
	}
	if m.Session == "" {
		m.Session = NewSession()
	}
	if !sessionPattern.MatchString(m.Session) {
		return fmt.Errorf("session %q: use 1 to 200 letters, digits and . _ : @ -: %w", clip(m.Session, 80), errs.InvalidArgument)
	}
	if m.Agent == "" {
		return fmt.Errorf("no agent named: %w", errs.InvalidArgument)
	}
	return g.agents.Check(ctx, m.Agent)
}

// Submit checks m and queues it on its session's lane: its workflow
// starts once every earlier message of the session has ended or waits
// for a person. It fails RESOURCE_EXHAUSTED when the lane is full (the
// message is then not queued), NOT_FOUND for an unknown agent,
// INVALID_ARGUMENT for an empty message or a malformed session.
func (g *Gateway) Submit(ctx context.Context, m Message) (*Accepted, error) {
	if err := g.check(ctx, &m); err != nil {
		return nil, err
	}
	if g.durable != nil {
		return g.durable.submit(ctx, m)
	}
	id := NewTaskID(m.Session)
	started := make(chan struct{})
	settled := make(chan Settled, 1)
	var startErr error
	acc := &Accepted{ID: id, Started: started, Settled: settled, startErr: &startErr}
	q := &queuedMessage{m: m, started: started}
	g.mu.Lock()
	g.queued[id] = q
	g.mu.Unlock()
	job := func() {
		defer close(settled)
		g.mu.Lock()
		canceled := q.canceled
		q.starting = true
		g.mu.Unlock()
		if canceled {
			startErr = fmt.Errorf("the message was canceled before it started: %w", errs.Canceled)
		} else {
			startErr = g.start(id, m)
		}
		// Until the workflow exists, the task reads as queued.
		g.mu.Lock()
		delete(g.queued, id)
		g.mu.Unlock()
		close(started)
		if startErr != nil {
			settled <- Settled{Err: startErr}
			return
		}
		wf, err := g.WaitSettled(g.ctx, id)
		settled <- Settled{Workflow: wf, Err: err}
	}
	if err := g.lanes.Submit("session:"+m.Session, job); err != nil {
		g.mu.Lock()
		delete(g.queued, id)
		g.mu.Unlock()
		return nil, err
	}
	return acc, nil
}

// Queued returns the message of a task waiting in its lane.
func (g *Gateway) Queued(id string) (Message, bool) {
	if g.durable != nil {
		return g.durable.queued(id)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	q, ok := g.queued[id]
	if !ok || q.canceled {
		return Message{}, false
	}
	return q.m, true
}

// CancelQueued cancels a message still waiting in its lane: it will not
// start. It reports whether there was one; when its workflow is being
// started, it waits until it has been (the workflow is then to be
// canceled instead) and reports false.
func (g *Gateway) CancelQueued(id string) bool {
	if g.durable != nil {
		return g.durable.cancelQueued(id)
	}
	g.mu.Lock()
	q, ok := g.queued[id]
	if !ok {
		g.mu.Unlock()
		return false
	}
	if q.starting {
		g.mu.Unlock()
		<-q.started
		return false
	}
	q.canceled = true
	g.mu.Unlock()
	return true
}

// start starts workflow id for m.
func (g *Gateway) start(id string, m Message) error {
	session := m.Session
	in := &operatorv1.OperatorInput{Message: content.Text(m.Text), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_USER, SessionId: &session}
	if len(m.Metadata) > 0 {
		if md, err := structOf(m.Metadata); err == nil {
			in.Metadata = md
		}
	}
	_, err := g.orch.StartWorkflow(g.ctx, &orchestratorv1.StartWorkflowRequest{WorkflowId: id, AgentId: m.Agent, Input: in})
	return err
}

// Run submits m and waits until its workflow has ended or waits for a
// person (or ctx ends: the message still runs).
func (g *Gateway) Run(ctx context.Context, m Message) (*orchestratorv1.Workflow, error) {
	acc, err := g.Submit(ctx, m)
	if err != nil {
		return nil, err
	}
	select {
	case s := <-acc.Settled:
		return s.Workflow, s.Err
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// WaitSettled follows workflow id until it has ended or waits for a
// person, and returns its record then.
func (g *Gateway) WaitSettled(ctx context.Context, id string) (*orchestratorv1.Workflow, error) {
	return g.Follow(ctx, id, FollowOptions{}, nil)
}

// FollowOptions say what Follow passes on.
type FollowOptions struct {
	// Progress passes the live progress of the root agent's operator
	// calls (text deltas, tool calls).
	Progress bool
	// AfterDecision, when not 0, is the sequence of an approval decision
	// (Decide): everything before its acceptance is skipped, so the
	// suspension it answered does not count as where the workflow
	// stopped.
	AfterDecision uint64
}

// Update is one thing a followed workflow did.
type Update struct {
	// Text is model text to append (a text delta of the root agent).
	Text string
	// ToolStarted and ToolFinished name a tool call of the root agent
	// starting or finishing (ToolError: it failed).
	ToolStarted, ToolFinished string
	ToolID                    string
	ToolError                 bool
	// Event is an event of the workflow's durable log.
	Event *lifecyclev1.LifecycleEvent
}

// Follow watches workflow id (WatchWorkflow) and calls fn with what it
// does, until it has ended or waits for a person, and returns its record
// then. A lost stream is resumed from the last event seen (the progress
// of the call running then starts again from that call's start). fn may
// be nil; returning false stops following (Follow then
// returns context.Canceled).
// It returns on a suspension with the record.
func (g *Gateway) Follow(ctx context.Context, id string, o FollowOptions, fn func(Update) bool) (*orchestratorv1.Workflow, error) {
	var after uint64
	failures := 0
	gated := o.AfterDecision != 0
	for {
		wf, retry, err := g.follow(ctx, id, o, fn, &after, &gated)
		if !retry || failures >= 5 || ctx.Err() != nil {
			return wf, err
		}
		failures++ // reconnect after the last event seen
	}
}

// follow is one WatchWorkflow stream of Follow; retry says the stream was
// lost and may be resumed after *after. The stream ends with it.
func (g *Gateway) follow(ctx context.Context, id string, o FollowOptions, fn func(Update) bool, after *uint64, gated *bool) (_ *orchestratorv1.Workflow, retry bool, _ error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := g.orch.WatchWorkflow(ctx, &orchestratorv1.WatchWorkflowRequest{WorkflowId: id, AfterSequence: *after, OmitProgress: !o.Progress})
	if err != nil {
		return nil, false, err
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				wf, err := g.getWorkflow(ctx, id)
				return wf, false, err
			}
			if c := status.Code(err); c == codes.Unavailable || c == codes.ResourceExhausted {
				return nil, true, err
			}
			return nil, false, err
		}
		switch k := msg.GetKind().(type) {
		case *orchestratorv1.WatchWorkflowResponse_End:
			return k.End, false, nil
		case *orchestratorv1.WatchWorkflowResponse_Progress:
			if *gated || fn == nil || k.Progress.GetDepth() != 0 {
				continue
			}
			var u Update
			switch e := k.Progress.GetEvent().GetEvent().(type) {
			case *operatorv1.ExecuteStreamResponse_TextDelta:
				u.Text = e.TextDelta.GetText()
			case *operatorv1.ExecuteStreamResponse_ToolCallStarted:
				u.ToolStarted, u.ToolID = e.ToolCallStarted.GetName(), e.ToolCallStarted.GetToolUseId()
			case *operatorv1.ExecuteStreamResponse_ToolCallFinished:
				u.ToolFinished, u.ToolID, u.ToolError = e.ToolCallFinished.GetName(), e.ToolCallFinished.GetToolUseId(), e.ToolCallFinished.GetIsError()
			default:
				continue
			}
			if !fn(u) {
				return nil, false, context.Canceled
			}
		case *orchestratorv1.WatchWorkflowResponse_Event:
			ev := k.Event
			if s := ev.GetWorkflowSequence(); s > *after {
				*after = s
			}
			if *gated {
				*gated = !isDecisionOf(ev, o.AfterDecision)
				continue
			}
			if fn != nil && !fn(Update{Event: ev}) {
				return nil, false, context.Canceled
			}
			// After an ending event the stream's end follows at once (the
			// orchestrator ends it when the run ends).
			if ev.GetObservable().GetEventType() == eventSuspended {
				wf, err := g.getWorkflow(ctx, id)
				if err != nil {
					return nil, false, err
				}
				if wf.GetStatus() != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING {
					return wf, false, nil
				}
				// It went on meanwhile (a signal woke it): keep watching.
			}
		}
	}
}

func (g *Gateway) getWorkflow(ctx context.Context, id string) (*orchestratorv1.Workflow, error) {
	resp, err := g.orch.GetWorkflow(ctx, &orchestratorv1.GetWorkflowRequest{WorkflowId: id})
	if err != nil {
		return nil, err
	}
	return resp.GetWorkflow(), nil
}

// Decide answers the approvals workflow id waits on: every pending call
// approved, or every one rejected with reason. It returns the sequence
// of the decision's signal.
func (g *Gateway) Decide(ctx context.Context, id string, approve bool, reason, by string) (uint64, error) {
	wf, err := g.getWorkflow(ctx, id)
	if err != nil {
		return 0, err
	}
	pending := wf.GetPendingApprovals()
	if len(pending) == 0 {
		return 0, fmt.Errorf("task %q is %s and waits for no approval: %w", id, StateName(wf.GetStatus()), errs.FailedPrecondition)
	}
	ds := make([]*operatorv1.ToolDecision, 0, len(pending))
	for _, p := range pending {
		d := &operatorv1.ToolDecision{ToolUseId: p.GetToolCall().GetToolUseId(), Approved: approve, DecidedBy: by}
		if !approve {
			d.Reason = reason
		}
		ds = append(ds, d)
	}
	resp, err := g.orch.DecideApprovals(ctx, &orchestratorv1.DecideApprovalsRequest{WorkflowId: id, Decisions: ds})
	if err != nil {
		return 0, err
	}
	return resp.GetSequence(), nil
}

// StateName is a workflow status in lower case ("running", ...).
func StateName(s orchestratorv1.WorkflowStatus) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "WORKFLOW_STATUS_"))
}

// Answer is the text of a workflow's last output.
func Answer(wf *orchestratorv1.Workflow) string {
	return strings.TrimSpace(content.TextOf(wf.GetLastOutput().GetMessage()))
}

// isDecisionOf reports whether ev is the acceptance of the signal with
// sequence seq.
func isDecisionOf(ev *lifecyclev1.LifecycleEvent, seq uint64) bool {
	o := ev.GetObservable()
	if o.GetEventType() != eventSignalAccepted {
		return false
	}
	return uint64(o.GetData().GetStructValue().GetFields()["sequence"].GetNumberValue()) == seq
}

// clip cuts s to n bytes.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// structOf converts JSON-like metadata to a Struct.
func structOf(m map[string]any) (*structpb.Struct, error) { return structpb.NewStruct(m) }
