package temporal

// The Temporal workflow, run by the SDK's test environment (no Temporal
// server) with the real activities: a scripted in-process Caller stands
// in for the operators and a real in-memory State service keeps outputs
// and memory. The shared workflow (orchestrator.Run), the journal engine
// and the README are the reference semantics.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/lifecycle"
	"github.com/secbear/neuron/pkg/middleware/dispatch"
	"github.com/secbear/neuron/pkg/money"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/services/orchestrator"
	"github.com/secbear/neuron/services/state"
)

// tsBehaviour answers one operator call of an agent.
type tsBehaviour func(ctx context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error)

// tsCall is one operator call the caller received.
type tsCall struct {
	in *operatorv1.OperatorInput
	// budget is the remaining workflow budget the call carried, "" for
	// none.
	budget string
}

// tsCaller is a Caller scripted per agent; it records every input.
type tsCaller struct {
	mu     sync.Mutex
	agents map[string]tsBehaviour
	calls  []tsCall
}

func (c *tsCaller) Call(ctx context.Context, agent *orchestrator.Agent, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
	rec := tsCall{in: proto.Clone(in).(*operatorv1.OperatorInput), budget: remainingBudget(ctx, in)}
	c.mu.Lock()
	c.calls = append(c.calls, rec)
	b := c.agents[agent.ID]
	c.mu.Unlock()
	if b == nil {
		return nil, fmt.Errorf("test caller: no behaviour for agent %q: %w", agent.ID, errs.FailedPrecondition)
	}
	return b(ctx, in)
}

// remainingBudget is the workflow budget left that ctx carries to the
// dispatch boundary ("" for none), as dispatch.BudgetInterceptor
// reads it: it lowers an input's max_cost to what is left.
func remainingBudget(ctx context.Context, in *operatorv1.OperatorInput) string {
	req := &operatorv1.ExecuteRequest{Input: proto.Clone(in).(*operatorv1.OperatorInput)}
	req.Input.Config = nil
	var left string
	_ = dispatch.BudgetInterceptor()(ctx, "/layer0.operator.v1.OperatorService/Execute", req, nil, nil,
		func(_ context.Context, _ string, req, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
			if m := req.(*operatorv1.ExecuteRequest).GetInput().GetConfig().GetMaxCost(); m != nil {
				d, _ := money.Parse(m)
				left = d.String()
			}
			return nil
		})
	return left
}

// all returns every call, in order.
func (c *tsCaller) all() []tsCall {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]tsCall(nil), c.calls...)
}

// inputs returns the inputs agent received, in order.
func (c *tsCaller) inputs(agent string) []*operatorv1.OperatorInput {
	var out []*operatorv1.OperatorInput
	for _, call := range c.all() {
		if call.in.GetDispatch().GetAgentId() == agent {
			out = append(out, call.in)
		}
	}
	return out
}

// order is the agents called, comma-separated.
func (c *tsCaller) order() string {
	var ids []string
	for _, call := range c.all() {
		ids = append(ids, call.in.GetDispatch().GetAgentId())
	}
	return strings.Join(ids, ",")
}

// tsState is the State client the backend uses: it fails the first
// writes of one key with UNAVAILABLE and counts the writes of each key
// that the service applied (not the repeats it recognised).
type tsState struct {
	statev1.StateServiceClient
	mu       sync.Mutex
	failKey  string
	failures int // still to inject
	attempts map[string]int
	applied  map[string]int
}

func (s *tsState) Write(ctx context.Context, req *statev1.WriteRequest, opts ...grpc.CallOption) (*statev1.WriteResponse, error) {
	s.mu.Lock()
	s.attempts[req.GetKey()]++
	fail := req.GetKey() == s.failKey && s.failures > 0
	if fail {
		s.failures--
	}
	s.mu.Unlock()
	if fail {
		return nil, status.Error(codes.Unavailable, "state: injected outage")
	}
	resp, err := s.StateServiceClient.Write(ctx, req, opts...)
	if err == nil && !resp.GetReplayed() {
		s.mu.Lock()
		s.applied[req.GetKey()]++
		s.mu.Unlock()
	}
	return resp, err
}

func (s *tsState) counts(key string) (attempts, applied int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.attempts[key], s.applied[key]
}

// tsGate blocks operator calls until opened.
type tsGate struct {
	ch   chan struct{}
	once sync.Once
}

func newGate(t *testing.T) *tsGate {
	g := &tsGate{ch: make(chan struct{})}
	t.Cleanup(g.open)
	return g
}

func (g *tsGate) open() { g.once.Do(func() { close(g.ch) }) }

// wait blocks until the gate opens or ctx ends (its error), bounded so a
// broken test cannot hang.
func (g *tsGate) wait(ctx context.Context) error {
	select {
	case <-g.ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(5 * time.Second):
		return fmt.Errorf("test gate never opened: %w", errs.FailedPrecondition)
	}
}

// tsEnv is one workflow under the SDK's test environment.
type tsEnv struct {
	t      *testing.T
	env    *testsuite.TestWorkflowEnvironment
	caller *tsCaller
	state  *tsState
	reg    *orchestrator.Registry
	bus    *lifecycle.Bus
	wfID   string
}

// tsAgent is a registry entry; attempts is its retry.max_attempts.
func tsAgent(id string, attempts int) map[string]any {
	return map[string]any{"id": id, "operator": "127.0.0.1:1",
		"retry": map[string]any{"max_attempts": attempts, "initial_backoff": "1ms", "max_backoff": "5ms"}}
}

// newTSEnv builds the backend over a fresh in-memory State service and
// registers its workflow and activities with a test environment.
func newTSEnv(t *testing.T, wfID string, agents []map[string]any, behaviours map[string]tsBehaviour, opts Options) *tsEnv {
	t.Helper()
	b, err := json.Marshal(map[string]any{"agents": agents})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := orchestrator.ParseRegistry(b)
	if err != nil {
		t.Fatal(err)
	}
	st := &tsState{StateServiceClient: startTSState(t), attempts: map[string]int{}, applied: map[string]int{}}
	caller := &tsCaller{agents: behaviours}
	bus := lifecycle.NewBus(lifecycle.Options{})
	t.Cleanup(bus.Close)
	tb := New(nil, orchestrator.Deps{Registry: reg, Caller: caller, State: st, Bus: bus}, opts)

	var s testsuite.WorkflowTestSuite
	s.SetLogger(tlog.NewStructuredLogger(slog.New(slog.DiscardHandler)))
	env := s.NewTestWorkflowEnvironment()
	env.SetTestTimeout(5 * time.Second)
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: wfID, TaskQueue: DefaultTaskQueue})
	tb.RegisterWorkflow(env)
	tb.RegisterActivities(env)
	return &tsEnv{t: t, env: env, caller: caller, state: st, reg: reg, bus: bus, wfID: wfID}
}

// startTSState serves a real in-memory State service, started as its
// binary starts it (state.Run), on loopback.
func startTSState(t *testing.T) statev1.StateServiceClient {
	t.Helper()
	addr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		return state.Run(ctx, state.Config{
			Server:   grpcserver.Config{Dev: true, ShutdownTimeout: time.Second},
			Listener: lis,
			Backend:  state.BackendMemory,
		})
	})
	return statev1.NewStateServiceClient(harness.Dial(t, addr))
}

// tsInput is the workflow argument Engine.Start builds for a user
// message to root.
func tsInput(t *testing.T, root, text, session string) twInput {
	t.Helper()
	in := &operatorv1.OperatorInput{Message: content.Text(text), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_USER,
		Dispatch: &operatorv1.DispatchContext{}}
	if session != "" {
		in.SessionId = &session
	}
	b, err := proto.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	return twInput{RootAgent: root, Input: b, Trace: map[string]string{},
		MaxDepth: orchestrator.DefaultMaxDepth, MaxSteps: orchestrator.DefaultMaxSteps, WarnFraction: orchestrator.DefaultWarnFraction}
}

// run executes the workflow to its end: its result, or the error it
// ended with.
func (e *tsEnv) run(in twInput) (*twResult, error) {
	e.t.Helper()
	e.env.ExecuteWorkflow(twName, in)
	if !e.env.IsWorkflowCompleted() {
		e.t.Fatal("the workflow did not complete")
	}
	if err := e.env.GetWorkflowError(); err != nil {
		return nil, err
	}
	var res twResult
	if err := e.env.GetWorkflowResult(&res); err != nil {
		e.t.Fatal(err)
	}
	return &res, nil
}

// mustRun is run for a workflow that must complete.
func (e *tsEnv) mustRun(in twInput) *twResult {
	e.t.Helper()
	res, err := e.run(in)
	if err != nil {
		e.t.Fatalf("workflow failed: %v", err)
	}
	if res.Status != "COMPLETED" {
		e.t.Fatalf("status %s, want COMPLETED (failure %+v)", res.Status, res.Failure)
	}
	return res
}

// query is the workflow's view of itself (query neuron.result).
func (e *tsEnv) query() *twResult {
	e.t.Helper()
	v, err := e.env.QueryWorkflow(twQueryResult)
	if err != nil {
		e.t.Fatalf("query %s: %v", twQueryResult, err)
	}
	var res twResult
	if err := v.Get(&res); err != nil {
		e.t.Fatal(err)
	}
	return &res
}

// signalSeq asks the workflow for the sequence of a signal key.
func (e *tsEnv) signalSeq(key string) uint64 {
	e.t.Helper()
	v, err := e.env.QueryWorkflow(twQuerySigKey, key)
	if err != nil {
		e.t.Fatalf("query %s: %v", twQuerySigKey, err)
	}
	var seq uint64
	if err := v.Get(&seq); err != nil {
		e.t.Fatal(err)
	}
	return seq
}

// when runs do on the environment's main loop once cond holds, checking
// every 10ms (wall time while an activity runs, mock time otherwise).
func (e *tsEnv) when(cond func() bool, do func()) {
	tries := 0
	var check func()
	check = func() {
		if cond() {
			do()
			return
		}
		if tries++; tries > 400 {
			e.t.Error("the awaited condition never held")
			return
		}
		e.env.RegisterDelayedCallback(check, 10*time.Millisecond)
	}
	e.env.RegisterDelayedCallback(check, 10*time.Millisecond)
}

// signalIn is a signal as Engine.Signal sends it.
func (e *tsEnv) signalIn(key, typ string, data any) twSignalIn {
	e.t.Helper()
	v, err := structpb.NewValue(data)
	if err != nil {
		e.t.Fatal(err)
	}
	b, err := proto.Marshal(&typesv1.SignalPayload{SignalType: typ, Data: v})
	if err != nil {
		e.t.Fatal(err)
	}
	return twSignalIn{Key: key, Payload: b}
}

// signal sends a signal, which the workflow handles in a workflow task
// of its own.
func (e *tsEnv) signal(key, typ string, data any) {
	e.t.Helper()
	e.env.SignalWorkflow(twSignal, e.signalIn(key, typ, data))
}

// workflowFailure is the failure a workflow ended with.
func workflowFailure(t *testing.T, err error) *failure {
	t.Helper()
	if err == nil {
		t.Fatal("the workflow completed, want it to fail")
	}
	var wee *temporal.WorkflowExecutionError
	if !errors.As(err, &wee) {
		t.Fatalf("workflow error %T (%v), want a *temporal.WorkflowExecutionError", err, err)
	}
	var app *temporal.ApplicationError
	if !errors.As(err, &app) || app.Type() != errTypeWorkflow {
		t.Fatalf("workflow error %v, want an ApplicationError of type %s", err, errTypeWorkflow)
	}
	var f failure
	if err := app.Details(&f); err != nil {
		t.Fatalf("failure details: %v", err)
	}
	return &f
}

// wantFailure checks a failure's code, reason and that its message holds
// every part.
func wantFailure(t *testing.T, f *failure, code codes.Code, reason string, parts ...string) {
	t.Helper()
	if codes.Code(f.Code) != code || f.Reason != reason {
		t.Errorf("failure %s/%q (%s), want %s/%q", codes.Code(f.Code), f.Reason, f.Message, code, reason)
	}
	for _, p := range parts {
		if !strings.Contains(f.Message, p) {
			t.Errorf("failure message %q does not mention %q", f.Message, p)
		}
	}
}

// tsOut is an output of exit kind with text, cost and effects, keyed the
// way real operators key them.
func tsOut(in *operatorv1.OperatorInput, kind operatorv1.ExitKind, text, cost string, effects ...*typesv1.Effect) *operatorv1.OperatorOutput {
	for i, e := range effects {
		if e.IdempotencyKey == "" {
			e.IdempotencyKey = fmt.Sprintf("%s/effect/%d", in.GetDispatch().GetDispatchId(), i)
		}
	}
	return &operatorv1.OperatorOutput{
		Message:    content.Text(text),
		ExitReason: &operatorv1.ExitReason{Kind: kind},
		Metadata:   &operatorv1.OperatorMetadata{Cost: money.FromDecimal(decimal.RequireFromString(cost)), TurnsUsed: 1},
		Effects:    effects,
	}
}

func tsDone(in *operatorv1.OperatorInput, text, cost string, effects ...*typesv1.Effect) *operatorv1.OperatorOutput {
	return tsOut(in, operatorv1.ExitKind_EXIT_KIND_COMPLETE, text, cost, effects...)
}

// tsAnswer always completes with text at cost.
func tsAnswer(text, cost string) tsBehaviour {
	return func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
		return tsDone(in, text, cost), nil
	}
}

// tsDelegated answers a first call with first and a re-invocation with
// delegation results with then.
func tsDelegated(first, then tsBehaviour) tsBehaviour {
	return func(ctx context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
		if _, ok := in.GetMetadata().GetFields()["delegations"]; ok {
			return then(ctx, in)
		}
		return first(ctx, in)
	}
}

func tsWrite(in *operatorv1.OperatorInput, key string, v any) *typesv1.Effect {
	val, _ := structpb.NewValue(v)
	return &typesv1.Effect{Kind: &typesv1.Effect_WriteMemory{WriteMemory: &typesv1.WriteMemory{
		Scope: scope.Workflow(in.GetDispatch().GetWorkflowId()), Key: key, Value: val}}}
}

func tsDelegate(agent, task string) *typesv1.Effect {
	return &typesv1.Effect{Kind: &typesv1.Effect_Delegate{Delegate: &typesv1.Delegate{AgentId: agent, Message: content.Text(task)}}}
}

func tsHandoff(agent string, st any) *typesv1.Effect {
	v, _ := structpb.NewValue(st)
	return &typesv1.Effect{Kind: &typesv1.Effect_Handoff{Handoff: &typesv1.Handoff{AgentId: agent, State: v}}}
}

// readJSON reads a workflow-scoped key from State as compact JSON.
func (e *tsEnv) readJSON(key string) string {
	e.t.Helper()
	r, err := e.state.Read(context.Background(), &statev1.ReadRequest{Scope: scope.Workflow(e.wfID), Key: key})
	if err != nil {
		e.t.Fatalf("read %s: %v", key, err)
	}
	b, err := json.Marshal(r.GetValue().AsInterface())
	if err != nil {
		e.t.Fatal(err)
	}
	return string(b)
}

func TestTemporalSuiteCompletion(t *testing.T) {
	var out *operatorv1.OperatorOutput
	e := newTSEnv(t, "wf-plain", []map[string]any{tsAgent("a", 3)}, map[string]tsBehaviour{
		"a": func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			out = tsDone(in, "Hello.", "0.0123")
			return out, nil
		},
	}, Options{})
	res := e.mustRun(tsInput(t, "a", "Hi.", ""))

	if res.Steps != 1 || res.Spent != "0.0123" || res.CurrentAgent != "a" || res.LastStep != 1 {
		t.Errorf("result steps %d, spent %s, agent %q, last step %d; want 1, 0.0123, a, 1", res.Steps, res.Spent, res.CurrentAgent, res.LastStep)
	}
	kept, err := loadOutput(context.Background(), e.state, e.wfID, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(kept, out) {
		t.Errorf("State keeps %v under %s, want the operator's output %v", kept, outputKey(1), out)
	}
	calls := e.caller.all()
	if len(calls) != 1 {
		t.Fatalf("%d operator calls, want 1", len(calls))
	}
	in := calls[0].in
	d := in.GetDispatch()
	if d.GetWorkflowId() != e.wfID || d.GetDispatchId() != e.wfID+"#1" || d.GetAgentId() != "a" || d.GetDepth() != 0 ||
		d.GetCorrelationId() != e.wfID || d.GetParentDispatchId() != "" {
		t.Errorf("dispatch context %v, want workflow %s, dispatch %s#1, agent a, depth 0, correlation = workflow", d, e.wfID, e.wfID)
	}
	if content.TextOf(in.GetMessage()) != "Hi." || in.GetTrigger() != operatorv1.TriggerType_TRIGGER_TYPE_USER {
		t.Errorf("operator got %q (%s), want the user's message", content.TextOf(in.GetMessage()), in.GetTrigger())
	}
	if calls[0].budget != "" {
		t.Errorf("a workflow without a budget passed remaining budget %s to the call", calls[0].budget)
	}
}

func TestTemporalSuiteDelegateHandoff(t *testing.T) {
	planner := tsDelegated(
		func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			return tsDone(in, "Planning.", "0.01", tsWrite(in, "plan", "research, then write"), tsDelegate("researcher", "Find three facts.")), nil
		},
		func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			return tsDone(in, "Handing off.", "0.01", tsHandoff("writer", map[string]any{"facts": 3})), nil
		})
	researcher := func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
		return tsDone(in, "Facts: a, b, c.", "0.02", tsWrite(in, "facts", []any{"a", "b", "c"})), nil
	}
	e := newTSEnv(t, "wf-e2e", []map[string]any{tsAgent("planner", 3), tsAgent("researcher", 3), tsAgent("writer", 3)},
		map[string]tsBehaviour{"planner": planner, "researcher": researcher, "writer": tsAnswer("Report: a, b and c.", "0.005")},
		Options{})
	res := e.mustRun(tsInput(t, "planner", "Write a report.", "s1"))

	if got := e.caller.order(); got != "planner,researcher,planner,writer" {
		t.Fatalf("calls %s, want planner,researcher,planner,writer", got)
	}
	if res.Steps != 4 || res.Spent != "0.045" || res.CurrentAgent != "writer" {
		t.Errorf("result steps %d, spent %s, agent %q; want 4, 0.045, writer", res.Steps, res.Spent, res.CurrentAgent)
	}
	calls := e.caller.all()
	for i, want := range []uint32{0, 1, 0, 0} {
		if d := calls[i].in.GetDispatch(); d.GetDepth() != want || d.GetDispatchId() != fmt.Sprintf("%s#%d", e.wfID, i+1) {
			t.Errorf("call %d (%s): depth %d, dispatch %s; want depth %d, dispatch %s#%d", i+1, d.GetAgentId(), d.GetDepth(), d.GetDispatchId(), want, e.wfID, i+1)
		}
	}
	rin := calls[1].in
	if content.TextOf(rin.GetMessage()) != "Find three facts." || rin.GetTrigger() != operatorv1.TriggerType_TRIGGER_TYPE_TASK ||
		rin.GetDispatch().GetParentDispatchId() != e.wfID+"#1" || rin.GetDispatch().GetCausationId() != e.wfID+"#1/effect/1" || rin.SessionId != nil {
		t.Errorf("researcher input %q (%s), parent %q, cause %q, session %v; want the delegated task from %s#1, its effect 1, no session",
			content.TextOf(rin.GetMessage()), rin.GetTrigger(), rin.GetDispatch().GetParentDispatchId(), rin.GetDispatch().GetCausationId(), rin.SessionId, e.wfID)
	}
	pin := calls[2].in
	if text := content.TextOf(pin.GetMessage()); !strings.Contains(text, "Results of delegated tasks") || !strings.Contains(text, "Facts: a, b, c.") ||
		pin.GetTrigger() != operatorv1.TriggerType_TRIGGER_TYPE_TASK || pin.GetSessionId() != "s1" {
		t.Errorf("planner's second input %q (%s, session %q), want the delegation results with the researcher's answer in session s1", text, pin.GetTrigger(), pin.GetSessionId())
	}
	if ds := pin.GetMetadata().GetFields()["delegations"].GetListValue().GetValues(); len(ds) != 1 ||
		ds[0].GetStructValue().GetFields()["ok"].GetBoolValue() != true || ds[0].GetStructValue().GetFields()["agent_id"].GetStringValue() != "researcher" {
		t.Errorf("planner's second input metadata delegations %v, want one ok result of researcher", ds)
	}
	win := calls[3].in
	if state := win.GetMetadata().GetFields()["handoff_state"]; !proto.Equal(state, structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"facts": structpb.NewNumberValue(3)}})) {
		t.Errorf("writer's handoff_state %v, want {facts: 3}", state)
	}
	if text := content.TextOf(win.GetMessage()); !strings.Contains(text, "Handoff from agent planner") || !strings.Contains(text, `"facts"`) ||
		win.GetMetadata().GetFields()["handoff_from"].GetStringValue() != "planner" || win.GetSessionId() != "s1" ||
		win.GetDispatch().GetParentDispatchId() != e.wfID+"#3" {
		t.Errorf("writer input %q, metadata %v, session %q, parent %q; want the handoff from planner (%s#3) in session s1",
			text, win.GetMetadata(), win.GetSessionId(), win.GetDispatch().GetParentDispatchId(), e.wfID)
	}
	for key, want := range map[string]string{"plan": `"research, then write"`, "facts": `["a","b","c"]`} {
		if got := e.readJSON(key); got != want {
			t.Errorf("memory %s = %s, want %s", key, got, want)
		}
		if _, n := e.state.counts(key); n != 1 {
			t.Errorf("memory %s applied %d times, want once", key, n)
		}
	}
	if len(res.Outcomes) != 4 {
		t.Errorf("%d effect outcomes, want 4 (2 writes, delegate, handoff): %v", len(res.Outcomes), res.Outcomes)
	}
	for k, o := range res.Outcomes {
		if !o.Applied {
			t.Errorf("effect %s not applied: %s", k, o.Detail)
		}
	}
}

func TestTemporalSuiteSignals(t *testing.T) {
	gate := newGate(t)
	e := newTSEnv(t, "wf-signals", []map[string]any{tsAgent("a", 3)}, map[string]tsBehaviour{
		"a": func(ctx context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			if err := gate.wait(ctx); err != nil {
				return nil, err
			}
			return tsDone(in, "ok", "0"), nil
		},
	}, Options{})
	// While the first call is in flight: two signals and a repeat of the
	// first key (with other data), then the call returns.
	e.when(func() bool { return len(e.caller.all()) == 1 }, func() {
		e.signal("k1", "note", "first")
		e.signal("k2", "note", "second")
		e.signal("k1", "note", "repeated")
		gate.open()
	})
	res := e.mustRun(tsInput(t, "a", "Hi.", ""))

	calls := e.caller.inputs("a")
	if len(calls) != 2 {
		t.Fatalf("%d operator calls, want 2 (the signals go to a second call)", len(calls))
	}
	if calls[0].GetTrigger() != operatorv1.TriggerType_TRIGGER_TYPE_USER {
		t.Errorf("first call trigger %s, want USER", calls[0].GetTrigger())
	}
	in := calls[1]
	text := content.TextOf(in.GetMessage())
	if in.GetTrigger() != operatorv1.TriggerType_TRIGGER_TYPE_SIGNAL || !strings.Contains(text, `[signal note #1] "first"`) ||
		!strings.Contains(text, `[signal note #2] "second"`) || strings.Contains(text, "repeated") {
		t.Errorf("second call %s with %q, want trigger SIGNAL with signals 1 and 2 only", in.GetTrigger(), text)
	}
	sigs := in.GetMetadata().GetFields()["signals"].GetListValue().GetValues()
	if len(sigs) != 2 || sigs[0].GetStructValue().GetFields()["sequence"].GetNumberValue() != 1 ||
		sigs[1].GetStructValue().GetFields()["data"].GetStringValue() != "second" {
		t.Errorf("metadata signals %v, want sequences 1 and 2", sigs)
	}
	if len(res.Signals) != 2 || res.Pending != 0 || res.Steps != 2 {
		t.Errorf("result: %d signals, %d pending, %d steps; want 2, 0, 2", len(res.Signals), res.Pending, res.Steps)
	}
	for _, s := range res.Signals {
		if s.Step != 2 {
			t.Errorf("signal %d delivered by step %d, want 2", s.Seq, s.Step)
		}
	}
	for key, want := range map[string]uint64{"k1": 1, "k2": 2, "k3": 0} {
		if got := e.signalSeq(key); got != want {
			t.Errorf("query %s %q = %d, want %d", twQuerySigKey, key, got, want)
		}
	}
}

// A signal that reaches the workflow in the same workflow task as the
// last step's result (on a server: both events arrive while no task
// runs) is still delivered, as the bbolt engine's EndUnlessMore does.
func TestTemporalSuiteSignalWithLastResult(t *testing.T) {
	gate := newGate(t)
	e := newTSEnv(t, "wf-signal-last", []map[string]any{tsAgent("a", 3)}, map[string]tsBehaviour{
		"a": func(ctx context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			if err := gate.wait(ctx); err != nil {
				return nil, err
			}
			return tsDone(in, "ok", "0"), nil
		},
	}, Options{})
	e.when(func() bool { return len(e.caller.all()) == 1 }, func() {
		// Delivered now, handled in the task the call's result starts.
		e.env.SignalWorkflowSkippingWorkflowTask(twSignal, e.signalIn("late", "note", "late"))
		gate.open()
	})
	res := e.mustRun(tsInput(t, "a", "Hi.", ""))

	calls := e.caller.inputs("a")
	if len(calls) != 2 || !strings.Contains(content.TextOf(calls[1].GetMessage()), `[signal note #1] "late"`) {
		t.Errorf("%d operator calls; want a second one carrying the signal (query %s says sequence %d, %d pending)",
			len(calls), twQuerySigKey, e.signalSeq("late"), res.Pending)
	}
}

func TestTemporalSuiteSuspension(t *testing.T) {
	e := newTSEnv(t, "wf-suspend", []map[string]any{tsAgent("a", 3)}, map[string]tsBehaviour{
		"a": func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			if in.GetResume() == nil {
				out := tsOut(in, operatorv1.ExitKind_EXIT_KIND_SUSPENDED, "Approve?", "0.01")
				out.ExitReason.Suspension = &operatorv1.Suspension{ResumeToken: "tok-1", Prompt: "Approve?"}
				return out, nil
			}
			return tsDone(in, "Approved and done.", "0.01"), nil
		},
	}, Options{})
	var suspended *twResult
	e.when(func() bool { return e.query().Status == "SUSPENDED" }, func() {
		suspended = e.query()
		e.signal("approve-1", "approval", map[string]any{"approved": true})
	})
	res := e.mustRun(tsInput(t, "a", "Do it.", ""))

	if suspended == nil || suspended.Steps != 1 || suspended.Pending != 0 || len(e.caller.all()) < 1 {
		t.Fatalf("query while suspended: %+v, want SUSPENDED after 1 step", suspended)
	}
	calls := e.caller.inputs("a")
	if len(calls) != 2 {
		t.Fatalf("%d operator calls, want 2", len(calls))
	}
	in := calls[1]
	decision, _ := structpb.NewValue(map[string]any{"approved": true})
	if in.GetResume().GetResumeToken() != "tok-1" || !proto.Equal(in.GetResume().GetDecision(), decision) ||
		in.GetTrigger() != operatorv1.TriggerType_TRIGGER_TYPE_SIGNAL {
		t.Errorf("resumed call: resume %v, trigger %s; want token tok-1 with decision {approved: true}, trigger SIGNAL", in.GetResume(), in.GetTrigger())
	}
	if res.Steps != 2 || res.Spent != "0.02" {
		t.Errorf("result steps %d, spent %s; want 2, 0.02", res.Steps, res.Spent)
	}
}

func TestTemporalSuiteCancel(t *testing.T) {
	gate := newGate(t)
	stopped := make(chan error, 1)
	e := newTSEnv(t, "wf-cancel", []map[string]any{tsAgent("a", 3)}, map[string]tsBehaviour{
		"a": func(ctx context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			err := gate.wait(ctx)
			stopped <- err
			if err != nil {
				return nil, err
			}
			return tsDone(in, "too late", "0"), nil
		},
	}, Options{HeartbeatTimeout: time.Second})
	const reason = "the user gave up"
	// As Engine.cancel does: the reason, then the cancellation.
	e.when(func() bool { return len(e.caller.all()) == 1 }, func() {
		e.env.SignalWorkflow(twCancelSignal, reason)
		e.env.CancelWorkflow()
	})
	_, err := e.run(tsInput(t, "a", "Take your time.", ""))

	var canceled *temporal.CanceledError
	if !errors.As(err, &canceled) {
		t.Fatalf("workflow error %v, want cancelled", err)
	}
	var got string
	if !canceled.HasDetails() || canceled.Details(&got) != nil || got != reason {
		t.Errorf("cancellation details %q, want the reason %q", got, reason)
	}
	res := e.query()
	if res.Status != "CANCELED" || res.Failure == nil || codes.Code(res.Failure.Code) != codes.Canceled || res.Failure.Message != reason {
		t.Errorf("query after cancel: status %s, failure %+v; want CANCELED with %q", res.Status, res.Failure, reason)
	}
	// The operator call in flight is cancelled (its heartbeat learns it).
	select {
	case err := <-stopped:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the operator call ended with %v, want its context cancelled", err)
		}
	case <-time.After(3 * time.Second):
		t.Error("the operator call in flight was not cancelled")
	}
	if n := len(e.caller.all()); n != 1 {
		t.Errorf("%d operator calls, want 1", n)
	}
}

// A suspended workflow wakes on the cancellation in the same workflow
// task that delivers the reason, before the goroutine reading reasons
// has run: the reason must still be the one recorded.
func TestTemporalSuiteCancelSuspended(t *testing.T) {
	e := newTSEnv(t, "wf-cancel-suspended", []map[string]any{tsAgent("a", 3)}, map[string]tsBehaviour{
		"a": func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			out := tsOut(in, operatorv1.ExitKind_EXIT_KIND_SUSPENDED, "Approve?", "0")
			out.ExitReason.Suspension = &operatorv1.Suspension{ResumeToken: "tok"}
			return out, nil
		},
	}, Options{})
	const reason = "nobody will approve"
	e.when(func() bool { return e.query().Status == "SUSPENDED" }, func() {
		e.env.SignalWorkflowSkippingWorkflowTask(twCancelSignal, reason)
		e.env.CancelWorkflow()
	})
	_, err := e.run(tsInput(t, "a", "Do it.", ""))

	var canceled *temporal.CanceledError
	if !errors.As(err, &canceled) {
		t.Fatalf("workflow error %v, want cancelled", err)
	}
	res := e.query()
	if res.Status != "CANCELED" || res.Failure == nil || codes.Code(res.Failure.Code) != codes.Canceled || res.Failure.Message != reason {
		t.Errorf("query after cancel: status %s, failure %+v; want CANCELED with %q", res.Status, res.Failure, reason)
	}
	if n := len(e.caller.all()); n != 1 {
		t.Errorf("%d operator calls, want 1", n)
	}
}

// Operator failures a retry may fix count against the agent's
// max_attempts, retried by the workflow with the agent's backoff; the
// last failure says how many attempts were made.
func TestTemporalSuiteOperatorErrors(t *testing.T) {
	unavailable := fmt.Errorf("overloaded: %w", errs.Unavailable)
	for _, tc := range []struct {
		name     string
		attempts int
		fail     int // calls that fail before one succeeds (-1: all)
		err      error
		calls    int
		code     codes.Code // OK: completes
		message  string
	}{
		{name: "failed precondition", attempts: 3, fail: -1, err: fmt.Errorf("model refused: %w", errs.FailedPrecondition),
			calls: 1, code: codes.FailedPrecondition, message: "model refused"},
		{name: "invalid argument status", attempts: 3, fail: -1, err: status.Error(codes.InvalidArgument, "bad tool schema"),
			calls: 1, code: codes.InvalidArgument, message: "bad tool schema"},
		{name: "unavailable then ok", attempts: 3, fail: 1, err: unavailable, calls: 2, code: codes.OK},
		{name: "unavailable throughout", attempts: 3, fail: -1, err: unavailable, calls: 3, code: codes.Unavailable, message: "after 3 attempts: overloaded"},
		{name: "unavailable, no retry", attempts: 1, fail: -1, err: unavailable, calls: 1, code: codes.Unavailable, message: "overloaded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			n := 0
			e := newTSEnv(t, "wf-errors", []map[string]any{tsAgent("a", tc.attempts)}, map[string]tsBehaviour{
				"a": func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
					mu.Lock()
					n++
					i := n
					mu.Unlock()
					if tc.fail < 0 || i <= tc.fail {
						return nil, tc.err
					}
					return tsDone(in, "ok", "0.01"), nil
				},
			}, Options{})
			res, err := e.run(tsInput(t, "a", "Hi.", ""))
			if got := len(e.caller.all()); got != tc.calls {
				t.Errorf("%d operator calls, want %d", got, tc.calls)
			}
			for _, c := range e.caller.all() {
				if c.in.GetDispatch().GetDispatchId() != e.wfID+"#1" {
					t.Errorf("attempt with dispatch %s, want every attempt to be %s#1", c.in.GetDispatch().GetDispatchId(), e.wfID)
				}
			}
			if tc.code == codes.OK {
				if err != nil {
					t.Fatalf("workflow failed: %v", err)
				}
				if res.Status != "COMPLETED" || res.Steps != 1 || res.Spent != "0.01" {
					t.Errorf("result %s, %d steps, spent %s; want COMPLETED, 1, 0.01", res.Status, res.Steps, res.Spent)
				}
				return
			}
			wantFailure(t, workflowFailure(t, err), tc.code, "", tc.message)
			q := e.query()
			if q.Status != "FAILED" || q.Steps != 0 || len(q.StepList) != 1 || q.StepList[0].State != "failed" {
				t.Errorf("query: status %s, %d steps, step list %v; want FAILED, 0, one failed step", q.Status, q.Steps, q.StepList)
			}
		})
	}
}

func TestTemporalSuiteBudget(t *testing.T) {
	e := newTSEnv(t, "wf-budget", []map[string]any{tsAgent("a", 3), tsAgent("b", 3)}, map[string]tsBehaviour{
		"a": func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			return tsDone(in, "Expensive.", "0.02", tsDelegate("b", "More.")), nil
		},
		"b": tsAnswer("never", "0"),
	}, Options{})
	in := tsInput(t, "a", "Hi.", "")
	in.Budget = "0.01"
	_, err := e.run(in)

	wantFailure(t, workflowFailure(t, err), codes.ResourceExhausted, errs.ReasonBudgetExhausted, "budget of 0.01 USD is spent")
	calls := e.caller.all()
	if e.caller.order() != "a" {
		t.Fatalf("calls %s, want only a (the delegate is not run)", e.caller.order())
	}
	if calls[0].budget != "0.01" {
		t.Errorf("the call carried remaining budget %q, want 0.01", calls[0].budget)
	}
	res := e.query()
	key := e.wfID + "#1/effect/0"
	if o, ok := res.Outcomes[key]; !ok || o.Applied || o.Detail != "not run: the workflow budget is spent" {
		t.Errorf("delegate outcome %+v (recorded %v), want not applied: the budget is spent", o, ok)
	}
	if res.Status != "FAILED" || res.Spent != "0.02" || res.Steps != 1 {
		t.Errorf("query: status %s, spent %s, steps %d; want FAILED, 0.02, 1", res.Status, res.Spent, res.Steps)
	}
}

func TestTemporalSuiteDowngrade(t *testing.T) {
	a := tsAgent("a", 3)
	a["model"], a["downgrade_model"] = "big", "small"
	e := newTSEnv(t, "wf-downgrade", []map[string]any{a, tsAgent("b", 3)}, map[string]tsBehaviour{
		"a": tsDelegated(
			func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
				return tsDone(in, "Costly.", "0.85", tsDelegate("b", "help")), nil
			},
			tsAnswer("Done.", "0.01")),
		"b": tsAnswer("Helped.", "0"),
	}, Options{})
	in := tsInput(t, "a", "Hi.", "")
	in.Budget = "1.00"
	res := e.mustRun(in)

	calls := e.caller.inputs("a")
	if len(calls) != 2 {
		t.Fatalf("a was called %d times, want 2", len(calls))
	}
	if m := calls[0].GetConfig().GetModel(); m != "big" {
		t.Errorf("first call model %q, want the agent's model big", m)
	}
	if m := calls[1].GetConfig().GetModel(); m != "small" {
		t.Errorf("call after spending 0.85 of 1.00 used model %q, want the downgrade_model small", m)
	}
	if res.Spent != "0.86" {
		t.Errorf("spent %s, want 0.86", res.Spent)
	}
}

func TestTemporalSuiteGuards(t *testing.T) {
	t.Run("delegation cycle", func(t *testing.T) {
		e := newTSEnv(t, "wf-cycle", []map[string]any{tsAgent("a", 3), tsAgent("b", 3)}, map[string]tsBehaviour{
			"a": func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
				return tsDone(in, "", "0", tsDelegate("b", "go")), nil
			},
			"b": func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
				return tsDone(in, "", "0", tsDelegate("a", "back")), nil
			},
		}, Options{})
		_, err := e.run(tsInput(t, "a", "Hi.", ""))
		wantFailure(t, workflowFailure(t, err), codes.FailedPrecondition, "", "delegation cycle: a -> b -> a")
		if got := e.caller.order(); got != "a,b" {
			t.Errorf("calls %s, want a,b", got)
		}
	})
	t.Run("max steps", func(t *testing.T) {
		e := newTSEnv(t, "wf-loop", []map[string]any{tsAgent("a", 3), tsAgent("b", 3)}, map[string]tsBehaviour{
			"a": func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
				return tsDone(in, "", "0", tsHandoff("b", nil)), nil
			},
			"b": func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
				return tsDone(in, "", "0", tsHandoff("a", nil)), nil
			},
		}, Options{})
		in := tsInput(t, "a", "Hi.", "")
		in.MaxSteps = 2
		_, err := e.run(in)
		wantFailure(t, workflowFailure(t, err), codes.FailedPrecondition, "", "limit of 2 operator calls")
		if got := e.caller.order(); got != "a,b" {
			t.Errorf("calls %s, want a,b", got)
		}
	})
	t.Run("depth limit", func(t *testing.T) {
		next := map[string]string{"a": "b", "b": "c", "c": "d"}
		delegating := func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			return tsDone(in, "", "0", tsDelegate(next[in.GetDispatch().GetAgentId()], "deeper")), nil
		}
		e := newTSEnv(t, "wf-deep", []map[string]any{tsAgent("a", 3), tsAgent("b", 3), tsAgent("c", 3), tsAgent("d", 3)},
			map[string]tsBehaviour{"a": delegating, "b": delegating, "c": delegating}, Options{})
		in := tsInput(t, "a", "Hi.", "")
		in.MaxDepth = 2
		_, err := e.run(in)
		wantFailure(t, workflowFailure(t, err), codes.FailedPrecondition, "", "delegation depth limit of 2 reached: a -> b -> c -> d")
		if got := e.caller.order(); got != "a,b,c" {
			t.Errorf("calls %s, want a,b,c", got)
		}
	})
	t.Run("failing delegate", func(t *testing.T) {
		e := newTSEnv(t, "wf-childfail", []map[string]any{tsAgent("a", 3), tsAgent("b", 3)}, map[string]tsBehaviour{
			"a": tsDelegated(
				func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
					return tsDone(in, "", "0", tsDelegate("b", "try")), nil
				},
				tsAnswer("Managed without b.", "0")),
			"b": func(context.Context, *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
				return nil, fmt.Errorf("no tools for that: %w", errs.FailedPrecondition)
			},
		}, Options{})
		res := e.mustRun(tsInput(t, "a", "Hi.", ""))
		if got := e.caller.order(); got != "a,b,a" {
			t.Fatalf("calls %s, want a,b,a (the failure is reported to a)", got)
		}
		o := res.Outcomes[e.wfID+"#1/effect/0"]
		if o.Applied || !strings.HasPrefix(o.Detail, "failed: ") || !strings.Contains(o.Detail, "no tools for that") {
			t.Errorf("delegate outcome %+v, want not applied: failed: no tools for that", o)
		}
		if text := content.TextOf(e.caller.inputs("a")[1].GetMessage()); !strings.Contains(text, "agent b did not run: failed: ") {
			t.Errorf("a's second input %q does not report b's failure", text)
		}
	})
	t.Run("unknown delegate", func(t *testing.T) {
		e := newTSEnv(t, "wf-ghost", []map[string]any{tsAgent("a", 3)}, map[string]tsBehaviour{
			"a": tsDelegated(
				func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
					return tsDone(in, "", "0", tsDelegate("ghost", "boo")), nil
				},
				tsAnswer("Done without the ghost.", "0")),
		}, Options{})
		res := e.mustRun(tsInput(t, "a", "Hi.", ""))
		_, lookupErr := e.reg.Lookup("ghost")
		if lookupErr == nil {
			t.Fatal("the registry knows ghost")
		}
		o, ok := res.Outcomes[e.wfID+"#1/effect/0"]
		if !ok || o.Applied || o.Detail != lookupErr.Error() {
			t.Errorf("delegate outcome %+v (recorded %v), want not applied with %q", o, ok, lookupErr.Error())
		}
		calls := e.caller.inputs("a")
		if len(calls) != 2 || !strings.Contains(content.TextOf(calls[1].GetMessage()), "agent ghost did not run") {
			t.Fatalf("a was called %d times; want a second call reporting that ghost did not run", len(calls))
		}
		if res.Steps != 2 {
			t.Errorf("%d steps, want 2", res.Steps)
		}
	})
}

func TestTemporalSuiteEffectRetry(t *testing.T) {
	e := newTSEnv(t, "wf-effect", []map[string]any{tsAgent("a", 3)}, map[string]tsBehaviour{
		"a": func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			return tsDone(in, "Noted.", "0", tsWrite(in, "note", "remember")), nil
		},
	}, Options{})
	e.state.failKey, e.state.failures = "note", 2
	res := e.mustRun(tsInput(t, "a", "Hi.", ""))

	attempts, applied := e.state.counts("note")
	if attempts != 3 || applied != 1 {
		t.Errorf("note: %d write attempts, applied %d times; want 3 attempts (2 refused as UNAVAILABLE), applied once", attempts, applied)
	}
	if got := e.readJSON("note"); got != `"remember"` {
		t.Errorf("note = %s, want \"remember\"", got)
	}
	o, ok := res.Outcomes[e.wfID+"#1/effect/0"]
	if !ok || !o.Applied || !strings.HasPrefix(o.Detail, "written") {
		t.Errorf("effect outcome %+v (recorded %v), want applied", o, ok)
	}
	if n := len(e.caller.all()); n != 1 {
		t.Errorf("%d operator calls, want 1 (an effect retry does not call the operator again)", n)
	}
}

// An attempt whose worker died does not use up the agent's attempts:
// Temporal retries it (or the workflow runs the call again) however
// often it happens, so a call with max_attempts 2 whose first three
// attempts die still succeeds on the fourth.
func TestTemporalSuiteWorkerDeaths(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
		// die ends an attempt without an answer.
		die func(ctx context.Context)
	}{
		// The attempt's process crashes mid-call: the SDK's test
		// environment reports the panic as a failed attempt, which
		// Temporal retries per the activity's retry policy (a server does
		// the same with a heartbeat timeout). It fails if that policy
		// limits the attempts.
		{name: "crashed", die: func(context.Context) { panic("test: the worker died mid-call") }},
		// The attempt's worker hangs past the activity's start-to-close
		// timeout, ignoring its context: the attempt times out.
		{name: "timed out", opts: Options{HeartbeatTimeout: 40 * time.Millisecond, Engine: orchestrator.Options{CallTimeout: 40 * time.Millisecond}},
			die: func(context.Context) { time.Sleep(250 * time.Millisecond) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			n := 0
			e := newTSEnv(t, "wf-deaths", []map[string]any{tsAgent("a", 2)}, map[string]tsBehaviour{
				"a": func(ctx context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
					mu.Lock()
					n++
					i := n
					mu.Unlock()
					if i <= 3 {
						tc.die(ctx)
						return nil, fmt.Errorf("test: a dead worker answers nothing: %w", errs.Unavailable)
					}
					return tsDone(in, "ok", "0.01"), nil
				},
			}, tc.opts)
			res := e.mustRun(tsInput(t, "a", "Hi.", ""))
			if got := len(e.caller.all()); got != 4 {
				t.Errorf("%d operator calls, want 4 (three dead attempts, then the answer)", got)
			}
			if res.Steps != 1 || len(res.StepList) != 1 || res.StepList[0].State != "done" {
				t.Errorf("result: %d steps, step list %v; want one step, done", res.Steps, res.StepList)
			}
		})
	}
}

// A hanging operator fails its call when the call timeout passes (not
// retried: DEADLINE_EXCEEDED is no failure a retry fixes) rather than
// timing the activity out, which Temporal would retry without end.
func TestTemporalSuiteCallTimeout(t *testing.T) {
	e := newTSEnv(t, "wf-hang", []map[string]any{tsAgent("a", 3)}, map[string]tsBehaviour{
		"a": func(ctx context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		},
	}, Options{HeartbeatTimeout: time.Second, Engine: orchestrator.Options{CallTimeout: 50 * time.Millisecond}})
	_, err := e.run(tsInput(t, "a", "Hi.", ""))
	wantFailure(t, workflowFailure(t, err), codes.DeadlineExceeded, "", "did not finish within the call timeout of 50ms")
	if n := len(e.caller.all()); n != 1 {
		t.Errorf("%d operator calls, want 1", n)
	}
}

// The workflow keeps its events in a log the query neuron.events reads
// (the same on every worker: it is rebuilt as the history replays), and
// publishes each once.
func TestTemporalSuiteEventLog(t *testing.T) {
	gate := newGate(t)
	e := newTSEnv(t, "wf-events", []map[string]any{tsAgent("a", 3)}, map[string]tsBehaviour{
		"a": func(ctx context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			if err := gate.wait(ctx); err != nil {
				return nil, err
			}
			return tsDone(in, "ok", "0.01", tsWrite(in, "k", "v")), nil
		},
	}, Options{})
	live, err := e.bus.Subscribe(lifecycle.Filter{WorkflowID: e.wfID}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	e.when(func() bool { return len(e.caller.all()) == 1 }, func() {
		e.signal("k1", "note", "hello")
		gate.open()
	})
	e.mustRun(tsInput(t, "a", "Hi.", ""))

	v, err := e.env.QueryWorkflow(twQueryEvents, uint64(0))
	if err != nil {
		t.Fatal(err)
	}
	var raw [][]byte
	if err := v.Get(&raw); err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for i, b := range raw {
		ev := &lifecyclev1.LifecycleEvent{}
		if err := proto.Unmarshal(b, ev); err != nil {
			t.Fatal(err)
		}
		if ev.GetWorkflowSequence() != uint64(i+1) || ev.GetTime() == nil || ev.GetWorkflowId() != e.wfID {
			t.Errorf("event %d: position %d, time %v, workflow %q; want position %d, a time, %s", i, ev.GetWorkflowSequence(), ev.GetTime(), ev.GetWorkflowId(), i+1, e.wfID)
		}
		kinds = append(kinds, eventName(ev))
	}
	want := []string{
		"orchestrator.workflow.started", "orchestrator.signal.accepted", "orchestrator.dispatch.completed", "cost_incurred",
		"orchestrator.effect.applied", "orchestrator.dispatch.completed", "cost_incurred", "orchestrator.effect.applied",
		"orchestrator.workflow.completed",
	}
	if strings.Join(kinds, ",") != strings.Join(want, ",") {
		t.Errorf("event log\n%s\nwant\n%s", strings.Join(kinds, ","), strings.Join(want, ","))
	}
	v, err = e.env.QueryWorkflow(twQueryEvents, uint64(len(raw)-1))
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Get(&raw); err != nil || len(raw) != 1 {
		t.Errorf("events after %d: %d (%v), want the last one", len(want)-1, len(raw), err)
	}

	// Every event but signal.accepted (which Engine.Signal sends) went
	// out once, in order.
	var sent []string
	for len(live.C()) > 0 {
		sent = append(sent, eventName((<-live.C()).Event))
	}
	var wantSent []string
	for _, k := range want {
		if k != "orchestrator.signal.accepted" {
			wantSent = append(wantSent, k)
		}
	}
	if strings.Join(sent, ",") != strings.Join(wantSent, ",") {
		t.Errorf("events sent\n%s\nwant\n%s", strings.Join(sent, ","), strings.Join(wantSent, ","))
	}
}

// eventName is an event's type (observable) or its budget event's kind.
func eventName(ev *lifecyclev1.LifecycleEvent) string {
	if o := ev.GetObservable(); o != nil {
		return o.GetEventType()
	}
	if ev.GetBudget().GetCostIncurred() != nil {
		return "cost_incurred"
	}
	return fmt.Sprintf("%T", ev.GetEvent())
}

// A call the Dispatch caller's deadline ends fails the workflow with
// DEADLINE_EXCEEDED, whichever way the attempt ends.
func TestTemporalSuiteDeadline(t *testing.T) {
	e := newTSEnv(t, "wf-deadline", []map[string]any{tsAgent("a", 3)}, map[string]tsBehaviour{
		"a": func(ctx context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		},
	}, Options{HeartbeatTimeout: time.Second})
	in := tsInput(t, "a", "Hi.", "")
	in.Deadline = time.Now().Add(200 * time.Millisecond)
	_, err := e.run(in)
	wantFailure(t, workflowFailure(t, err), codes.DeadlineExceeded, "", "the Dispatch caller's deadline passed during step 1")
	res := e.query()
	if len(res.StepList) != 1 || res.StepList[0].State != "failed" || res.StepList[0].Error != "the Dispatch caller's deadline passed" {
		t.Errorf("step list %v, want one step failed on the deadline", res.StepList)
	}
}

// A workflow whose history was recorded before the workflow retried
// operator failures itself (no marker of retryChange: the SDK answers
// DefaultVersion) takes a retryable failure reaching it as final, as the
// build that recorded it did: its activity had retried already.
func TestTemporalSuiteRetriesBeforeRetryChange(t *testing.T) {
	e := newTSEnv(t, "wf-old-retries", []map[string]any{tsAgent("a", 3)}, map[string]tsBehaviour{
		"a": func(context.Context, *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			return nil, fmt.Errorf("overloaded: %w", errs.Unavailable)
		},
	}, Options{})
	e.env.OnGetVersion(retryChange, workflow.DefaultVersion, 1).Return(workflow.DefaultVersion)
	_, err := e.run(tsInput(t, "a", "Hi.", ""))
	f := workflowFailure(t, err)
	wantFailure(t, f, codes.Unavailable, "", "overloaded")
	if strings.Contains(f.Message, "attempts") {
		t.Errorf("failure %q, want the activity's failure as it is", f.Message)
	}
	if n := len(e.caller.all()); n != 1 {
		t.Errorf("%d operator calls, want 1", n)
	}
}
