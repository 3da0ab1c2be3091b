package orchestrator_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	middlewarev1 "github.com/secbear/neuron/gen/layer0/middleware/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/middleware/remote"
	"github.com/secbear/neuron/pkg/money"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/services/orchestrator"
	"github.com/shopspring/decimal"
)

func failWith(code codes.Code, reason, msg string) behaviour {
	return func(context.Context, *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
		return nil, errs.WithReason(status.New(code, msg), reason).Err()
	}
}

func reasonOf(st *typesv1.Status) string { return st.GetReason() }

func TestDispatchManyKeepsOrderAndIsolatesFailures(t *testing.T) {
	backends(t, testDispatchManyKeepsOrderAndIsolatesFailures)
}

func testDispatchManyKeepsOrderAndIsolatesFailures(t *testing.T, start starter) {
	ctx := ctxT(t)
	stateAddr, _, _ := startState(t)
	_, opAddr := startFake(t, map[string]behaviour{
		"ok": func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			return done(in, "ok: "+content.TextOf(in.GetMessage()), "0.001"), nil
		},
		"bad": failWith(codes.FailedPrecondition, errs.ReasonNonRetryable, "the model refused"),
	})
	o := start(t, registryYAML(t, agentsAt(opAddr, "ok", "bad")...), stateAddr, orchOptions{})
	task := func(agent, text string) *orchestratorv1.DispatchRequest {
		return &orchestratorv1.DispatchRequest{AgentId: agent, Input: userInput(text, "")}
	}
	resp, err := o.client.DispatchMany(ctx, &orchestratorv1.DispatchManyRequest{MaxConcurrency: 2, Tasks: []*orchestratorv1.DispatchRequest{
		task("ok", "a"), task("ghost", "b"), task("bad", "c"), task("ok", "d"), task("ok", "e"),
	}})
	if err != nil {
		t.Fatal(err)
	}
	r := resp.GetResults()
	if len(r) != 5 {
		t.Fatalf("%d results, want 5", len(r))
	}
	for i, want := range map[int]string{0: "ok: a", 3: "ok: d", 4: "ok: e"} {
		if got := content.TextOf(r[i].GetResponse().GetOutput().GetMessage()); got != want {
			t.Errorf("result %d = %q (error %v), want %q", i, got, r[i].GetError(), want)
		}
	}
	if e := r[1].GetError(); codes.Code(e.GetCode()) != codes.NotFound || !strings.Contains(e.GetMessage(), `"ghost"`) {
		t.Errorf("unknown agent: %v, want NOT_FOUND naming it", e)
	}
	if e := r[2].GetError(); codes.Code(e.GetCode()) != codes.FailedPrecondition || reasonOf(e) != errs.ReasonNonRetryable || !strings.Contains(e.GetMessage(), "the model refused") {
		t.Errorf("failing agent: %v, want FAILED_PRECONDITION OPERATOR_NON_RETRYABLE with the operator's message", e)
	}
	if _, err := o.client.DispatchMany(ctx, &orchestratorv1.DispatchManyRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("empty batch: %v, want INVALID_ARGUMENT", err)
	}
}

func TestDelegationGuards(t *testing.T) { backends(t, testDelegationGuards) }

func testDelegationGuards(t *testing.T, start starter) {
	ctx := ctxT(t)
	stateAddr, _, _ := startState(t)
	_, opAddr := startFake(t, map[string]behaviour{
		"a": answer("a", delegateTo("b", "go")),
		"b": answer("b", delegateTo("a", "back")),
		"c": answer("c", delegateTo("d", "down")),
		"d": answer("d", delegateTo("e", "down")),
		"e": answer("e"),
	})
	o := start(t, registryYAML(t, agentsAt(opAddr, "a", "b", "c", "d", "e")...), stateAddr,
		orchOptions{engine: orchestrator.Options{MaxDepth: 1}})
	_, err := o.client.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: "a", WorkflowId: "cycle", Input: userInput("x", "")})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "delegation cycle: a -> b -> a") {
		t.Errorf("cycle: %v, want FAILED_PRECONDITION naming the cycle", err)
	}
	_, err = o.client.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: "c", Input: userInput("x", "")})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "depth limit of 1 reached: c -> d -> e") {
		t.Errorf("depth: %v, want FAILED_PRECONDITION naming the chain", err)
	}
	wf, err := o.client.GetWorkflow(ctx, &orchestratorv1.GetWorkflowRequest{WorkflowId: "cycle"})
	if err != nil {
		t.Fatal(err)
	}
	if wf.GetWorkflow().GetStatus() != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED || codes.Code(wf.GetWorkflow().GetFailure().GetCode()) != codes.FailedPrecondition {
		t.Errorf("cycle workflow = %v", wf.GetWorkflow())
	}
}

func TestBudgetHaltsWorkflow(t *testing.T) { backends(t, testBudgetHaltsWorkflow) }

func testBudgetHaltsWorkflow(t *testing.T, start starter) {
	ctx := ctxT(t)
	stateAddr, _, _ := startState(t)
	spend := func(text string, effs ...func(*operatorv1.OperatorInput) *typesv1.Effect) behaviour {
		return func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			var list []*typesv1.Effect
			for _, e := range effs {
				list = append(list, e(in))
			}
			return done(in, text, "0.03", list...), nil
		}
	}
	fake, opAddr := startFake(t, map[string]behaviour{
		"lead":   spend("lead", delegateTo("helper", "help")),
		"helper": spend("helper", delegateTo("third", "more")),
		"third":  spend("third"),
	})
	o := start(t, registryYAML(t, agentsAt(opAddr, "lead", "helper", "third")...), stateAddr, orchOptions{})
	_, err := o.client.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: "lead", WorkflowId: "budget", Input: userInput("x", ""),
		Budget: money.FromDecimal(decimal.RequireFromString("0.05"))})
	if status.Code(err) != codes.ResourceExhausted || errs.Reason(errs.FromGRPC(err)) != errs.ReasonBudgetExhausted {
		t.Fatalf("over budget: %v, want RESOURCE_EXHAUSTED BUDGET_EXHAUSTED", err)
	}
	if n := len(fake.inputs("third")); n != 0 {
		t.Errorf("third agent dispatched %d times after the budget was spent", n)
	}
	// The budget interceptor lowered the helper's max_cost to what was left.
	if h := fake.inputs("helper"); len(h) != 1 || h[0].GetConfig().GetMaxCost().GetAmount() != "0.02" {
		t.Errorf("helper max_cost = %v, want 0.02", h)
	}
	var cost, warn, halt int
	evs, _ := readLog(t, o, "budget", 0, nil)
	for _, e := range evs {
		b := e.ev.GetBudget()
		switch {
		case b.GetCostIncurred() != nil:
			cost++
		case b.GetBudgetWarning() != nil:
			warn++
		case b.GetBudgetAction().GetDecision().GetKind() == lifecyclev1.BudgetDecisionKind_BUDGET_DECISION_KIND_HALT_WORKFLOW:
			halt++
		}
	}
	if cost != 2 || warn != 1 || halt != 1 {
		t.Errorf("budget events: %d cost, %d warning, %d halt; want 2, 1, 1: %v", cost, warn, halt, evs)
	}
	o.replayed(t, "budget", "budget-halt")
}

func TestRetryPolicy(t *testing.T) { backends(t, testRetryPolicy) }

func testRetryPolicy(t *testing.T, start starter) {
	ctx := ctxT(t)
	stateAddr, _, _ := startState(t)
	var flaky atomic.Int32
	fake, opAddr := startFake(t, map[string]behaviour{
		"flaky": func(ctx context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			if flaky.Add(1) <= 2 {
				return failWith(codes.Unavailable, errs.ReasonRetryable, "provider overloaded")(ctx, in)
			}
			return done(in, "finally", "0"), nil
		},
		"down": failWith(codes.Unavailable, errs.ReasonRetryable, "still down"),
	})
	o := start(t, registryYAML(t, agentsAt(opAddr, "flaky", "down")...), stateAddr, orchOptions{})
	resp, err := o.client.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: "flaky", Input: userInput("x", "")})
	if err != nil || content.TextOf(resp.GetOutput().GetMessage()) != "finally" {
		t.Fatalf("flaky: %v %v", resp, err)
	}
	if n := len(fake.inputs("flaky")); n != 3 {
		t.Errorf("flaky called %d times, want 3", n)
	}
	_, err = o.client.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: "down", Input: userInput("x", "")})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "after 3 attempts") || !strings.Contains(err.Error(), "still down") {
		t.Errorf("down: %v, want UNAVAILABLE after 3 attempts with the operator's message", err)
	}
	if n := len(fake.inputs("down")); n != 3 {
		t.Errorf("down called %d times, want 3 (max_attempts)", n)
	}
}

func TestCancelStopsInFlightCall(t *testing.T) { backends(t, testCancelStopsInFlightCall) }

func testCancelStopsInFlightCall(t *testing.T, start starter) {
	ctx := ctxT(t)
	stateAddr, _, _ := startState(t)
	started := make(chan struct{})
	stopped := make(chan error, 1)
	_, opAddr := startFake(t, map[string]behaviour{
		"slow": func(ctx context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			close(started)
			<-ctx.Done()
			stopped <- ctx.Err()
			return nil, ctx.Err()
		},
	})
	o := start(t, registryYAML(t, agentsAt(opAddr, "slow")...), stateAddr, orchOptions{})
	if _, err := o.client.StartWorkflow(ctx, &orchestratorv1.StartWorkflowRequest{WorkflowId: "c1", AgentId: "slow", Input: userInput("x", "")}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("the operator was never called")
	}
	resp, err := o.client.CancelWorkflow(ctx, &orchestratorv1.CancelWorkflowRequest{WorkflowId: "c1", Reason: "user pressed stop"})
	if err != nil {
		t.Fatal(err)
	}
	if wf := resp.GetWorkflow(); wf.GetStatus() != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED || wf.GetFailure().GetMessage() != "user pressed stop" {
		t.Errorf("cancelled workflow = %v", wf)
	}
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("the in-flight operator call was not cancelled")
	}
	// Cancelling again returns it unchanged; signals are refused.
	again, err := o.client.CancelWorkflow(ctx, &orchestratorv1.CancelWorkflowRequest{WorkflowId: "c1", Reason: "again"})
	if err != nil || again.GetWorkflow().GetFailure().GetMessage() != "user pressed stop" {
		t.Errorf("second cancel: %v %v", again, err)
	}
	_, err = o.client.Signal(ctx, &orchestratorv1.SignalRequest{WorkflowId: "c1", Signal: &typesv1.SignalPayload{SignalType: "x"}})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("signal to a cancelled workflow: %v, want FAILED_PRECONDITION", err)
	}
}

func TestCustomAndSignalEffects(t *testing.T) { backends(t, testCustomAndSignalEffects) }

func testCustomAndSignalEffects(t *testing.T, start starter) {
	ctx := ctxT(t)
	stateAddr, _, _ := startState(t)
	custom := func(typ string) func(*operatorv1.OperatorInput) *typesv1.Effect {
		return func(*operatorv1.OperatorInput) *typesv1.Effect {
			return &typesv1.Effect{Kind: &typesv1.Effect_Custom{Custom: &typesv1.CustomEffect{EffectType: typ, Data: structpb.NewStringValue("hi")}}}
		}
	}
	signal := func(*operatorv1.OperatorInput) *typesv1.Effect {
		return &typesv1.Effect{Kind: &typesv1.Effect_Signal{Signal: &typesv1.SignalEffect{WorkflowId: "nobody", Payload: &typesv1.SignalPayload{SignalType: "ping"}}}}
	}
	logEff := func(*operatorv1.OperatorInput) *typesv1.Effect {
		return &typesv1.Effect{Kind: &typesv1.Effect_Log{Log: &typesv1.LogEffect{Level: typesv1.LogLevel_LOG_LEVEL_WARN, Message: "look"}}}
	}
	_, opAddr := startFake(t, map[string]behaviour{"x": answer("done", custom("acme.email/v1"), custom("acme.unknown/v1"), signal, logEff)})
	var handled []string
	o := start(t, registryYAML(t, agentsAt(opAddr, "x")...), stateAddr, orchOptions{engine: orchestrator.Options{
		Handlers: map[string]orchestrator.EffectHandler{"acme.email/v1": func(_ context.Context, wf, key string, data *structpb.Value) error {
			handled = append(handled, wf+"|"+key+"|"+data.GetStringValue())
			return nil
		}},
	}})
	resp, err := o.client.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: "x", WorkflowId: "fx", Input: userInput("go", "")})
	if err != nil {
		t.Fatal(err)
	}
	eff := resp.GetEffects()
	if len(eff) != 4 || !eff[0].GetApplied() || eff[1].GetApplied() || !strings.Contains(eff[1].GetDetail(), `no handler is registered for custom effect type "acme.unknown/v1"`) ||
		eff[2].GetApplied() || !strings.Contains(eff[2].GetDetail(), `"nobody" does not exist`) || !eff[3].GetApplied() {
		t.Errorf("effect outcomes = %v", eff)
	}
	if len(handled) != 1 || handled[0] != "fx|fx#1/effect/0|hi" {
		t.Errorf("handler calls = %v", handled)
	}
	// The log effect's event is in the workflow's log, before the
	// effect's own outcome.
	evs, _ := readLog(t, o, "fx", 0, nil)
	logs := 0
	for i, e := range evs {
		if e.typ != "operator.log" {
			continue
		}
		logs++
		if e.ev.GetObservable().GetData().GetStructValue().AsMap()["message"] != "look" ||
			i+1 >= len(evs) || evs[i+1].typ != "orchestrator.effect.applied" {
			t.Errorf("log effect event %v in %v", e.ev, evs)
		}
	}
	if logs != 1 {
		t.Errorf("%d operator.log events in the log, want 1: %v", logs, evs)
	}
	o.replayed(t, "fx", "custom-signal-log-effects")
}

// haltingMiddleware halts dispatches of agent "forbidden" and rewrites
// the task given to agent "echo".
type haltingMiddleware struct {
	middlewarev1.UnimplementedMiddlewareServiceServer
}

func (haltingMiddleware) Describe(context.Context, *middlewarev1.DescribeRequest) (*middlewarev1.DescribeResponse, error) {
	return &middlewarev1.DescribeResponse{Name: "policy", Subscriptions: []*middlewarev1.Subscription{
		{Boundary: middlewarev1.Boundary_BOUNDARY_DISPATCH, Phase: middlewarev1.Phase_PHASE_BEFORE}}}, nil
}

func (haltingMiddleware) InterceptDispatch(_ context.Context, req *middlewarev1.InterceptDispatchRequest) (*middlewarev1.InterceptDispatchResponse, error) {
	switch req.GetAgentId() {
	case "forbidden":
		return &middlewarev1.InterceptDispatchResponse{Verdict: &middlewarev1.Verdict{Kind: middlewarev1.VerdictKind_VERDICT_KIND_HALT, Reason: "agent is disabled by policy"}}, nil
	case "echo":
		in := req.GetInput()
		in.Message = content.Text("rewritten by policy")
		return &middlewarev1.InterceptDispatchResponse{Verdict: &middlewarev1.Verdict{Kind: middlewarev1.VerdictKind_VERDICT_KIND_MODIFY}, Input: in}, nil
	}
	return &middlewarev1.InterceptDispatchResponse{Verdict: &middlewarev1.Verdict{Kind: middlewarev1.VerdictKind_VERDICT_KIND_CONTINUE}}, nil
}

func TestRemoteMiddlewareAtDispatchBoundary(t *testing.T) {
	backends(t, testRemoteMiddlewareAtDispatchBoundary)
}

func testRemoteMiddlewareAtDispatchBoundary(t *testing.T, start starter) {
	ctx := ctxT(t)
	stateAddr, _, _ := startState(t)
	echo := func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
		return done(in, "got: "+content.TextOf(in.GetMessage()), "0"), nil
	}
	fake, opAddr := startFake(t, map[string]behaviour{"forbidden": echo, "echo": echo})
	mwAddr := harness.ServeFake(t, "test", func(s *grpcserver.Server) { middlewarev1.RegisterMiddlewareServiceServer(s, haltingMiddleware{}) })
	m, err := remote.New(ctx, middlewarev1.NewMiddlewareServiceClient(dial(t, mwAddr)), remote.Config{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	o := start(t, registryYAML(t, agentsAt(opAddr, "forbidden", "echo")...), stateAddr,
		orchOptions{chain: []grpc.UnaryClientInterceptor{m.DispatchClientInterceptor()}})
	_, err = o.client.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: "forbidden", Input: userInput("hello", "")})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "agent is disabled by policy") {
		t.Errorf("halted dispatch: %v, want PERMISSION_DENIED with the policy's reason", err)
	}
	if n := len(fake.inputs("forbidden")); n != 0 {
		t.Errorf("a halted dispatch reached the operator %d times", n)
	}
	resp, err := o.client.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: "echo", Input: userInput("hello", "")})
	if err != nil || content.TextOf(resp.GetOutput().GetMessage()) != "got: rewritten by policy" {
		t.Errorf("rewritten dispatch: %v %v", resp, err)
	}
}

func TestResumeAfterRestartDoesNotRepeatJournaledCalls(t *testing.T) {
	ctx := ctxT(t)
	stateAddr, _, writes := startState(t)
	release := make(chan struct{})
	childStarted := make(chan struct{}, 4)
	fake, opAddr := startFake(t, map[string]behaviour{
		"parent": firstTime(answer("delegating", writeMem("p", 1), delegateTo("child", "work")), answer("all done")),
		"child": func(ctx context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			childStarted <- struct{}{}
			select {
			case <-release:
				return done(in, "child result", "0", writeMem("c", 2)(in)), nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		},
	})
	dir := t.TempDir()
	reg := registryYAML(t, agentsAt(opAddr, "parent", "child")...)
	first := startOrch(t, dir, reg, stateAddr, orchOptions{})
	if _, err := first.client.StartWorkflow(ctx, &orchestratorv1.StartWorkflowRequest{WorkflowId: "r1", AgentId: "parent", Input: userInput("go", "")}); err != nil {
		t.Fatal(err)
	}
	<-childStarted
	first.stop() // pauses the workflow mid-delegation, as a SIGTERM would
	close(release)
	second := startOrch(t, dir, reg, stateAddr, orchOptions{})
	rec := waitStatus(t, second, "r1", orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)
	if got := content.TextOf(rec.GetLastOutput().GetMessage()); got != "all done" {
		t.Errorf("final output %q", got)
	}
	if n := len(fake.inputs("parent")); n != 2 {
		t.Errorf("parent called %d times, want 2 (its first call was journaled before the restart)", n)
	}
	if n := len(fake.inputs("child")); n != 2 {
		t.Errorf("child called %d times, want 2 (in flight at the stop, so called again)", n)
	}
	for _, k := range []string{"p", "c"} {
		if n := writes.count(scope.Workflow("r1"), k); n != 1 {
			t.Errorf("%s applied %d times, want 1", k, n)
		}
	}
}

// A workflow keeps the limits it started with: an orchestrator restarted
// with a lower --max-delegation-depth does not fail the delegation chain
// a running workflow was already allowed.
func TestResumeKeepsTheLimitsItStartedWith(t *testing.T) {
	ctx := ctxT(t)
	stateAddr, _, _ := startState(t)
	release := make(chan struct{})
	leafStarted := make(chan struct{}, 4)
	_, opAddr := startFake(t, map[string]behaviour{
		"top": firstTime(answer("delegating", delegateTo("mid", "work")), answer("all done")),
		"mid": firstTime(answer("delegating", delegateTo("leaf", "work")), answer("mid done")),
		"leaf": func(ctx context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			leafStarted <- struct{}{}
			select {
			case <-release:
				return done(in, "leaf result", "0"), nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		},
	})
	dir := t.TempDir()
	reg := registryYAML(t, agentsAt(opAddr, "top", "mid", "leaf")...)
	first := startOrch(t, dir, reg, stateAddr, orchOptions{})
	if _, err := first.client.StartWorkflow(ctx, &orchestratorv1.StartWorkflowRequest{WorkflowId: "deep", AgentId: "top", Input: userInput("go", "")}); err != nil {
		t.Fatal(err)
	}
	<-leafStarted // depth 2, allowed by the default limit
	first.stop()
	close(release)
	second := startOrch(t, dir, reg, stateAddr, orchOptions{engine: orchestrator.Options{MaxDepth: 1}})
	rec := waitStatus(t, second, "deep", orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)
	if got := content.TextOf(rec.GetLastOutput().GetMessage()); got != "all done" {
		t.Errorf("final output %q", got)
	}
	// A workflow started now gets the new limit.
	_, err := second.client.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: "top", Input: userInput("go", "")})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "depth limit of 1") {
		t.Errorf("a new workflow under the lower limit: %v, want FAILED_PRECONDITION naming the limit", err)
	}
}

func waitStatus(t *testing.T, o *orch, id string, want orchestratorv1.WorkflowStatus) *orchestratorv1.Workflow {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := o.client.GetWorkflow(context.Background(), &orchestratorv1.GetWorkflowRequest{WorkflowId: id})
		if err == nil && r.GetWorkflow().GetStatus() == want {
			return r.GetWorkflow()
		}
		if time.Now().After(deadline) {
			t.Fatalf("workflow %s: %v %v, want %v", id, r.GetWorkflow(), err, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRequestErrors(t *testing.T) { backends(t, testRequestErrors) }

func testRequestErrors(t *testing.T, start starter) {
	ctx := ctxT(t)
	stateAddr, _, _ := startState(t)
	_, opAddr := startFake(t, map[string]behaviour{"ok": answer("ok")})
	o := start(t, registryYAML(t, agentsAt(opAddr, "ok")...), stateAddr, orchOptions{})
	for i := range 5 {
		if _, err := o.client.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: "ok", Input: userInput(strings.Repeat("x", i+1), "")}); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name string
		call func() error
		code codes.Code
		msg  string
	}{
		{"unknown agent", func() error {
			_, err := o.client.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: "nope", Input: userInput("x", "")})
			return err
		}, codes.NotFound, `agent "nope" is not in the agent registry`},
		{"no input", func() error {
			_, err := o.client.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: "ok"})
			return err
		}, codes.InvalidArgument, "input"},
		{"unknown workflow", func() error {
			_, err := o.client.Query(ctx, &orchestratorv1.QueryRequest{WorkflowId: "nope", QueryType: "status"})
			return err
		}, codes.NotFound, `workflow "nope" does not exist`},
		{"unknown query", func() error {
			wf, _ := o.client.ListWorkflows(ctx, &orchestratorv1.ListWorkflowsRequest{PageSize: 1})
			_, err := o.client.Query(ctx, &orchestratorv1.QueryRequest{WorkflowId: wf.GetWorkflows()[0].GetWorkflowId(), QueryType: "vibes"})
			return err
		}, codes.InvalidArgument, `unknown query_type "vibes"`},
		{"forged page token", func() error {
			_, err := o.client.ListWorkflows(ctx, &orchestratorv1.ListWorkflowsRequest{PageToken: "AQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"})
			return err
		}, codes.InvalidArgument, "page_token"},
		{"signal unknown workflow", func() error {
			_, err := o.client.Signal(ctx, &orchestratorv1.SignalRequest{WorkflowId: "nope", Signal: &typesv1.SignalPayload{SignalType: "x"}})
			return err
		}, codes.NotFound, "nope"},
	}
	for _, tt := range tests {
		err := tt.call()
		if status.Code(err) != tt.code || !strings.Contains(status.Convert(err).Message(), tt.msg) {
			t.Errorf("%s: %v, want %v containing %q", tt.name, err, tt.code, tt.msg)
		}
	}
	// Paging: 5 completed workflows, newest first, two per page.
	var ids []string
	token := ""
	for {
		page, err := o.client.ListWorkflows(ctx, &orchestratorv1.ListWorkflowsRequest{
			Status: orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED, PageSize: 2, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range page.GetWorkflows() {
			ids = append(ids, w.GetWorkflowId())
		}
		if token = page.GetNextPageToken(); token == "" {
			break
		}
	}
	if len(ids) != 5 {
		t.Fatalf("listed %d workflows, want 5: %v", len(ids), ids)
	}
	for i := 1; i < len(ids); i++ {
		if ids[i] >= ids[i-1] {
			t.Errorf("not newest first: %v", ids)
		}
	}
	if page, err := o.client.ListWorkflows(ctx, &orchestratorv1.ListWorkflowsRequest{Status: orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED}); err != nil || len(page.GetWorkflows()) != 0 {
		t.Errorf("failed workflows: %v %v", page, err)
	}
}

func TestSuspendAndResumeBySignals(t *testing.T) { backends(t, testSuspendAndResumeBySignals) }

func testSuspendAndResumeBySignals(t *testing.T, start starter) {
	ctx := ctxT(t)
	stateAddr, _, _ := startState(t)
	fake, opAddr := startFake(t, map[string]behaviour{
		"approver": func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			for _, s := range in.GetMetadata().GetFields()["signals"].GetListValue().GetValues() {
				if s.GetStructValue().GetFields()["signal_type"].GetStringValue() == "approve" {
					return done(in, "approved", "0"), nil
				}
			}
			return &operatorv1.OperatorOutput{
				Message: content.Text("waiting for approval"),
				ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_SUSPENDED,
					Suspension: &operatorv1.Suspension{ResumeToken: "tok-1", Prompt: "approve?"}},
				Metadata: &operatorv1.OperatorMetadata{Cost: money.FromDecimal(decimal.Zero)},
			}, nil
		},
	})
	o := start(t, registryYAML(t, agentsAt(opAddr, "approver")...), stateAddr, orchOptions{})
	if _, err := o.client.StartWorkflow(ctx, &orchestratorv1.StartWorkflowRequest{WorkflowId: "s1", AgentId: "approver", Input: userInput("deploy?", "")}); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, o, "s1", orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED)
	sig := func(typ, key string) *orchestratorv1.SignalResponse {
		r, err := o.client.Signal(ctx, &orchestratorv1.SignalRequest{WorkflowId: "s1", IdempotencyKey: key,
			Signal: &typesv1.SignalPayload{SignalType: typ, Data: structpb.NewStringValue(typ + "-data")}})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := sig("comment", "k1"); r.GetSequence() != 1 || r.GetDuplicate() {
		t.Errorf("first signal = %v", r)
	}
	if r := sig("comment", "k1"); r.GetSequence() != 1 || !r.GetDuplicate() {
		t.Errorf("repeated key = %v, want sequence 1 duplicate", r)
	}
	waitStatus(t, o, "s1", orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED)
	for len(fake.inputs("approver")) < 2 {
		time.Sleep(5 * time.Millisecond)
	}
	sig("approve", "k2")
	wf := waitStatus(t, o, "s1", orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)
	if got := content.TextOf(wf.GetLastOutput().GetMessage()); got != "approved" {
		t.Errorf("final output %q", got)
	}
	var seqs []float64
	for i, in := range fake.inputs("approver") {
		if i > 0 && (in.GetResume().GetResumeToken() != "tok-1" || in.GetTrigger() != operatorv1.TriggerType_TRIGGER_TYPE_SIGNAL) {
			t.Errorf("call %d: resume %v trigger %v, want the suspension's token and SIGNAL", i, in.GetResume(), in.GetTrigger())
		}
		for _, s := range in.GetMetadata().GetFields()["signals"].GetListValue().GetValues() {
			seqs = append(seqs, s.GetStructValue().GetFields()["sequence"].GetNumberValue())
		}
	}
	if len(seqs) != 2 || seqs[0] != 1 || seqs[1] != 2 {
		t.Errorf("signals delivered %v, want [1 2] once each in order", seqs)
	}
	if in := fake.inputs("approver"); len(in) == 3 && in[2].GetResume().GetDecision().GetStringValue() != "approve-data" {
		t.Errorf("decision = %v, want the signal's data", in[2].GetResume().GetDecision())
	}
	o.replayed(t, "s1", "suspend-resume-signals")
}

func TestDispatchCallerDeadlineAndCancel(t *testing.T) {
	backends(t, testDispatchCallerDeadlineAndCancel)
}

func testDispatchCallerDeadlineAndCancel(t *testing.T, start starter) {
	ctx := ctxT(t)
	stateAddr, _, _ := startState(t)
	calls := make(chan string, 16) // workflow ids
	_, opAddr := startFake(t, map[string]behaviour{
		"slow": func(ctx context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			calls <- in.GetDispatch().GetWorkflowId()
			<-ctx.Done()
			return nil, ctx.Err()
		},
	})
	o := start(t, registryYAML(t, agentsAt(opAddr, "slow")...), stateAddr, orchOptions{})

	dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := o.client.Dispatch(dctx, &orchestratorv1.DispatchRequest{AgentId: "slow", WorkflowId: "late", Input: userInput("x", "")})
	cancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("past the caller's deadline: %v, want DEADLINE_EXCEEDED", err)
	}
	wf := waitStatus(t, o, "late", orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED)
	if codes.Code(wf.GetFailure().GetCode()) != codes.DeadlineExceeded || !strings.Contains(wf.GetFailure().GetMessage(), "deadline") {
		t.Errorf("failure = %v, want DEADLINE_EXCEEDED", wf.GetFailure())
	}
	q, err := o.client.Query(ctx, &orchestratorv1.QueryRequest{WorkflowId: "late", QueryType: "steps"})
	if err != nil {
		t.Fatal(err)
	}
	steps := q.GetResult().GetListValue().GetValues()
	if len(steps) != 1 || steps[0].GetStructValue().GetFields()["state"].GetStringValue() != "failed" ||
		!strings.Contains(steps[0].GetStructValue().GetFields()["error"].GetStringValue(), "deadline") {
		t.Errorf("steps = %s, want the one step failed on the deadline", jsonOf(t, q.GetResult()))
	}

	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := o.client.Dispatch(cctx, &orchestratorv1.DispatchRequest{AgentId: "slow", WorkflowId: "gone", Input: userInput("x", "")})
		errc <- err
	}()
	// Cancel once this workflow's call is in flight (the first one's
	// may or may not have started before its deadline).
	for id := range calls {
		if id == "gone" {
			break
		}
	}
	cancel()
	if err := <-errc; status.Code(err) != codes.Canceled {
		t.Errorf("cancelled by the caller: %v, want CANCELED", err)
	}
	wf = waitStatus(t, o, "gone", orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED)
	if !strings.Contains(wf.GetFailure().GetMessage(), "Dispatch caller cancelled") {
		t.Errorf("failure = %v", wf.GetFailure())
	}
	o.replayed(t, "gone", "caller-cancel")
	o.replayed(t, "late", "caller-deadline")
}
