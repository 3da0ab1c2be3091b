package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"strings"
	"time"

	"github.com/a2aproject/a2a-go/a2a"
	"github.com/a2aproject/a2a-go/a2asrv"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/errs"
)

// A2AProtocolVersion is the A2A protocol version served (that of
// github.com/a2aproject/a2a-go v0.3).
const A2AProtocolVersion = "0.3.0"

// AgentHeader is the request header (gRPC metadata) that names the agent
// a message is for on the A2A gRPC transport, which has one endpoint for
// every agent. The JSON-RPC transport names it in the path instead.
const AgentHeader = "x-neuron-agent"

// AgentMetadataKey is the message metadata key that may name the agent
// instead of AgentHeader.
const AgentMetadataKey = "neuron_agent"

// answerArtifact is the id of the artifact that holds an agent's answer.
const answerArtifact a2a.ArtifactID = "answer"

// A2AHandler serves the A2A protocol for the gateway's agents: a task is
// a workflow, its context id is the session. Agent is the agent it
// serves; empty (the gRPC transport) takes the agent from AgentHeader or
// the message's AgentMetadataKey, else DefaultAgent.
type A2AHandler struct {
	G            *Gateway
	Agent        string
	DefaultAgent string
}

var _ a2asrv.RequestHandler = (*A2AHandler)(nil)

// agentFor is the agent a new message goes to.
func (h *A2AHandler) agentFor(ctx context.Context, msg *a2a.Message) (string, error) {
	if h.Agent != "" {
		return h.Agent, nil
	}
	if cc, ok := a2asrv.CallContextFrom(ctx); ok && cc.RequestMeta() != nil {
		if v, ok := cc.RequestMeta().Get(AgentHeader); ok && len(v) > 0 && v[0] != "" {
			return v[0], nil
		}
	}
	if s, ok := msg.Metadata[AgentMetadataKey].(string); ok && s != "" {
		return s, nil
	}
	if h.DefaultAgent != "" {
		return h.DefaultAgent, nil
	}
	return "", a2aError(fmt.Errorf("name the agent: the %q header, the message metadata %q, or the JSON-RPC endpoint /a2a/<agent>: %w",
		AgentHeader, AgentMetadataKey, errs.InvalidArgument))
}

// OnSendMessage starts a task (a new message) or continues one (a
// message naming its task id: the answer to an approval, or a message
// to a running task). It waits for the task to end or to need input
// unless the configuration says blocking false.
func (h *A2AHandler) OnSendMessage(ctx context.Context, p *a2a.MessageSendParams) (a2a.SendMessageResult, error) {
	if p == nil || p.Message == nil {
		return nil, a2aError(fmt.Errorf("no message: %w", errs.InvalidArgument))
	}
	blocking := p.Config == nil || p.Config.Blocking == nil || *p.Config.Blocking
	if p.Message.TaskID != "" {
		id, seq, err := h.continueTask(ctx, p.Message)
		if err != nil {
			return nil, a2aError(err)
		}
		if !blocking {
			return h.getTask(ctx, id)
		}
		wf, err := h.G.Follow(ctx, id, FollowOptions{AfterDecision: seq}, nil)
		if err != nil {
			return nil, a2aError(err)
		}
		return taskOf(wf), nil
	}
	acc, err := h.submit(ctx, p.Message)
	if err != nil {
		return nil, a2aError(err)
	}
	if err := h.pushOnSend(ctx, acc.ID, p.Config); err != nil {
		return nil, err
	}
	if !blocking {
		return h.getTask(ctx, acc.ID)
	}
	select {
	case s := <-acc.Settled:
		if s.Err != nil {
			return nil, a2aError(s.Err)
		}
		return taskOf(s.Workflow), nil
	case <-ctx.Done():
		return nil, a2aError(status.FromContextError(ctx.Err()).Err())
	}
}

// submit queues a new message.
func (h *A2AHandler) submit(ctx context.Context, msg *a2a.Message) (*Accepted, error) {
	agent, err := h.agentFor(ctx, msg)
	if err != nil {
		return nil, err
	}
	return h.G.Submit(ctx, Message{Agent: agent, Session: msg.ContextID, Text: textOf(msg.Parts)})
}

// continueTask delivers msg to its task: the decision when it waits for
// approval, else a signal. It returns the decision's sequence (0 for a
// signal).
func (h *A2AHandler) continueTask(ctx context.Context, msg *a2a.Message) (string, uint64, error) {
	id := string(msg.TaskID)
	wf, err := h.G.getWorkflow(ctx, id)
	if err != nil {
		return "", 0, err
	}
	switch wf.GetStatus() {
	case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED:
		approve, reason, err := decisionOf(msg)
		if err != nil {
			return "", 0, err
		}
		seq, err := h.G.Decide(ctx, id, approve, reason, "a2a")
		return id, seq, err
	case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING:
		return "", 0, fmt.Errorf("task %q is still working; send a new message (no taskId, the same contextId) once it has ended: %w", id, errs.FailedPrecondition)
	default:
		return "", 0, fmt.Errorf("task %q has ended (%s); send a new message with the same contextId to go on with the conversation: %w",
			id, StateName(wf.GetStatus()), errs.FailedPrecondition)
	}
}

// decisionOf reads an approval decision from a message: a data part
// {"approved": bool, "reason": "..."}, or text starting with yes,
// approve(d), y or ok (approve) or no, reject(ed), deny, n (reject, the
// rest of the text the reason).
func decisionOf(msg *a2a.Message) (bool, string, error) {
	for _, p := range msg.Parts {
		if d, ok := p.(a2a.DataPart); ok {
			if v, ok := d.Data["approved"].(bool); ok {
				r, _ := d.Data["reason"].(string)
				return v, r, nil
			}
		}
	}
	text := strings.TrimSpace(textOf(msg.Parts))
	word, rest, _ := strings.Cut(text, " ")
	word = strings.ToLower(strings.TrimRight(word, ".:,!"))
	switch word {
	case "yes", "y", "ok", "approve", "approved":
		return true, "", nil
	case "no", "n", "reject", "rejected", "deny", "denied":
		return false, strings.TrimSpace(rest), nil
	}
	return false, "", fmt.Errorf("the task waits for approval: answer \"approve\" or \"reject <reason>\" (or a data part {\"approved\": true|false, \"reason\": \"...\"}), not %q: %w",
		clip(text, 80), errs.InvalidArgument)
}

// OnSendMessageStream is OnSendMessage streamed: the task, then its
// status and the answer's text as it is produced, to the end or until
// it needs input.
func (h *A2AHandler) OnSendMessageStream(ctx context.Context, p *a2a.MessageSendParams) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		if p == nil || p.Message == nil {
			yield(nil, a2aError(fmt.Errorf("no message: %w", errs.InvalidArgument)))
			return
		}
		if p.Message.TaskID != "" {
			id, seq, err := h.continueTask(ctx, p.Message)
			if err != nil {
				yield(nil, a2aError(err))
				return
			}
			info := taskInfo{TaskID: a2a.TaskID(id), ContextID: contextOf(id)}
			if !yield(a2a.NewStatusUpdateEvent(info, a2a.TaskStateWorking, nil), nil) {
				return
			}
			h.stream(ctx, id, seq, yield)
			return
		}
		acc, err := h.submit(ctx, p.Message)
		if err != nil {
			yield(nil, a2aError(err))
			return
		}
		if err := h.pushOnSend(ctx, acc.ID, p.Config); err != nil {
			yield(nil, err)
			return
		}
		msg := *p.Message
		msg.TaskID, msg.ContextID = a2a.TaskID(acc.ID), contextOf(acc.ID)
		task := &a2a.Task{ID: a2a.TaskID(acc.ID), ContextID: contextOf(acc.ID), History: []*a2a.Message{&msg},
			Status: a2a.TaskStatus{State: a2a.TaskStateSubmitted, Timestamp: now()}}
		if !yield(task, nil) {
			return
		}
		select {
		case <-acc.Started:
		case <-ctx.Done():
			return
		}
		if err := acc.StartErr(); err != nil {
			yield(nil, a2aError(err))
			return
		}
		h.stream(ctx, acc.ID, 0, yield)
	}
}

// stream yields task id's progress until it ends or needs input.
func (h *A2AHandler) stream(ctx context.Context, id string, afterDecision uint64, yield func(a2a.Event, error) bool) {
	info := taskInfo{TaskID: a2a.TaskID(id), ContextID: contextOf(id)}
	working, streamed := false, false
	wf, err := h.G.Follow(ctx, id, FollowOptions{Progress: true, AfterDecision: afterDecision}, func(u Update) bool {
		if !working {
			working = true
			if !yield(a2a.NewStatusUpdateEvent(info, a2a.TaskStateWorking, nil), nil) {
				return false
			}
		}
		if u.Text == "" {
			return true
		}
		ev := a2a.NewArtifactUpdateEvent(info, answerArtifact, a2a.TextPart{Text: u.Text})
		ev.Artifact.Name = "answer"
		ev.Append = streamed
		streamed = true
		return yield(ev, nil)
	})
	if err != nil {
		if !errors.Is(err, context.Canceled) || ctx.Err() == nil {
			yield(nil, a2aError(err))
		}
		return
	}
	t := taskOf(wf)
	if !streamed && len(t.Artifacts) > 0 {
		ev := &a2a.TaskArtifactUpdateEvent{TaskID: t.ID, ContextID: t.ContextID, Artifact: t.Artifacts[0], LastChunk: true}
		if !yield(ev, nil) {
			return
		}
	}
	final := &a2a.TaskStatusUpdateEvent{TaskID: t.ID, ContextID: t.ContextID, Status: t.Status, Final: true, Metadata: t.Metadata}
	yield(final, nil)
}

// OnGetTask returns a task: its workflow as it is now, or a message
// still waiting in its lane (submitted).
func (h *A2AHandler) OnGetTask(ctx context.Context, q *a2a.TaskQueryParams) (*a2a.Task, error) {
	if q == nil || q.ID == "" {
		return nil, a2aError(fmt.Errorf("no task id: %w", errs.InvalidArgument))
	}
	return h.getTask(ctx, string(q.ID))
}

func (h *A2AHandler) getTask(ctx context.Context, id string) (*a2a.Task, error) {
	if m, ok := h.G.Queued(id); ok {
		return &a2a.Task{ID: a2a.TaskID(id), ContextID: m.Session, Status: a2a.TaskStatus{State: a2a.TaskStateSubmitted, Timestamp: now()},
			Metadata: map[string]any{"agent": m.Agent, "workflow_id": id}}, nil
	}
	wf, err := h.G.getWorkflow(ctx, id)
	if err != nil {
		return nil, a2aError(err)
	}
	return taskOf(wf), nil
}

// OnCancelTask cancels a task's workflow.
func (h *A2AHandler) OnCancelTask(ctx context.Context, p *a2a.TaskIDParams) (*a2a.Task, error) {
	if p == nil || p.ID == "" {
		return nil, a2aError(fmt.Errorf("no task id: %w", errs.InvalidArgument))
	}
	if h.G.CancelQueued(string(p.ID)) {
		return &a2a.Task{ID: p.ID, ContextID: contextOf(string(p.ID)), Status: a2a.TaskStatus{State: a2a.TaskStateCanceled, Timestamp: now()}}, nil
	}
	resp, err := h.G.orch.CancelWorkflow(ctx, &orchestratorv1.CancelWorkflowRequest{WorkflowId: string(p.ID), Reason: "canceled by an A2A client"})
	if err != nil {
		return nil, a2aError(err)
	}
	wf := resp.GetWorkflow()
	if s := wf.GetStatus(); s == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED || s == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED {
		return nil, &gwError{st: status.Newf(codes.FailedPrecondition, "task %q had already ended (%s)", p.ID, StateName(s)), kind: a2a.ErrTaskNotCancelable}
	}
	return taskOf(wf), nil
}

// OnResubscribeToTask streams a task again from its start: its events
// so far, then live, to the end or until it needs input.
func (h *A2AHandler) OnResubscribeToTask(ctx context.Context, p *a2a.TaskIDParams) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		if p == nil || p.ID == "" {
			yield(nil, a2aError(fmt.Errorf("no task id: %w", errs.InvalidArgument)))
			return
		}
		t, err := h.getTask(ctx, string(p.ID))
		if err != nil {
			yield(nil, err)
			return
		}
		if !yield(t, nil) || t.Status.State.Terminal() || t.Status.State == a2a.TaskStateInputRequired {
			return
		}
		h.stream(ctx, string(p.ID), 0, yield)
	}
}

// OnGetExtendedAgentCard is not supported: the public card is the whole.
func (h *A2AHandler) OnGetExtendedAgentCard(context.Context) (*a2a.AgentCard, error) {
	return nil, a2a.ErrAuthenticatedExtendedCardNotConfigured
}

// AgentCard is agent's A2A card: JSON-RPC at jsonrpcURL (preferred) and,
// when grpcAddr is set, gRPC there (naming the agent in AgentHeader).
func AgentCard(a AgentInfo, jsonrpcURL, grpcAddr string, bearer bool) *a2a.AgentCard {
	desc := a.Description
	if desc == "" {
		desc = "The neuron agent " + a.Name + "."
	}
	card := &a2a.AgentCard{
		Name: a.Name, Description: desc, URL: jsonrpcURL, Version: "1", ProtocolVersion: A2AProtocolVersion,
		PreferredTransport: a2a.TransportProtocolJSONRPC,
		Capabilities:       a2a.AgentCapabilities{Streaming: true},
		DefaultInputModes:  []string{"text/plain"}, DefaultOutputModes: []string{"text/plain"},
		Skills:               []a2a.AgentSkill{{ID: a.Name, Name: a.Name, Description: desc, Tags: []string{"neuron"}}},
		AdditionalInterfaces: []a2a.AgentInterface{{Transport: a2a.TransportProtocolJSONRPC, URL: jsonrpcURL}},
		Provider:             &a2a.AgentProvider{Org: "neuron", URL: jsonrpcURL},
	}
	if grpcAddr != "" {
		card.AdditionalInterfaces = append(card.AdditionalInterfaces, a2a.AgentInterface{Transport: a2a.TransportProtocolGRPC, URL: grpcAddr})
	}
	if bearer {
		card.SecuritySchemes = a2a.NamedSecuritySchemes{"bearer": a2a.HTTPAuthSecurityScheme{Scheme: "Bearer"}}
		card.Security = []a2a.SecurityRequirements{{"bearer": a2a.SecuritySchemeScopes{}}}
	}
	return card
}

// taskOf is workflow wf as an A2A task.
func taskOf(wf *orchestratorv1.Workflow) *a2a.Task {
	id := wf.GetWorkflowId()
	t := &a2a.Task{ID: a2a.TaskID(id), ContextID: contextOf(id), Metadata: map[string]any{
		"workflow_id": id, "agent": wf.GetRootAgentId(), "steps": float64(wf.GetSteps()), "spent": wf.GetSpent().GetAmount(),
	}}
	info := taskInfo{TaskID: t.ID, ContextID: t.ContextID}
	ts := now()
	if u := wf.GetUpdateTime(); u != nil {
		tt := u.AsTime()
		ts = &tt
	}
	t.Status.Timestamp = ts
	answer := Answer(wf)
	switch wf.GetStatus() {
	case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING:
		t.Status.State = a2a.TaskStateWorking
	case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED:
		t.Status.State = a2a.TaskStateInputRequired
		var calls []any
		var names []string
		for _, p := range wf.GetPendingApprovals() {
			tc := p.GetToolCall()
			in, _ := json.Marshal(tc.GetInput().AsInterface())
			names = append(names, fmt.Sprintf("%s(%s)", tc.GetName(), clip(string(in), 200)))
			calls = append(calls, map[string]any{"tool_use_id": tc.GetToolUseId(), "name": tc.GetName(), "input": tc.GetInput().AsInterface(), "reason": tc.GetReason()})
		}
		text := fmt.Sprintf("waiting for approval of %s: answer \"approve\" or \"reject <reason>\" in a message with this taskId", strings.Join(names, ", "))
		t.Status.Message = a2a.NewMessageForTask(a2a.MessageRoleAgent, info, a2a.TextPart{Text: text}, a2a.DataPart{Data: map[string]any{"pending_approvals": calls}})
	case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED:
		t.Status.State = a2a.TaskStateCompleted
		t.Status.Message = a2a.NewMessageForTask(a2a.MessageRoleAgent, info, a2a.TextPart{Text: answer})
		t.Artifacts = []*a2a.Artifact{{ID: answerArtifact, Name: "answer", Parts: a2a.ContentParts{a2a.TextPart{Text: answer}}}}
	case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED:
		t.Status.State = a2a.TaskStateFailed
		t.Status.Message = a2a.NewMessageForTask(a2a.MessageRoleAgent, info, a2a.TextPart{Text: wf.GetFailure().GetMessage()})
	case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED:
		t.Status.State = a2a.TaskStateCanceled
	default:
		t.Status.State = a2a.TaskStateUnknown
	}
	return t
}

// contextOf is the context id (session) of task id.
func contextOf(id string) string {
	if s := SessionOf(id); s != "" {
		return s
	}
	return id
}

// textOf joins the text parts of parts.
func textOf(parts a2a.ContentParts) string {
	var b strings.Builder
	for _, p := range parts {
		switch t := p.(type) {
		case a2a.TextPart:
			if b.Len() > 0 {
				b.WriteString("\n")
			}
			b.WriteString(t.Text)
		case *a2a.TextPart:
			if b.Len() > 0 {
				b.WriteString("\n")
			}
			b.WriteString(t.Text)
		}
	}
	return b.String()
}

func now() *time.Time {
	t := time.Now().UTC()
	return &t
}

// gwError is an error both A2A transports report faithfully: gRPC by its
// status, JSON-RPC by the A2A error kind (its message in the error's
// data).
type gwError struct {
	st   *status.Status
	kind error
}

func (e *gwError) Error() string              { return e.st.Message() }
func (e *gwError) GRPCStatus() *status.Status { return e.st }
func (e *gwError) Unwrap() error              { return e.kind }

// a2aError converts an error of the gateway or the orchestrator.
func a2aError(err error) error {
	if err == nil {
		return nil
	}
	var ge *gwError
	if errors.As(err, &ge) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		st = status.New(errs.Code(err), err.Error())
	}
	var kind error
	switch st.Code() {
	case codes.NotFound:
		kind = a2a.ErrTaskNotFound
	case codes.InvalidArgument:
		kind = a2a.ErrInvalidParams
	case codes.FailedPrecondition:
		kind = a2a.ErrInvalidRequest
	case codes.Unimplemented:
		kind = a2a.ErrUnsupportedOperation
	default:
		kind = a2a.ErrServerError
	}
	return &gwError{st: st, kind: kind}
}

// taskInfo names a task for the SDK's event constructors.
type taskInfo a2a.TaskInfo

func (t taskInfo) TaskInfo() a2a.TaskInfo { return a2a.TaskInfo(t) }
