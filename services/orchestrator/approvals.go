package orchestrator

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
)

// Tool approvals. An operator that stops before tool calls needing a
// person's approval exits SUSPENDED listing them (Suspension.tool_calls);
// the workflow suspends with it. DecideApprovals checks the decisions
// against that list and delivers them as a signal of type
// ApprovalSignal, which the engines journal before the call returns (a
// SIGKILL afterwards loses nothing) and which resumes the workflow: the
// resuming input carries them as Resume.tool_decisions (prepareInput).
// The signal's idempotency key is derived from the suspension's resume
// token, so one suspension is decided once, whoever decides first (a
// person, or the approval timeout of any replica).

// ApprovalSignal is the signal type of a DecideApprovals decision.
const ApprovalSignal = "approval"

// approvalKey is the idempotency key of the decision on the suspension
// with resume token token.
func approvalKey(token string) string {
	sum := sha256.Sum256([]byte(token))
	return "approval/" + hex.EncodeToString(sum[:16])
}

// approvalPayload is the signal that carries decisions.
func approvalPayload(decisions []*operatorv1.ToolDecision) (*typesv1.SignalPayload, error) {
	list := make([]*structpb.Value, len(decisions))
	for i, d := range decisions {
		b, err := protojson.Marshal(d)
		if err != nil {
			return nil, err
		}
		v := &structpb.Value{}
		if err := protojson.Unmarshal(b, v); err != nil {
			return nil, err
		}
		list[i] = v
	}
	data := structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
		"decisions": structpb.NewListValue(&structpb.ListValue{Values: list}),
	}})
	return &typesv1.SignalPayload{SignalType: ApprovalSignal, Data: data}, nil
}

// DecisionsOf returns the decisions an approval signal carries.
func DecisionsOf(p *typesv1.SignalPayload) ([]*operatorv1.ToolDecision, error) {
	if p.GetSignalType() != ApprovalSignal {
		return nil, fmt.Errorf("signal type %q is not %q", p.GetSignalType(), ApprovalSignal)
	}
	var out []*operatorv1.ToolDecision
	for _, v := range p.GetData().GetStructValue().GetFields()["decisions"].GetListValue().GetValues() {
		b, err := protojson.Marshal(v)
		if err != nil {
			return nil, err
		}
		d := &operatorv1.ToolDecision{}
		if err := protojson.Unmarshal(b, d); err != nil {
			return nil, fmt.Errorf("a decision of the approval signal is malformed: %v", err)
		}
		out = append(out, d)
	}
	return out, nil
}

// pendingOf lists the tool calls a workflow waits on.
func (s *Server) pendingOf(wf *Workflow) []*orchestratorv1.PendingApproval {
	if wf.Status != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED || wf.Asking != "" {
		return nil // waiting for a raise: its tool calls were decided
	}
	calls := wf.LastOutput.GetExitReason().GetSuspension().GetToolCalls()
	if len(calls) == 0 {
		return nil
	}
	out := make([]*orchestratorv1.PendingApproval, len(calls))
	for i, c := range calls {
		p := &orchestratorv1.PendingApproval{WorkflowId: wf.ID, AgentId: wf.CurrentAgent, Step: uint64(wf.Steps), ToolCall: c,
			RequestTime: timestamppb.New(wf.Updated)}
		if s.approvalTimeout > 0 {
			p.Deadline = timestamppb.New(wf.Updated.Add(s.approvalTimeout))
		}
		out[i] = p
	}
	return out
}

// ListApprovals implements OrchestratorService.ListApprovals. It reads
// every suspended workflow (the engines index workflows by status), so
// its cost grows with the number of suspended workflows, not of all.
func (s *Server) ListApprovals(ctx context.Context, req *orchestratorv1.ListApprovalsRequest) (*orchestratorv1.ListApprovalsResponse, error) {
	size, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, err
	}
	offset := 0
	if t := req.GetPageToken(); t != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(t, "a"))
		if err != nil || n < 0 || !strings.HasPrefix(t, "a") {
			return nil, fmt.Errorf("page_token: not one this server issued: %w", errs.InvalidArgument)
		}
		offset = n
	}
	var all []*orchestratorv1.PendingApproval
	if id := req.GetWorkflowId(); id != "" {
		wf, err := s.e.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		all = s.waitingOf(wf)
	} else if all, err = s.allPending(ctx, s.waitingOf); err != nil {
		return nil, err
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].GetRequestTime().AsTime().Before(all[j].GetRequestTime().AsTime()) })
	resp := &orchestratorv1.ListApprovalsResponse{}
	if offset < len(all) {
		end := min(offset+size, len(all))
		resp.Approvals = all[offset:end]
		if end < len(all) {
			resp.NextPageToken = "a" + strconv.Itoa(end)
		}
	}
	return resp, nil
}

// waitingOf lists what a workflow waits on a person for: the tool calls
// it waits on, or the raise of a limit it reached.
func (s *Server) waitingOf(wf *Workflow) []*orchestratorv1.PendingApproval {
	if r := limitRequestOf(wf); r != nil {
		return []*orchestratorv1.PendingApproval{{WorkflowId: wf.ID, AgentId: r.GetAgentId(), Step: uint64(wf.Steps),
			RequestTime: timestamppb.New(wf.Updated), LimitRequest: r}}
	}
	return s.pendingOf(wf)
}

// allPending lists the pending approvals of every suspended workflow, as
// of lists them.
func (s *Server) allPending(ctx context.Context, of func(*Workflow) []*orchestratorv1.PendingApproval) ([]*orchestratorv1.PendingApproval, error) {
	var all []*orchestratorv1.PendingApproval
	token := ""
	for {
		wfs, next, err := s.e.List(ctx, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED, 1000, token)
		if err != nil {
			return nil, err
		}
		for _, wf := range wfs {
			if wf.LastOutput == nil {
				// A listing from an external store (Temporal's
				// visibility) has no outputs: read the workflow.
				full, err := s.e.Get(ctx, wf.ID)
				if err != nil {
					continue // ended or gone meanwhile
				}
				wf = full
			}
			all = append(all, of(wf)...)
		}
		if next == "" {
			return all, nil
		}
		token = next
	}
}

// DecideApprovals implements OrchestratorService.DecideApprovals.
func (s *Server) DecideApprovals(ctx context.Context, req *orchestratorv1.DecideApprovalsRequest) (*orchestratorv1.DecideApprovalsResponse, error) {
	id := req.GetWorkflowId()
	payload, err := approvalPayload(req.GetDecisions())
	if err != nil {
		return nil, fmt.Errorf("decisions: %v: %w", err, errs.InvalidArgument)
	}
	wf, err := s.e.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	pending := s.pendingOf(wf)
	if len(pending) == 0 {
		// A retry of a decision already taken finds the workflow moved on.
		if seq, ok := s.decidedBefore(ctx, id, payload); ok {
			return &orchestratorv1.DecideApprovalsResponse{Sequence: seq, Duplicate: true}, nil
		}
		return nil, fmt.Errorf("workflow %q is %s and waits for no approval: %w", id, StatusName(wf.Status), errs.FailedPrecondition)
	}
	if err := checkDecisions(pending, req.GetDecisions()); err != nil {
		return nil, err
	}
	raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(payload)
	if err != nil {
		return nil, err
	}
	token := wf.LastOutput.GetExitReason().GetSuspension().GetResumeToken()
	seq, dup, err := s.e.Signal(ctx, id, raw, approvalKey(token))
	if err != nil {
		return nil, err
	}
	if dup {
		if prev, ok := s.decidedBefore(ctx, id, payload); !ok || prev != seq {
			return nil, fmt.Errorf("the tool calls of workflow %q were already decided differently (decision #%d): %w", id, seq, errs.FailedPrecondition)
		}
	}
	return &orchestratorv1.DecideApprovalsResponse{Sequence: seq, Duplicate: dup}, nil
}

// decidedBefore finds an approval signal of workflow id equal to payload.
func (s *Server) decidedBefore(ctx context.Context, id string, payload *typesv1.SignalPayload) (uint64, bool) {
	sigs, err := s.e.Signals(ctx, id)
	if err != nil {
		return 0, false
	}
	for i := len(sigs) - 1; i >= 0; i-- {
		p := &typesv1.SignalPayload{}
		if proto.Unmarshal(sigs[i].Payload, p) == nil && p.GetSignalType() == ApprovalSignal && proto.Equal(p, payload) {
			return sigs[i].Seq, true
		}
	}
	return 0, false
}

// checkDecisions checks that decisions decide each pending call once,
// and nothing else.
func checkDecisions(pending []*orchestratorv1.PendingApproval, decisions []*operatorv1.ToolDecision) error {
	want := map[string]bool{}
	for _, p := range pending {
		want[p.GetToolCall().GetToolUseId()] = true
	}
	seen := map[string]bool{}
	for i, d := range decisions {
		id := d.GetToolUseId()
		switch {
		case !want[id]:
			return fmt.Errorf("decisions[%d]: tool_use_id %q is not a call this workflow waits on (pending: %s): %w", i, id, ids(pending), errs.InvalidArgument)
		case seen[id]:
			return fmt.Errorf("decisions[%d]: tool_use_id %q is decided twice: %w", i, id, errs.InvalidArgument)
		case !d.GetApproved() && d.GetEditedInput() != nil:
			return fmt.Errorf("decisions[%d]: edited_input is for an approval; tool_use_id %q is rejected: %w", i, id, errs.InvalidArgument)
		}
		seen[id] = true
	}
	var missing []string
	for _, p := range pending {
		if id := p.GetToolCall().GetToolUseId(); !seen[id] {
			missing = append(missing, fmt.Sprintf("%s (%s)", id, p.GetToolCall().GetName()))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("every pending call must be decided in one request; undecided: %s: %w", strings.Join(missing, ", "), errs.InvalidArgument)
	}
	return nil
}

func ids(pending []*orchestratorv1.PendingApproval) string {
	var out []string
	for _, p := range pending {
		out = append(out, p.GetToolCall().GetToolUseId())
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// RunApprovalTimeouts decides, with the server's default decision, the
// approvals left waiting past the approval timeout, until ctx ends. It
// does nothing without a timeout. Every replica may run it: a suspension
// is decided once (the decision's idempotency key), whoever is first.
func (s *Server) RunApprovalTimeouts(ctx context.Context) {
	if s.approvalTimeout <= 0 {
		return
	}
	tick := min(max(s.approvalTimeout/4, 100*time.Millisecond), 10*time.Second)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.timeOut(ctx)
	}
}

// timeOut decides the approvals past their deadline.
func (s *Server) timeOut(ctx context.Context) {
	all, err := s.allPending(ctx, s.pendingOf)
	if err != nil {
		return
	}
	byWorkflow := map[string][]*operatorv1.ToolDecision{}
	var order []string
	now := time.Now()
	for _, p := range all {
		if p.GetDeadline() == nil || p.GetDeadline().AsTime().After(now) {
			continue
		}
		if byWorkflow[p.WorkflowId] == nil {
			order = append(order, p.WorkflowId)
		}
		byWorkflow[p.WorkflowId] = append(byWorkflow[p.WorkflowId], &operatorv1.ToolDecision{
			ToolUseId: p.GetToolCall().GetToolUseId(), Approved: s.approvalDefault, DecidedBy: "timeout",
			Reason: fmt.Sprintf("no decision within the approval timeout of %s", s.approvalTimeout),
		})
	}
	for _, id := range order {
		_, err := s.DecideApprovals(ctx, &orchestratorv1.DecideApprovalsRequest{WorkflowId: id, Decisions: byWorkflow[id]})
		if err != nil && s.log != nil && errs.Code(err) != errs.Code(errs.FailedPrecondition) {
			s.log.Warn("the approval timeout could not decide", "workflow_id", id, "err", err)
		}
	}
}

// SignalType is the signal_type of a SignalPayload in its binary form
// ("" when it does not decode), for the orchestrator.signal.accepted
// event.
func SignalType(payload []byte) string {
	p := &typesv1.SignalPayload{}
	if proto.Unmarshal(payload, p) != nil {
		return ""
	}
	return p.GetSignalType()
}
