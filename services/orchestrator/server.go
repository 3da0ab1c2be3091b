package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/lifecycle"
	"github.com/secbear/neuron/pkg/money"
)

// DefaultPageSize is ListWorkflows' page size when the request says 0.
const DefaultPageSize = 100

// Server implements orchestratorv1.OrchestratorServiceServer over any
// Engine. It checks requests, so every engine answers bad input the same
// way, and returns Go errors wrapping pkg/errs kinds; the server's
// interceptor chain maps them to statuses.
type Server struct {
	orchestratorv1.UnimplementedOrchestratorServiceServer
	e       Engine
	workers int
	// WatchWorkflow: the bus that wakes it, how often it looks for events
	// of other replicas, and the live progress.
	bus  *lifecycle.Bus
	poll time.Duration
	hub  *Hub
	// state keeps the transcripts (GetTranscript).
	state statev1.StateServiceClient
	// agents looks up agents' busy_session policies (WithAgents); nil:
	// every session runs its messages side by side.
	agents func(id string) (*Agent, error)
	// approvalTimeout decides approvals left waiting that long, approving
	// when approvalDefault; 0: never.
	approvalTimeout time.Duration
	approvalDefault bool
	log             *slog.Logger
}

// ServerOption configures a Server.
type ServerOption func(*Server)

// WithWatch serves WatchWorkflow's wake-ups from bus (events of other
// replicas are found every poll; 0: a second) and its live progress from
// hub (nil: none).
func WithWatch(bus *lifecycle.Bus, poll time.Duration, hub *Hub) ServerOption {
	return func(s *Server) { s.bus, s.poll, s.hub = bus, poll, hub }
}

// WithTranscripts serves GetTranscript from the State service.
func WithTranscripts(state statev1.StateServiceClient) ServerOption {
	return func(s *Server) { s.state = state }
}

// WithApprovalTimeout makes RunApprovalTimeouts decide approvals left
// waiting for d: approved when approve, rejected otherwise.
func WithApprovalTimeout(d time.Duration, approve bool) ServerOption {
	return func(s *Server) { s.approvalTimeout, s.approvalDefault = d, approve }
}

// WithServerLog logs what the server does in the background.
func WithServerLog(log *slog.Logger) ServerOption {
	return func(s *Server) { s.log = log }
}

// NewServer returns a Server over e; workers is DispatchMany's default
// concurrency (0: DefaultWorkers).
func NewServer(e Engine, workers int, opts ...ServerOption) *Server {
	if workers <= 0 {
		workers = DefaultWorkers
	}
	s := &Server{e: e, workers: workers}
	for _, o := range opts {
		o(s)
	}
	return s
}

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

// start checks a Dispatch or StartWorkflow request and starts (or finds)
// its workflow.
func (s *Server) start(ctx context.Context, wfID, agentID string, in *operatorv1.OperatorInput, b *typesv1.Money, detached, unnamed bool) (string, bool, error) {
	if in == nil || in.Message == nil {
		return "", false, fmt.Errorf("input.message is required: %w", errs.InvalidArgument)
	}
	budget, err := budgetOf(b)
	if err != nil {
		return "", false, err
	}
	// Only the correlation and causation ids are the caller's; the rest
	// is assigned.
	in = proto.Clone(in).(*operatorv1.OperatorInput)
	in.Dispatch = &operatorv1.DispatchContext{CorrelationId: in.GetDispatch().GetCorrelationId(), CausationId: in.GetDispatch().GetCausationId()}
	if wfID == "" {
		wfID = NewWorkflowID()
	}
	return s.e.Start(ctx, &StartRequest{WorkflowID: wfID, AgentID: agentID, Input: in, Budget: budget, Detached: detached, Unnamed: unnamed})
}

// startGated is start after the session gate (sessionGate): signaled
// names the workflow the message went to instead.
func (s *Server) startGated(ctx context.Context, wfID, agentID string, in *operatorv1.OperatorInput, b *typesv1.Money, detached bool) (id string, existed bool, signaled string, err error) {
	// Nobody can name a workflow before its Dispatch answers, unless the
	// session gate does (a claim names it).
	unnamed := wfID == "" && !detached
	if policy := s.busyPolicy(agentID); in.GetSessionId() != "" && policy != "" && in.GetMessage() != nil {
		if wfID == "" {
			wfID, unnamed = NewWorkflowID(), false
		}
		gate, err := s.sessionGate(ctx, agentID, policy, wfID, in)
		if err != nil {
			return "", false, "", err
		}
		if gate != nil && gate.signaled != "" {
			return "", false, gate.signaled, nil
		}
		if gate != nil && gate.input != nil {
			in = gate.input
		}
	}
	startCtx := ctx
	if detached {
		startCtx = context.WithoutCancel(ctx)
	}
	id, existed, err = s.start(startCtx, wfID, agentID, in, b, detached, unnamed)
	return id, existed, "", err
}

// Dispatch implements OrchestratorService.Dispatch.
func (s *Server) Dispatch(ctx context.Context, req *orchestratorv1.DispatchRequest) (*orchestratorv1.DispatchResponse, error) {
	id, existed, signaled, err := s.startGated(ctx, req.GetWorkflowId(), req.GetAgentId(), req.GetInput(), req.GetBudget(), false)
	if err != nil {
		return nil, err
	}
	if signaled != "" {
		return s.signaledResponse(ctx, signaled)
	}
	wf, err := s.e.Wait(ctx, id)
	if err != nil {
		if errors.Is(ctx.Err(), context.Canceled) && !existed && !DeadlineNear(ctx) {
			// The caller gave up: its workflow stops with it.
			_, _ = s.e.Cancel(context.WithoutCancel(ctx), id, CallerLeft)
		}
		return nil, err
	}
	return response(wf)
}

// CallerLeft is the reason a workflow whose Dispatch caller cancelled
// the call ends CANCELED with.
const CallerLeft = "the Dispatch caller cancelled the call"

// response builds a DispatchResponse from a workflow that stopped.
func response(wf *Workflow) (*orchestratorv1.DispatchResponse, error) {
	switch wf.Status {
	case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED:
		if wf.Failure == nil {
			return nil, fmt.Errorf("workflow %q %s: %w", wf.ID, StatusName(wf.Status), errs.Internal)
		}
		return nil, wf.Failure.Err()
	}
	out := wf.LastOutput
	if r := limitRequestOf(wf); r != nil {
		// Suspended between operator calls: the caller is told so, not
		// handed the last call's answer as if it were the end.
		out = proto.CloneOf(out)
		out.ExitReason = &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_SUSPENDED, Suspension: &operatorv1.Suspension{
			Prompt: limitPrompt(wf.ID, r)}}
	}
	return &orchestratorv1.DispatchResponse{WorkflowId: wf.ID, TotalCost: money.FromDecimal(wf.Spent), Output: out, Effects: wf.Effects}, nil
}

// DispatchMany implements OrchestratorService.DispatchMany.
func (s *Server) DispatchMany(ctx context.Context, req *orchestratorv1.DispatchManyRequest) (*orchestratorv1.DispatchManyResponse, error) {
	return dispatchMany(ctx, req, s.workers, s.Dispatch)
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

// StatusErr converts a wire Status back to an error.
func StatusErr(st *typesv1.Status) error {
	s := status.New(codeOf(st.GetCode()), st.GetMessage())
	if st.GetReason() != "" {
		s = errs.WithReason(s, st.GetReason())
	}
	return s.Err()
}

// Signal implements OrchestratorService.Signal.
func (s *Server) Signal(ctx context.Context, req *orchestratorv1.SignalRequest) (*orchestratorv1.SignalResponse, error) {
	if req.GetSignal() == nil {
		return nil, fmt.Errorf("signal is required: %w", errs.InvalidArgument)
	}
	payload, err := proto.Marshal(req.GetSignal())
	if err != nil {
		return nil, fmt.Errorf("signal: %v: %w", err, errs.InvalidArgument)
	}
	seq, dup, err := s.e.Signal(ctx, req.GetWorkflowId(), payload, req.GetIdempotencyKey())
	if err != nil {
		return nil, err
	}
	return &orchestratorv1.SignalResponse{Sequence: seq, Duplicate: dup}, nil
}

// Query types.
var queryTypes = []string{"status", "steps", "signals"}

// Query implements OrchestratorService.Query. The query type is checked
// before the workflow is looked up.
func (s *Server) Query(ctx context.Context, req *orchestratorv1.QueryRequest) (*orchestratorv1.QueryResponse, error) {
	id := req.GetWorkflowId()
	var (
		v   any
		err error
	)
	switch req.GetQueryType() {
	case "status":
		var wf *Workflow
		if wf, err = s.e.Get(ctx, id); err == nil {
			v, err = statusView(wf)
		}
	case "steps":
		var steps []StepView
		if steps, err = s.e.Steps(ctx, id); err == nil {
			v = stepsView(steps)
		}
	case "signals":
		var sigs []SignalView
		if sigs, err = s.e.Signals(ctx, id); err == nil {
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
func statusView(wf *Workflow) (any, error) {
	out := map[string]any{
		"workflow_id": wf.ID, "status": StatusName(wf.Status), "root_agent": wf.RootAgent,
		"current_agent": wf.CurrentAgent, "steps": float64(wf.Steps), "spent": wf.Spent.String(),
		"pending_signals": float64(wf.Pending),
	}
	if wf.Budget.Valid {
		out["budget"] = wf.Budget.Decimal.String()
	}
	if wf.Failure != nil {
		out["failure"] = map[string]any{"code": codeOf(wf.Failure.Code).String(), "message": wf.Failure.Message, "reason": wf.Failure.Reason}
	}
	if wf.LastOutput != nil {
		j, err := protoJSON(wf.LastOutput)
		if err != nil {
			return nil, err
		}
		out["last_output"] = j
	}
	return out, nil
}

// stepsView is the steps query's answer.
func stepsView(steps []StepView) []any {
	list := make([]any, 0, len(steps))
	for _, st := range steps {
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
			item["effects"] = float64(st.Effects)
		}
		list = append(list, item)
	}
	return list
}

// signalsView is the signals query's answer.
func signalsView(sigs []SignalView) []any {
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
	id, existed, signaled, err := s.startGated(ctx, req.GetWorkflowId(), req.GetAgentId(), req.GetInput(), req.GetBudget(), true)
	if err != nil {
		return nil, err
	}
	if signaled != "" {
		// The message went to the session's running workflow.
		return &orchestratorv1.StartWorkflowResponse{WorkflowId: signaled, AlreadyStarted: true}, nil
	}
	return &orchestratorv1.StartWorkflowResponse{WorkflowId: id, AlreadyStarted: existed}, nil
}

// GetWorkflow implements OrchestratorService.GetWorkflow.
func (s *Server) GetWorkflow(ctx context.Context, req *orchestratorv1.GetWorkflowRequest) (*orchestratorv1.GetWorkflowResponse, error) {
	wf, err := s.e.Get(ctx, req.GetWorkflowId())
	if err != nil {
		return nil, err
	}
	return &orchestratorv1.GetWorkflowResponse{Workflow: s.toWorkflow(wf)}, nil
}

// CancelWorkflow implements OrchestratorService.CancelWorkflow.
func (s *Server) CancelWorkflow(ctx context.Context, req *orchestratorv1.CancelWorkflowRequest) (*orchestratorv1.CancelWorkflowResponse, error) {
	reason := req.GetReason()
	if reason == "" {
		reason = "cancelled by a caller"
	}
	wf, err := s.e.Cancel(ctx, req.GetWorkflowId(), reason)
	if err != nil {
		return nil, err
	}
	return &orchestratorv1.CancelWorkflowResponse{Workflow: s.toWorkflow(wf)}, nil
}

// ListWorkflows implements OrchestratorService.ListWorkflows.
func (s *Server) ListWorkflows(ctx context.Context, req *orchestratorv1.ListWorkflowsRequest) (*orchestratorv1.ListWorkflowsResponse, error) {
	size, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, err
	}
	if _, ok := orchestratorv1.WorkflowStatus_name[int32(req.GetStatus())]; !ok {
		return nil, fmt.Errorf("status %d is not a workflow status: %w", req.GetStatus(), errs.InvalidArgument)
	}
	wfs, next, err := s.e.List(ctx, req.GetStatus(), size, req.GetPageToken())
	if err != nil {
		return nil, err
	}
	resp := &orchestratorv1.ListWorkflowsResponse{NextPageToken: next}
	for _, wf := range wfs {
		resp.Workflows = append(resp.Workflows, s.toWorkflow(wf))
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

// toWorkflow is r on the wire, with the approvals it waits on.
func (s *Server) toWorkflow(r *Workflow) *orchestratorv1.Workflow {
	wf := toWorkflow(r)
	wf.PendingApprovals = s.pendingOf(r)
	wf.LimitRequest = limitRequestOf(r)
	return wf
}

func toWorkflow(r *Workflow) *orchestratorv1.Workflow {
	wf := &orchestratorv1.Workflow{
		WorkflowId: r.ID, Status: r.Status, RootAgentId: r.RootAgent, CurrentAgentId: r.CurrentAgent,
		Steps: r.Steps, Spent: money.FromDecimal(r.Spent), CreateTime: timestamppb.New(r.Created),
		UpdateTime: timestamppb.New(r.Updated), PendingSignals: r.Pending, LastOutput: r.LastOutput,
	}
	if r.Budget.Valid {
		wf.Budget = money.FromDecimal(r.Budget.Decimal)
	}
	if r.Failure != nil {
		wf.Failure = &typesv1.Status{Code: r.Failure.Code, Message: r.Failure.Message, Reason: r.Failure.Reason}
	}
	if w := r.Waiting; w != nil && r.Status == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING {
		wf.Waiting = &orchestratorv1.WorkflowWait{Reason: w.Reason, Since: timestamppb.New(w.Since), Attempts: w.Attempts}
	}
	return wf
}

func codeOf(c int32) codes.Code {
	if c < 0 || c > 16 {
		return codes.Unknown
	}
	return codes.Code(c)
}

// DeadlineNear reports whether ctx's deadline has passed or is about to:
// a gRPC client whose deadline expires cancels the call, which can reach
// the server a moment before the server's own copy of that deadline
// fires. Such a call did not "go away"; its workflow fails on the
// deadline (its context carries the same deadline) rather than being
// cancelled.
func DeadlineNear(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return ok && time.Until(dl) < deadlineSlack
}

// deadlineSlack is how close to its deadline a cancelled call counts as
// having reached it.
const deadlineSlack = time.Second
