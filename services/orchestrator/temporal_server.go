package orchestrator

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/shopspring/decimal"
	"go.opentelemetry.io/otel/propagation"
	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/money"
)

// A Dispatch waiting on a Temporal workflow looks for a suspension
// (visible in the memo) first after suspendPoll, then less and less
// often, up to suspendPollMax; a completion arrives at once.
const (
	suspendPoll    = 100 * time.Millisecond
	suspendPollMax = 2 * time.Second
)

// cancelWait bounds how long CancelWorkflow waits to report the
// cancelled workflow.
const cancelWait = 5 * time.Second

// TemporalServer implements orchestratorv1.OrchestratorServiceServer over
// the Temporal backend, with the bbolt Server's semantics.
type TemporalServer struct {
	orchestratorv1.UnimplementedOrchestratorServiceServer
	t *Temporal
}

// NewTemporalServer returns a server over t.
func NewTemporalServer(t *Temporal) *TemporalServer { return &TemporalServer{t: t} }

// start starts (or finds) a workflow.
func (s *TemporalServer) start(ctx context.Context, wfID, agentID string, in *operatorv1.OperatorInput, b *typesv1.Money, detached bool) (string, bool, error) {
	req, err := newStartRequest(wfID, agentID, in, b, detached)
	if err != nil {
		return "", false, err
	}
	agent, err := s.t.reg.Lookup(agentID)
	if err != nil {
		return "", false, err
	}
	if req.WorkflowID == "" {
		req.WorkflowID = newWorkflowID()
	}
	budget := req.Budget
	if !budget.Valid {
		budget = agent.Defaults.Budget
	}
	input, err := proto.Marshal(req.Input)
	if err != nil {
		return "", false, fmt.Errorf("input: %v: %w", err, errs.InvalidArgument)
	}
	e := s.t.opts.Engine
	args := twInput{RootAgent: agent.ID, Input: input, Trace: map[string]string{},
		MaxDepth: e.MaxDepth, MaxSteps: e.MaxSteps, WarnFraction: e.WarnFraction.String()}
	if budget.Valid {
		args.Budget = budget.Decimal.String()
	}
	if dl, ok := ctx.Deadline(); ok && !detached {
		args.Deadline = dl
	}
	propagation.TraceContext{}.Inject(ctx, propagation.MapCarrier(args.Trace))
	fp := req.fingerprint()
	opts := client.StartWorkflowOptions{
		ID: req.WorkflowID, TaskQueue: s.t.opts.TaskQueue,
		WorkflowIDReusePolicy:                    enumspb.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
		WorkflowIDConflictPolicy:                 enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL,
		WorkflowExecutionErrorWhenAlreadyStarted: true,
		Memo: map[string]any{memoFingerprint: fp, memoRootAgent: agent.ID, memoBudget: args.Budget,
			memoStatus: statusName(orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING), memoAgent: agent.ID},
	}
	_, err = s.t.c.ExecuteWorkflow(context.WithoutCancel(ctx), opts, twName, args)
	var started *serviceerror.WorkflowExecutionAlreadyStarted
	if errors.As(err, &started) {
		d, err := s.t.c.DescribeWorkflowExecution(ctx, req.WorkflowID, "")
		if err != nil {
			return "", false, temporalErr(err, req.WorkflowID)
		}
		memo := memoOf(d.GetWorkflowExecutionInfo().GetMemo())
		if memo[memoFingerprint] != fp {
			return "", true, fmt.Errorf("workflow %q already exists with a different request (agent %q); use a new workflow_id: %w",
				req.WorkflowID, memo[memoRootAgent], errs.AlreadyExists)
		}
		return req.WorkflowID, true, nil
	}
	if err != nil {
		return "", false, temporalErr(err, req.WorkflowID)
	}
	s.t.event(req.WorkflowID, agent.ID, "orchestrator.workflow.started", map[string]any{"agent_id": agent.ID, "detached": detached})
	return req.WorkflowID, false, nil
}

// event publishes an orchestrator event.
func (t *Temporal) event(workflowID, agentID, eventType string, data map[string]any) {
	t.publish(observable(workflowID, agentID, eventType, data))
}

// memoOf decodes a workflow memo's string and number fields.
func memoOf(m *commonpb.Memo) map[string]any {
	out := map[string]any{}
	dc := converter.GetDefaultDataConverter()
	for k, p := range m.GetFields() {
		var v any
		if dc.FromPayload(p, &v) == nil {
			out[k] = v
		}
	}
	return out
}

// Dispatch implements OrchestratorService.Dispatch.
func (s *TemporalServer) Dispatch(ctx context.Context, req *orchestratorv1.DispatchRequest) (*orchestratorv1.DispatchResponse, error) {
	id, existed, err := s.start(ctx, req.GetWorkflowId(), req.GetAgentId(), req.GetInput(), req.GetBudget(), false)
	if err != nil {
		return nil, err
	}
	res, err := s.wait(ctx, id)
	if err != nil {
		if errors.Is(ctx.Err(), context.Canceled) && !existed && !deadlineNear(ctx) {
			// The caller gave up: its workflow stops with it.
			_ = s.t.cancel(context.WithoutCancel(ctx), id, "the Dispatch caller cancelled the call")
		}
		return nil, err
	}
	return s.response(ctx, id, res)
}

// wait returns the workflow's view once it has ended or suspended.
func (s *TemporalServer) wait(ctx context.Context, id string) (*twResult, error) {
	done := make(chan error, 1)
	var res twResult
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { done <- s.t.c.GetWorkflow(wctx, id, "").Get(wctx, &res) }()
	poll := suspendPoll
	tick := time.NewTimer(poll)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err != nil {
				if ctx.Err() != nil || deadlineNear(ctx) && isTemporalDeadline(err) {
					<-ctx.Done()
					return nil, context.Cause(ctx)
				}
				return nil, workflowErr(err, id)
			}
			return &res, nil
		case <-tick.C:
			poll = min(2*poll, suspendPollMax)
			tick.Reset(poll)
			d, err := s.t.c.DescribeWorkflowExecution(ctx, id, "")
			if err != nil {
				continue
			}
			info := d.GetWorkflowExecutionInfo()
			if info.GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING &&
				memoOf(info.GetMemo())[memoStatus] == statusName(orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED) {
				return s.t.result(ctx, id)
			}
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// isTemporalDeadline says whether the Temporal client gave up on the
// caller's deadline, which it may report a moment before ctx does.
func isTemporalDeadline(err error) bool {
	var d *serviceerror.DeadlineExceeded
	return errors.As(err, &d) || errors.Is(err, context.DeadlineExceeded)
}

// workflowErr converts a failed workflow's error to the status it ended
// with.
func workflowErr(err error, id string) error {
	var app *temporal.ApplicationError
	if errors.As(err, &app) && app.Type() == errTypeWorkflow {
		var f failure
		if app.Details(&f) == nil {
			return f.err()
		}
	}
	var canceled *temporal.CanceledError
	if errors.As(err, &canceled) {
		reason := "cancelled"
		var r string
		if canceled.HasDetails() && canceled.Details(&r) == nil && r != "" {
			reason = r
		}
		return fmt.Errorf("workflow %q was cancelled: %s: %w", id, reason, errs.Canceled)
	}
	var terminated *temporal.TerminatedError
	if errors.As(err, &terminated) {
		return fmt.Errorf("workflow %q was terminated through Temporal: %w", id, errs.FailedPrecondition)
	}
	var timeout *temporal.TimeoutError
	if errors.As(err, &timeout) {
		return fmt.Errorf("workflow %q timed out in Temporal: %w", id, errs.DeadlineExceeded)
	}
	return temporalErr(err, id)
}

// result asks a workflow for its view of itself.
func (t *Temporal) result(ctx context.Context, id string) (*twResult, error) {
	v, err := t.c.QueryWorkflow(ctx, id, "", twQueryResult)
	if err != nil {
		return nil, queryErr(ctx, err, id)
	}
	var res twResult
	if err := v.Get(&res); err != nil {
		return nil, fmt.Errorf("the view of workflow %q: %v: %w", id, err, errs.Internal)
	}
	return &res, nil
}

// response builds a DispatchResponse from a workflow that stopped.
func (s *TemporalServer) response(ctx context.Context, id string, res *twResult) (*orchestratorv1.DispatchResponse, error) {
	if res.Failure != nil {
		return nil, res.Failure.err()
	}
	spent, _ := decimal.NewFromString(res.Spent)
	resp := &orchestratorv1.DispatchResponse{WorkflowId: id, TotalCost: money.FromDecimal(spent)}
	if res.LastStep != 0 {
		out, err := mustOutput(ctx, s.t.state, id, res.LastStep)
		if err != nil {
			return nil, err
		}
		resp.Output = out
	}
	for _, st := range res.StepList {
		for _, key := range st.Effects {
			o := &orchestratorv1.EffectOutcome{IdempotencyKey: key}
			if r, ok := res.Outcomes[key]; ok {
				o.Applied, o.Detail = r.Applied, r.Detail
			} else {
				o.Detail = "not executed: the workflow stopped first"
			}
			resp.Effects = append(resp.Effects, o)
		}
	}
	return resp, nil
}

// DispatchMany implements OrchestratorService.DispatchMany.
func (s *TemporalServer) DispatchMany(ctx context.Context, req *orchestratorv1.DispatchManyRequest) (*orchestratorv1.DispatchManyResponse, error) {
	return dispatchMany(ctx, req, s.t.opts.Engine.Workers, s.Dispatch)
}

// Signal implements OrchestratorService.Signal.
func (s *TemporalServer) Signal(ctx context.Context, req *orchestratorv1.SignalRequest) (*orchestratorv1.SignalResponse, error) {
	if req.GetSignal() == nil {
		return nil, fmt.Errorf("signal is required: %w", errs.InvalidArgument)
	}
	payload, err := proto.Marshal(req.GetSignal())
	if err != nil {
		return nil, fmt.Errorf("signal: %v: %w", err, errs.InvalidArgument)
	}
	seq, dup, err := s.t.signal(ctx, req.GetWorkflowId(), payload, req.GetIdempotencyKey())
	if err != nil {
		return nil, err
	}
	if !dup {
		s.t.event(req.GetWorkflowId(), "", "orchestrator.signal.accepted", map[string]any{"sequence": seq})
	}
	return &orchestratorv1.SignalResponse{Sequence: seq, Duplicate: dup}, nil
}

// view is a workflow as the service shows it: its own view, corrected
// by Temporal's status when it ended outside the workflow's code.
func (t *Temporal) view(ctx context.Context, id string) (*twResult, *record, error) {
	d, err := t.c.DescribeWorkflowExecution(ctx, id, "")
	if err != nil {
		return nil, nil, temporalErr(err, id)
	}
	info := d.GetWorkflowExecutionInfo()
	res, err := t.result(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	rec := recordOf(id, info.GetStatus(), memoOf(info.GetMemo()), info.GetStartTime().AsTime(), info.GetCloseTime().AsTime())
	rec.Status = statusFrom(info.GetStatus(), res.Status)
	rec.CurrentAgent = res.CurrentAgent
	rec.Steps = res.Steps
	rec.Spent, _ = decimal.NewFromString(res.Spent)
	rec.Pending = res.Pending
	rec.Failure = res.Failure
	if rec.Failure == nil && terminal(rec.Status) && rec.Status != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED {
		rec.Failure = &failure{Code: int32(errs.Code(errs.FailedPrecondition)), Message: "ended in Temporal as " + info.GetStatus().String()}
	}
	if res.LastStep != 0 {
		out, err := mustOutput(ctx, t.state, id, res.LastStep)
		if err != nil {
			return nil, nil, err
		}
		if rec.LastOutput, err = proto.Marshal(out); err != nil {
			return nil, nil, err
		}
	}
	return res, rec, nil
}

// statusFrom is the workflow's status: its own while Temporal runs it,
// Temporal's once it ended.
func statusFrom(s enumspb.WorkflowExecutionStatus, own string) orchestratorv1.WorkflowStatus {
	switch s {
	case enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED:
		return orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED
	case enumspb.WORKFLOW_EXECUTION_STATUS_CANCELED:
		return orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED
	case enumspb.WORKFLOW_EXECUTION_STATUS_FAILED, enumspb.WORKFLOW_EXECUTION_STATUS_TERMINATED, enumspb.WORKFLOW_EXECUTION_STATUS_TIMED_OUT:
		return orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED
	}
	if own == statusName(orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED) {
		return orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED
	}
	return orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING
}

// recordOf is a workflow's record from what Temporal lists.
func recordOf(id string, s enumspb.WorkflowExecutionStatus, memo map[string]any, created, closed time.Time) *record {
	str := func(k string) string { v, _ := memo[k].(string); return v }
	rec := &record{ID: id, RootAgent: str(memoRootAgent), CurrentAgent: str(memoAgent), Created: created, Updated: created}
	rec.Status = statusFrom(s, str(memoStatus))
	if !closed.IsZero() && closed.Unix() > 0 {
		rec.Updated = closed
	}
	if n, ok := memo[memoSteps].(float64); ok {
		rec.Steps = uint32(n)
	}
	rec.Spent, _ = decimal.NewFromString(str(memoSpent))
	if b := str(memoBudget); b != "" {
		if d, err := decimal.NewFromString(b); err == nil {
			rec.Budget = decimal.NewNullDecimal(d)
		}
	}
	return rec
}

// Query implements OrchestratorService.Query.
func (s *TemporalServer) Query(ctx context.Context, req *orchestratorv1.QueryRequest) (*orchestratorv1.QueryResponse, error) {
	typ := req.GetQueryType()
	switch typ {
	case "status", "steps", "signals":
	default:
		return nil, fmt.Errorf("unknown query_type %q; this orchestrator answers %v: %w", typ, queryTypes, errs.InvalidArgument)
	}
	res, rec, err := s.t.view(ctx, req.GetWorkflowId())
	if err != nil {
		return nil, err
	}
	var v any
	switch typ {
	case "status":
		v, err = statusView(rec)
	case "steps":
		v = temporalSteps(res)
	case "signals":
		v = signalsView(res.Signals)
	}
	if err != nil {
		return nil, err
	}
	return queryResponse(v)
}

// temporalSteps is the steps query of a Temporal workflow.
func temporalSteps(res *twResult) []any {
	list := make([]any, 0, len(res.StepList))
	for _, st := range res.StepList {
		item := map[string]any{
			"step": float64(st.N), "dispatch_id": st.Dispatch, "agent": st.Agent, "depth": float64(st.Depth),
			"trigger": st.Trigger, "started": st.Started.UTC().Format("2006-01-02T15:04:05.000Z07:00"), "state": st.State,
		}
		if len(st.Signals) > 0 {
			seqs := make([]any, len(st.Signals))
			for i, s := range st.Signals {
				seqs[i] = float64(s)
			}
			item["signals"] = seqs
		}
		switch st.State {
		case "failed":
			item["error"] = st.Error
		case "done":
			item["exit"] = st.Exit
			item["cost"] = st.Cost
			item["effects"] = float64(len(st.Effects))
		}
		list = append(list, item)
	}
	return list
}

// StartWorkflow implements OrchestratorService.StartWorkflow.
func (s *TemporalServer) StartWorkflow(ctx context.Context, req *orchestratorv1.StartWorkflowRequest) (*orchestratorv1.StartWorkflowResponse, error) {
	id, existed, err := s.start(context.WithoutCancel(ctx), req.GetWorkflowId(), req.GetAgentId(), req.GetInput(), req.GetBudget(), true)
	if err != nil {
		return nil, err
	}
	return &orchestratorv1.StartWorkflowResponse{WorkflowId: id, AlreadyStarted: existed}, nil
}

// GetWorkflow implements OrchestratorService.GetWorkflow.
func (s *TemporalServer) GetWorkflow(ctx context.Context, req *orchestratorv1.GetWorkflowRequest) (*orchestratorv1.GetWorkflowResponse, error) {
	_, rec, err := s.t.view(ctx, req.GetWorkflowId())
	if err != nil {
		return nil, err
	}
	wf, err := toWorkflow(rec)
	if err != nil {
		return nil, err
	}
	return &orchestratorv1.GetWorkflowResponse{Workflow: wf}, nil
}

// cancel asks Temporal to cancel a workflow, telling it why first.
func (t *Temporal) cancel(ctx context.Context, id, reason string) error {
	if err := t.c.SignalWorkflow(ctx, id, "", twCancelSignal, reason); err != nil {
		return temporalErr(err, id)
	}
	if err := t.c.CancelWorkflow(ctx, id, ""); err != nil {
		return temporalErr(err, id)
	}
	return nil
}

// CancelWorkflow implements OrchestratorService.CancelWorkflow.
func (s *TemporalServer) CancelWorkflow(ctx context.Context, req *orchestratorv1.CancelWorkflowRequest) (*orchestratorv1.CancelWorkflowResponse, error) {
	id := req.GetWorkflowId()
	reason := req.GetReason()
	if reason == "" {
		reason = "cancelled by a caller"
	}
	d, err := s.t.c.DescribeWorkflowExecution(ctx, id, "")
	if err != nil {
		return nil, temporalErr(err, id)
	}
	if d.GetWorkflowExecutionInfo().GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
		if err := s.t.cancel(ctx, id, reason); err != nil && !errors.Is(err, errs.FailedPrecondition) {
			return nil, err
		}
		// Report the workflow once it has stopped, if that is soon.
		wctx, stop := context.WithTimeout(ctx, cancelWait)
		_ = s.t.c.GetWorkflow(wctx, id, "").Get(wctx, nil)
		stop()
	}
	_, rec, err := s.t.view(ctx, id)
	if err != nil {
		return nil, err
	}
	if !terminal(rec.Status) {
		// The worker has not acted on it yet; Temporal will.
		rec.Status = orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED
		rec.Failure = &failure{Code: int32(errs.Code(errs.Canceled)), Message: reason}
	}
	wf, err := toWorkflow(rec)
	if err != nil {
		return nil, err
	}
	return &orchestratorv1.CancelWorkflowResponse{Workflow: wf}, nil
}

// errBadToken is a ListWorkflows page token Temporal does not take.
var errBadToken = fmt.Errorf("page_token is not one this orchestrator issued for this status filter (or it expired); start again without one: %w", errs.InvalidArgument)

// ListWorkflows implements OrchestratorService.ListWorkflows, from
// Temporal's visibility store: newest first, with each workflow's memo
// (status, agent, steps, spent as of its last step). RUNNING and
// SUSPENDED are both Temporal's Running, told apart by the memo, so
// their pages may hold fewer than page_size workflows.
func (s *TemporalServer) ListWorkflows(ctx context.Context, req *orchestratorv1.ListWorkflowsRequest) (*orchestratorv1.ListWorkflowsResponse, error) {
	size, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, err
	}
	// A page token is the status it lists, then Temporal's token.
	want := req.GetStatus()
	var token []byte
	if t := req.GetPageToken(); t != "" {
		raw, err := base64.RawURLEncoding.DecodeString(t)
		// Only the token as issued: the decoder skips line breaks.
		if err != nil || base64.RawURLEncoding.EncodeToString(raw) != t || len(raw) < 2 || orchestratorv1.WorkflowStatus(raw[0]) != want {
			return nil, errBadToken
		}
		token = raw[1:]
	}
	q := fmt.Sprintf("WorkflowType = '%s'", twName)
	switch want {
	case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_UNSPECIFIED:
	case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED:
		q += " AND ExecutionStatus = 'Running'"
	case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED:
		q += " AND ExecutionStatus = 'Completed'"
	case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED:
		q += " AND ExecutionStatus = 'Canceled'"
	case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED:
		q += " AND ExecutionStatus IN ('Failed', 'Terminated', 'TimedOut')"
	default:
		return nil, fmt.Errorf("status %v is not a workflow status: %w", want, errs.InvalidArgument)
	}
	resp, err := s.t.c.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{PageSize: int32(size), NextPageToken: token, Query: q})
	if err != nil {
		var invalid *serviceerror.InvalidArgument
		var internal *serviceerror.Internal
		if token != nil && (errors.As(err, &invalid) || errors.As(err, &internal)) {
			return nil, errBadToken
		}
		return nil, temporalErr(err, "")
	}
	out := &orchestratorv1.ListWorkflowsResponse{}
	if len(resp.GetNextPageToken()) > 0 {
		out.NextPageToken = base64.RawURLEncoding.EncodeToString(append([]byte{byte(want)}, resp.GetNextPageToken()...))
	}
	for _, e := range resp.GetExecutions() {
		rec := recordOf(e.GetExecution().GetWorkflowId(), e.GetStatus(), memoOf(e.GetMemo()), e.GetStartTime().AsTime(), e.GetCloseTime().AsTime())
		if want != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_UNSPECIFIED && rec.Status != want {
			continue
		}
		wf, err := toWorkflow(rec)
		if err != nil {
			return nil, err
		}
		if e.GetCloseTime() != nil {
			wf.UpdateTime = timestamppb.New(e.GetCloseTime().AsTime())
		}
		out.Workflows = append(out.Workflows, wf)
	}
	return out, nil
}
