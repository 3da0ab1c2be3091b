package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/shopspring/decimal"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/money"
)

// DefaultPageSize is ListWorkflows' page size when the request says 0.
const DefaultPageSize = 100

// Server implements orchestratorv1.OrchestratorServiceServer over an
// Engine. It returns Go errors wrapping pkg/errs kinds; the server's
// interceptor chain maps them to statuses.
type Server struct {
	orchestratorv1.UnimplementedOrchestratorServiceServer
	e *Engine
}

// NewServer returns a Server over e.
func NewServer(e *Engine) *Server { return &Server{e: e} }

func budgetOf(m *typesv1.Money) (decimal.NullDecimal, error) {
	if m == nil {
		return decimal.NullDecimal{}, nil
	}
	d, err := money.Parse(m)
	if err != nil {
		return decimal.NullDecimal{}, fmt.Errorf("budget: %v: %w", err, errs.InvalidArgument)
	}
	return decimal.NewNullDecimal(d), nil
}

func (s *Server) start(ctx context.Context, wfID, agentID string, in *operatorv1.OperatorInput, b *typesv1.Money, detached bool) (*record, bool, error) {
	req, err := newStartRequest(wfID, agentID, in, b, detached)
	if err != nil {
		return nil, false, err
	}
	return s.e.Start(ctx, req)
}

// newStartRequest checks a Dispatch or StartWorkflow request and builds
// the startRequest both backends start from.
func newStartRequest(wfID, agentID string, in *operatorv1.OperatorInput, b *typesv1.Money, detached bool) (startRequest, error) {
	if in == nil || in.Message == nil {
		return startRequest{}, fmt.Errorf("input.message is required: %w", errs.InvalidArgument)
	}
	budget, err := budgetOf(b)
	if err != nil {
		return startRequest{}, err
	}
	// Only the correlation id is the caller's; the rest is assigned.
	in = proto.Clone(in).(*operatorv1.OperatorInput)
	in.Dispatch = &operatorv1.DispatchContext{CorrelationId: in.GetDispatch().GetCorrelationId(), CausationId: in.GetDispatch().GetCausationId()}
	return startRequest{WorkflowID: wfID, AgentID: agentID, Input: in, Budget: budget, Detached: detached}, nil
}

// Dispatch implements OrchestratorService.Dispatch.
func (s *Server) Dispatch(ctx context.Context, req *orchestratorv1.DispatchRequest) (*orchestratorv1.DispatchResponse, error) {
	return s.dispatch(ctx, req)
}

func (s *Server) dispatch(ctx context.Context, req *orchestratorv1.DispatchRequest) (*orchestratorv1.DispatchResponse, error) {
	rec, existed, err := s.start(ctx, req.GetWorkflowId(), req.GetAgentId(), req.GetInput(), req.GetBudget(), false)
	if err != nil {
		return nil, err
	}
	id := rec.ID
	rec, err = s.e.Wait(ctx, id)
	if err != nil {
		if errors.Is(ctx.Err(), context.Canceled) && !existed && !deadlineNear(ctx) {
			s.e.abandon(id) // the caller gave up: its workflow stops with it

		}
		return nil, err
	}
	return s.e.response(rec)
}

// response builds a DispatchResponse from a workflow that stopped.
func (e *Engine) response(rec *record) (*orchestratorv1.DispatchResponse, error) {
	switch rec.Status {
	case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED:
		if rec.Failure == nil {
			return nil, fmt.Errorf("workflow %q %s: %w", rec.ID, statusName(rec.Status), errs.Internal)
		}
		return nil, rec.Failure.err()
	}
	resp := &orchestratorv1.DispatchResponse{WorkflowId: rec.ID, TotalCost: money.FromDecimal(rec.Spent)}
	if rec.LastOutput != nil {
		resp.Output = &operatorv1.OperatorOutput{}
		if err := proto.Unmarshal(rec.LastOutput, resp.Output); err != nil {
			return nil, fmt.Errorf("journaled output is corrupt: %v: %w", err, errs.Internal)
		}
	}
	steps, err := e.j.Steps(rec.ID)
	if err != nil {
		return nil, err
	}
	outcomes, err := e.j.Effects(rec.ID)
	if err != nil {
		return nil, err
	}
	for i, st := range steps {
		if st.Output == nil {
			continue
		}
		out := &operatorv1.OperatorOutput{}
		if err := proto.Unmarshal(st.Output, out); err != nil {
			return nil, fmt.Errorf("journaled output is corrupt: %v: %w", err, errs.Internal)
		}
		id := dispatchID(rec.ID, uint64(i+1))
		for j, eff := range out.GetEffects() {
			key := effectKey(id, j, eff)
			o := &orchestratorv1.EffectOutcome{IdempotencyKey: key}
			if r := outcomes[key]; r != nil {
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
func (s *Server) DispatchMany(ctx context.Context, req *orchestratorv1.DispatchManyRequest) (*orchestratorv1.DispatchManyResponse, error) {
	return dispatchMany(ctx, req, s.e.opts.Workers, s.dispatch)
}

// dispatchMany runs the tasks through dispatch, workers at a time (the
// request's max_concurrency when set), each result in its task's place.
func dispatchMany(ctx context.Context, req *orchestratorv1.DispatchManyRequest, workers int,
	dispatch func(context.Context, *orchestratorv1.DispatchRequest) (*orchestratorv1.DispatchResponse, error)) (*orchestratorv1.DispatchManyResponse, error) {
	tasks := req.GetTasks()
	if len(tasks) == 0 {
		return nil, fmt.Errorf("tasks is empty: %w", errs.InvalidArgument)
	}
	if c := int(req.GetMaxConcurrency()); c > 0 {
		workers = c
	}
	workers = min(workers, len(tasks))
	results := make([]*orchestratorv1.DispatchResult, len(tasks))
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				resp, err := dispatch(ctx, tasks[i])
				if err != nil {
					results[i] = &orchestratorv1.DispatchResult{Result: &orchestratorv1.DispatchResult_Error{Error: statusOf(err)}}
					continue
				}
				results[i] = &orchestratorv1.DispatchResult{Result: &orchestratorv1.DispatchResult_Response{Response: resp}}
			}
		}()
	}
	for i := range tasks {
		next <- i
	}
	close(next)
	wg.Wait()
	return &orchestratorv1.DispatchManyResponse{Results: results}, nil
}

// statusOf converts an error to the wire Status of a DispatchResult.
func statusOf(err error) *typesv1.Status {
	st := errs.ToStatus(err)
	return &typesv1.Status{Code: int32(st.Code()), Message: st.Message(), Reason: errs.Reason(err)}
}

// statusErr converts a wire Status back to an error.
func statusErr(st *typesv1.Status) error {
	s := status.New(codeOf(st.GetCode()), st.GetMessage())
	if st.GetReason() != "" {
		s = errs.WithReason(s, st.GetReason())
	}
	return s.Err()
}

// Signal implements OrchestratorService.Signal.
func (s *Server) Signal(_ context.Context, req *orchestratorv1.SignalRequest) (*orchestratorv1.SignalResponse, error) {
	if req.GetSignal() == nil {
		return nil, fmt.Errorf("signal is required: %w", errs.InvalidArgument)
	}
	payload, err := proto.Marshal(req.GetSignal())
	if err != nil {
		return nil, fmt.Errorf("signal: %v: %w", err, errs.InvalidArgument)
	}
	seq, dup, err := s.e.Signal(req.GetWorkflowId(), payload, req.GetIdempotencyKey())
	if err != nil {
		return nil, err
	}
	return &orchestratorv1.SignalResponse{Sequence: seq, Duplicate: dup}, nil
}

// Query types.
var queryTypes = []string{"status", "steps", "signals"}

// Query implements OrchestratorService.Query.
func (s *Server) Query(_ context.Context, req *orchestratorv1.QueryRequest) (*orchestratorv1.QueryResponse, error) {
	rec, err := s.e.j.Get(req.GetWorkflowId())
	if err != nil {
		return nil, err
	}
	var v any
	switch req.GetQueryType() {
	case "status":
		v, err = statusView(rec)
	case "steps":
		v, err = s.stepsQuery(rec)
	case "signals":
		var sigs []*signalRecord
		if sigs, err = s.e.j.Signals(rec.ID); err == nil {
			v = signalsView(sigs)
		}
	default:
		return nil, fmt.Errorf("unknown query_type %q; this orchestrator answers %v: %w", req.GetQueryType(), queryTypes, errs.InvalidArgument)
	}
	if err != nil {
		return nil, err
	}
	return queryResponse(v)
}

// queryResponse wraps a query's plain-JSON result.
func queryResponse(v any) (*orchestratorv1.QueryResponse, error) {
	val, err := structpb.NewValue(v)
	if err != nil {
		return nil, fmt.Errorf("query result: %v: %w", err, errs.Internal)
	}
	return &orchestratorv1.QueryResponse{Result: val}, nil
}

// protoJSON converts a message to a plain JSON value.
func protoJSON(m proto.Message) (any, error) {
	b, err := protojson.Marshal(m)
	if err != nil {
		return nil, err
	}
	v := &structpb.Value{}
	if err := protojson.Unmarshal(b, v); err != nil {
		return nil, err
	}
	return v.AsInterface(), nil
}

// statusView is the status query's answer.
func statusView(rec *record) (any, error) {
	out := map[string]any{
		"workflow_id": rec.ID, "status": statusName(rec.Status), "root_agent": rec.RootAgent,
		"current_agent": rec.CurrentAgent, "steps": float64(rec.Steps), "spent": rec.Spent.String(),
		"pending_signals": float64(rec.Pending),
	}
	if rec.Budget.Valid {
		out["budget"] = rec.Budget.Decimal.String()
	}
	if rec.Failure != nil {
		out["failure"] = map[string]any{"code": codeOf(rec.Failure.Code).String(), "message": rec.Failure.Message, "reason": rec.Failure.Reason}
	}
	if rec.LastOutput != nil {
		o := &operatorv1.OperatorOutput{}
		if err := proto.Unmarshal(rec.LastOutput, o); err != nil {
			return nil, fmt.Errorf("journaled output is corrupt: %v: %w", err, errs.Internal)
		}
		j, err := protoJSON(o)
		if err != nil {
			return nil, err
		}
		out["last_output"] = j
	}
	return out, nil
}

func (s *Server) stepsQuery(rec *record) (any, error) {
	steps, err := s.e.j.Steps(rec.ID)
	if err != nil {
		return nil, err
	}
	list := make([]any, 0, len(steps))
	for i, st := range steps {
		in := &operatorv1.OperatorInput{}
		_ = proto.Unmarshal(st.Input, in)
		item := map[string]any{
			"step": float64(i + 1), "dispatch_id": in.GetDispatch().GetDispatchId(), "agent": st.Agent,
			"depth": float64(in.GetDispatch().GetDepth()), "trigger": in.GetTrigger().String(),
			"started": st.Started.UTC().Format("2006-01-02T15:04:05.000Z07:00"), "state": "running",
		}
		if len(st.Signals) > 0 {
			seqs := make([]any, len(st.Signals))
			for i, s := range st.Signals {
				seqs[i] = float64(s)
			}
			item["signals"] = seqs
		}
		switch {
		case st.Error != nil:
			item["state"] = "failed"
			item["error"] = st.Error.Message
		case st.Output != nil:
			o := &operatorv1.OperatorOutput{}
			_ = proto.Unmarshal(st.Output, o)
			item["state"] = "done"
			item["exit"] = o.GetExitReason().GetKind().String()
			item["cost"] = outputCost(o).String()
			item["effects"] = float64(len(o.GetEffects()))
		}
		list = append(list, item)
	}
	return list, nil
}

// signalsView is the signals query's answer.
func signalsView(sigs []*signalRecord) []any {
	list := make([]any, 0, len(sigs))
	for _, sg := range sigs {
		p := &typesv1.SignalPayload{}
		_ = proto.Unmarshal(sg.Payload, p)
		item := map[string]any{"sequence": float64(sg.Seq), "signal_type": p.GetSignalType(), "delivered": sg.Step != 0}
		if sg.Step != 0 {
			item["step"] = float64(sg.Step)
		}
		if p.GetData() != nil {
			item["data"] = p.GetData().AsInterface()
		}
		list = append(list, item)
	}
	return list
}

// StartWorkflow implements OrchestratorService.StartWorkflow.
func (s *Server) StartWorkflow(ctx context.Context, req *orchestratorv1.StartWorkflowRequest) (*orchestratorv1.StartWorkflowResponse, error) {
	rec, existed, err := s.start(context.WithoutCancel(ctx), req.GetWorkflowId(), req.GetAgentId(), req.GetInput(), req.GetBudget(), true)
	if err != nil {
		return nil, err
	}
	return &orchestratorv1.StartWorkflowResponse{WorkflowId: rec.ID, AlreadyStarted: existed}, nil
}

// GetWorkflow implements OrchestratorService.GetWorkflow.
func (s *Server) GetWorkflow(_ context.Context, req *orchestratorv1.GetWorkflowRequest) (*orchestratorv1.GetWorkflowResponse, error) {
	rec, err := s.e.j.Get(req.GetWorkflowId())
	if err != nil {
		return nil, err
	}
	wf, err := toWorkflow(rec)
	if err != nil {
		return nil, err
	}
	return &orchestratorv1.GetWorkflowResponse{Workflow: wf}, nil
}

// CancelWorkflow implements OrchestratorService.CancelWorkflow.
func (s *Server) CancelWorkflow(_ context.Context, req *orchestratorv1.CancelWorkflowRequest) (*orchestratorv1.CancelWorkflowResponse, error) {
	rec, err := s.e.Cancel(req.GetWorkflowId(), req.GetReason())
	if err != nil {
		return nil, err
	}
	wf, err := toWorkflow(rec)
	if err != nil {
		return nil, err
	}
	return &orchestratorv1.CancelWorkflowResponse{Workflow: wf}, nil
}

// ListWorkflows implements OrchestratorService.ListWorkflows.
func (s *Server) ListWorkflows(_ context.Context, req *orchestratorv1.ListWorkflowsRequest) (*orchestratorv1.ListWorkflowsResponse, error) {
	size, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, err
	}
	recs, next, err := s.e.j.List(req.GetStatus(), size, req.GetPageToken())
	if err != nil {
		return nil, err
	}
	resp := &orchestratorv1.ListWorkflowsResponse{NextPageToken: next}
	for _, r := range recs {
		wf, err := toWorkflow(r)
		if err != nil {
			return nil, err
		}
		resp.Workflows = append(resp.Workflows, wf)
	}
	return resp, nil
}

// pageSize checks a ListWorkflows page size; 0 is the default.
func pageSize(n int32) (int, error) {
	size := int(n)
	if size < 0 || size > 1000 {
		return 0, fmt.Errorf("page_size %d: want 0 to 1000: %w", size, errs.InvalidArgument)
	}
	if size == 0 {
		size = DefaultPageSize
	}
	return size, nil
}

func toWorkflow(r *record) (*orchestratorv1.Workflow, error) {
	wf := &orchestratorv1.Workflow{
		WorkflowId: r.ID, Status: r.Status, RootAgentId: r.RootAgent, CurrentAgentId: r.CurrentAgent,
		Steps: r.Steps, Spent: money.FromDecimal(r.Spent), CreateTime: timestamppb.New(r.Created),
		UpdateTime: timestamppb.New(r.Updated), PendingSignals: r.Pending,
	}
	if r.Budget.Valid {
		wf.Budget = money.FromDecimal(r.Budget.Decimal)
	}
	if r.Failure != nil {
		wf.Failure = &typesv1.Status{Code: r.Failure.Code, Message: r.Failure.Message, Reason: r.Failure.Reason}
	}
	if r.LastOutput != nil {
		wf.LastOutput = &operatorv1.OperatorOutput{}
		if err := proto.Unmarshal(r.LastOutput, wf.LastOutput); err != nil {
			return nil, fmt.Errorf("journaled output is corrupt: %v: %w", err, errs.Internal)
		}
	}
	return wf, nil
}

func codeOf(c int32) codes.Code {
	if c < 0 || c > 16 {
		return codes.Unknown
	}
	return codes.Code(c)
}

// deadlineNear reports whether ctx's deadline has passed or is about to:
// a gRPC client whose deadline expires cancels the call, which can reach
// the server a moment before the server's own copy of that deadline
// fires. Such a call did not "go away"; its workflow fails on the
// deadline (its context carries the same deadline) rather than being
// cancelled.
func deadlineNear(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return ok && time.Until(dl) < deadlineSlack
}

// deadlineSlack is how close to its deadline a cancelled call counts as
// having reached it.
const deadlineSlack = time.Second
