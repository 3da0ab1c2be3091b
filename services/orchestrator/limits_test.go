package orchestrator_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/money"
	"github.com/secbear/neuron/services/orchestrator"
	"github.com/shopspring/decimal"
)

// spendingAgents are a boss that delegates to a worker and then answers
// with the worker's result, each call costing 0.10 USD: three operator
// calls in all.
func spendingAgents() map[string]behaviour {
	cost := func(text string) behaviour {
		return func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			return done(in, text, "0.10"), nil
		}
	}
	return map[string]behaviour{
		"boss": firstTime(func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			return done(in, "delegating", "0.10", delegateTo("worker", "work")(in)), nil
		}, cost("boss done")),
		"worker": cost("worker done"),
	}
}

func startBoss(t *testing.T, o *orch, budget string) string {
	t.Helper()
	req := &orchestratorv1.StartWorkflowRequest{AgentId: "boss", Input: &operatorv1.OperatorInput{Message: content.Text("go")}}
	if budget != "" {
		req.Budget = money.FromDecimal(decimal.RequireFromString(budget))
	}
	return must[*orchestratorv1.StartWorkflowResponse](t)(o.client.StartWorkflow(ctxT(t), req)).GetWorkflowId()
}

func limits(o *orch, req *orchestratorv1.UpdateWorkflowLimitsRequest) (*orchestratorv1.UpdateWorkflowLimitsResponse, error) {
	return o.client.UpdateWorkflowLimits(context.Background(), req)
}

func usd(s string) *orchestratorv1.UpdateWorkflowLimitsRequest {
	return &orchestratorv1.UpdateWorkflowLimitsRequest{Budget: money.FromDecimal(decimal.RequireFromString(s))}
}

// maxCostOf is the cost cap an operator call was given.
func maxCostOf(t *testing.T, in *operatorv1.OperatorInput) string {
	t.Helper()
	if in.GetConfig().GetMaxCost() == nil {
		return "none"
	}
	d, err := money.Parse(in.GetConfig().GetMaxCost())
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

func TestBudgetRaise(t *testing.T) { backends(t, testBudgetRaise) }

// testBudgetRaise: with --on-limit=ask a workflow whose budget is spent
// waits, SUSPENDED with a limit request, before its next operator call; a
// raise resumes it with the raised cost cap, and it completes.
func testBudgetRaise(t *testing.T, start starter) {
	stateAddr, _, _ := startState(t)
	f, opAddr := startFake(t, spendingAgents())
	o := start(t, registryYAML(t, agentsAt(opAddr, "boss", "worker")...), stateAddr, orchOptions{engine: orchestrator.Options{AskLimits: true}})
	id := startBoss(t, o, "0.15")
	wf := waitStatus(t, o, id, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED)
	req := wf.GetLimitRequest()
	if req.GetKind() != orchestratorv1.LimitKind_LIMIT_KIND_BUDGET || req.GetAgentId() != "worker" || req.GetSteps() != 2 {
		t.Fatalf("limit request = %v, want the budget, after 2 calls", req)
	}
	if spent, _ := money.Parse(req.GetSpent()); spent.String() != "0.2" {
		t.Fatalf("limit request spent = %v, want 0.2", req.GetSpent())
	}
	if n := len(wf.GetPendingApprovals()); n != 0 {
		t.Fatalf("a limit request listed as %d tool approvals", n)
	}
	inbox := must[*orchestratorv1.ListApprovalsResponse](t)(o.client.ListApprovals(ctxT(t), &orchestratorv1.ListApprovalsRequest{WorkflowId: id}))
	if a := inbox.GetApprovals(); len(a) != 1 || a[0].GetLimitRequest().GetKind() != orchestratorv1.LimitKind_LIMIT_KIND_BUDGET || a[0].GetToolCall() != nil {
		t.Fatalf("ListApprovals = %v, want the limit request", a)
	}
	if n := len(f.inputs("")); n != 2 {
		t.Fatalf("operator calls while waiting = %d, want 2 (the third waits for the raise)", n)
	}

	_, err := limits(o, &orchestratorv1.UpdateWorkflowLimitsRequest{WorkflowId: id})
	wantCode(t, err, codes.InvalidArgument, "nothing to change")
	bad := usd("0")
	bad.WorkflowId = id
	_, err = limits(o, bad)
	wantCode(t, err, codes.InvalidArgument, "give a positive amount")
	both := usd("1")
	both.WorkflowId, both.Reject = id, true
	_, err = limits(o, both)
	wantCode(t, err, codes.InvalidArgument, "cannot also set")
	nope := usd("1")
	nope.WorkflowId = "wf-nope"
	_, err = limits(o, nope)
	wantCode(t, err, codes.NotFound, "")

	raise := usd("1.00")
	raise.WorkflowId, raise.Reason, raise.IdempotencyKey = id, "worth it", "raise-1"
	first := must[*orchestratorv1.UpdateWorkflowLimitsResponse](t)(limits(o, raise))
	again := must[*orchestratorv1.UpdateWorkflowLimitsResponse](t)(limits(o, raise))
	if first.GetDuplicate() || !again.GetDuplicate() || again.GetSequence() != first.GetSequence() {
		t.Fatalf("raise = %v, retry = %v: want the retry a duplicate of the first", first, again)
	}
	wf = waitStatus(t, o, id, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)
	if got := content.TextOf(wf.GetLastOutput().GetMessage()); got != "boss done" {
		t.Fatalf("last output = %q", got)
	}
	if b, _ := money.Parse(wf.GetBudget()); b.String() != "1" {
		t.Fatalf("the workflow's budget = %v, want the raised 1", wf.GetBudget())
	}
	boss := f.inputs("boss")
	if len(boss) != 2 || maxCostOf(t, boss[1]) != "0.8" {
		t.Fatalf("the boss's second call: %d calls, cost cap %s; want the raised budget's 0.8 left", len(boss), maxCostOf(t, boss[len(boss)-1]))
	}
	if got := content.TextOf(boss[1].GetMessage()); strings.Contains(got, "[signal limits") {
		t.Fatalf("the limits change was shown to the operator: %q", got)
	}
	events := eventTypes(t, o, id)
	for _, want := range []string{"orchestrator.workflow.suspended", "orchestrator.signal.accepted", "orchestrator.workflow.limits_changed", "orchestrator.workflow.completed"} {
		if !strings.Contains(events, want) {
			t.Fatalf("events %s lack %s", events, want)
		}
	}
	_, err = limits(o, raise)
	wantCode(t, err, codes.FailedPrecondition, "has ended")
	o.replayed(t, id, "")
}

// eventTypes lists workflow id's durable events by type.
func eventTypes(t *testing.T, o *orch, id string) string {
	t.Helper()
	stream, err := o.client.WatchWorkflow(ctxT(t), &orchestratorv1.WatchWorkflowRequest{WorkflowId: id, OmitProgress: true})
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for {
		resp, err := stream.Recv()
		if err != nil {
			break
		}
		if ev := resp.GetEvent().GetObservable(); ev != nil {
			types = append(types, ev.GetEventType())
		}
	}
	return strings.Join(types, " ")
}

func TestLimitRefused(t *testing.T) { backends(t, testLimitRefused) }

// testLimitRefused: refusing the raise ends the waiting workflow as the
// limit would have, with the reason; the operator is not called again.
func testLimitRefused(t *testing.T, start starter) {
	stateAddr, _, _ := startState(t)
	f, opAddr := startFake(t, spendingAgents())
	o := start(t, registryYAML(t, agentsAt(opAddr, "boss", "worker")...), stateAddr, orchOptions{engine: orchestrator.Options{AskLimits: true, MaxSteps: 2}})
	id := startBoss(t, o, "")
	wf := waitStatus(t, o, id, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED)
	if req := wf.GetLimitRequest(); req.GetKind() != orchestratorv1.LimitKind_LIMIT_KIND_MAX_STEPS || req.GetMaxSteps() != 2 || req.GetSteps() != 2 {
		t.Fatalf("limit request = %v, want max steps 2 reached", req)
	}
	must[*orchestratorv1.UpdateWorkflowLimitsResponse](t)(limits(o, &orchestratorv1.UpdateWorkflowLimitsRequest{WorkflowId: id, Reject: true, Reason: "loops"}))
	wf = waitStatus(t, o, id, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED)
	if f := wf.GetFailure(); codes.Code(f.GetCode()) != codes.FailedPrecondition || !strings.Contains(f.GetMessage(), "the raise was refused: loops") {
		t.Fatalf("failure = %v", f)
	}
	if n := len(f.inputs("")); n != 2 {
		t.Fatalf("operator calls = %d, want 2", n)
	}
	_, err := limits(o, &orchestratorv1.UpdateWorkflowLimitsRequest{WorkflowId: id, Reject: true})
	wantCode(t, err, codes.FailedPrecondition, "has ended")
}

func TestMaxStepsRaise(t *testing.T) { backends(t, testMaxStepsRaise) }

// testMaxStepsRaise: a workflow at its limit of operator calls goes on
// once the limit is raised; a reject while it runs and waits for nothing
// is refused.
func testMaxStepsRaise(t *testing.T, start starter) {
	stateAddr, _, _ := startState(t)
	_, opAddr := startFake(t, spendingAgents())
	o := start(t, registryYAML(t, agentsAt(opAddr, "boss", "worker")...), stateAddr, orchOptions{engine: orchestrator.Options{AskLimits: true, MaxSteps: 2}})
	// A Dispatch returns when the workflow suspends at the limit, saying
	// so (not with the last call's answer as the end).
	resp := must[*orchestratorv1.DispatchResponse](t)(o.client.Dispatch(ctxT(t), &orchestratorv1.DispatchRequest{AgentId: "boss",
		Input: &operatorv1.OperatorInput{Message: content.Text("go")}}))
	id := resp.GetWorkflowId()
	if ex := resp.GetOutput().GetExitReason(); ex.GetKind() != operatorv1.ExitKind_EXIT_KIND_SUSPENDED ||
		!strings.Contains(ex.GetSuspension().GetPrompt(), "made 2 of its 2 operator calls and waits for a raise") {
		t.Fatalf("the Dispatch's exit = %v", ex)
	}
	_, err := limits(o, &orchestratorv1.UpdateWorkflowLimitsRequest{WorkflowId: id, MaxSteps: 2000000})
	wantCode(t, err, codes.InvalidArgument, "max_steps")
	must[*orchestratorv1.UpdateWorkflowLimitsResponse](t)(limits(o, &orchestratorv1.UpdateWorkflowLimitsRequest{WorkflowId: id, MaxSteps: 3}))
	wf := waitStatus(t, o, id, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)
	if wf.GetSteps() != 3 || wf.GetLimitRequest() != nil {
		t.Fatalf("workflow = %v, want 3 steps and no limit request", wf)
	}
	o.replayed(t, id, "")
}

func TestRaiseWhileRunning(t *testing.T) { backends(t, testRaiseWhileRunning) }

// testRaiseWhileRunning: without --on-limit=ask, a raise sent while the
// workflow runs reaches its next operator call: its cost cap is the
// raised one and the workflow does not halt where the old budget would
// have halted it.
func testRaiseWhileRunning(t *testing.T, start starter) {
	stateAddr, _, _ := startState(t)
	agents := spendingAgents()
	release := make(chan struct{})
	boss := agents["boss"]
	agents["boss"] = func(ctx context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
		if _, ok := in.GetMetadata().GetFields()["delegations"]; !ok {
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return boss(ctx, in)
	}
	f, opAddr := startFake(t, agents)
	o := start(t, registryYAML(t, agentsAt(opAddr, "boss", "worker")...), stateAddr, orchOptions{})
	id := startBoss(t, o, "0.15")
	for len(f.inputs("boss")) == 0 {
		waitStatus(t, o, id, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING)
	}
	raise := usd("1")
	raise.WorkflowId = id
	must[*orchestratorv1.UpdateWorkflowLimitsResponse](t)(limits(o, raise))
	close(release)
	wf := waitStatus(t, o, id, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)
	if w := f.inputs("worker"); len(w) != 1 || maxCostOf(t, w[0]) != "0.9" {
		t.Fatalf("the worker's cost cap = %s, want 0.9 (the raised budget less 0.10 spent)", maxCostOf(t, w[0]))
	}
	if wf.GetSteps() != 3 {
		t.Fatalf("steps = %d, want 3", wf.GetSteps())
	}
	if got := content.TextOf(f.inputs("worker")[0].GetMessage()); got != "work" {
		t.Fatalf("the worker's message = %q: the limits change must not reach the operator", got)
	}
}

func TestLimitWaitSurvivesRestart(t *testing.T) {
	stateAddr, _, _ := startState(t)
	f, opAddr := startFake(t, spendingAgents())
	dir := t.TempDir()
	registry := registryYAML(t, agentsAt(opAddr, "boss", "worker")...)
	opts := orchOptions{engine: orchestrator.Options{AskLimits: true}}
	o := startOrch(t, dir, registry, stateAddr, opts)
	id := startBoss(t, o, "0.15")
	waitStatus(t, o, id, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED)
	o.stop()

	o = startOrch(t, dir, registry, stateAddr, opts)
	wf := waitStatus(t, o, id, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED)
	if wf.GetLimitRequest().GetKind() != orchestratorv1.LimitKind_LIMIT_KIND_BUDGET {
		t.Fatalf("after a restart the limit request is %v", wf.GetLimitRequest())
	}
	// A signal of another kind does not get past the limit, and does not
	// end the wait: it is delivered with the call a raise lets through.
	data, _ := structpb.NewValue("hello")
	_, err := o.client.Signal(ctxT(t), &orchestratorv1.SignalRequest{WorkflowId: id, Signal: &typesv1.SignalPayload{SignalType: "message", Data: data}})
	if err != nil {
		t.Fatal(err)
	}
	raise := usd("1")
	raise.WorkflowId = id
	must[*orchestratorv1.UpdateWorkflowLimitsResponse](t)(limits(o, raise))
	wf = waitStatus(t, o, id, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)
	ins := f.inputs("boss")
	if len(f.inputs("")) != 3 || len(ins) != 2 {
		t.Fatalf("operator calls = %d (boss %d), want 3 (boss 2)", len(f.inputs("")), len(ins))
	}
	if got := content.TextOf(ins[1].GetMessage()); !strings.Contains(got, "[signal message #") || !strings.Contains(got, "hello") {
		t.Fatalf("the call after the raise got %q, want the message signal", got)
	}
}

func TestApprovalAtLimit(t *testing.T) { backends(t, testApprovalAtLimit) }

// testApprovalAtLimit: a workflow that suspended for tool approvals on
// its last allowed operator call takes the decision, then waits for a
// raise (the decision is not taken for "another signal"); the raise lets
// the resumed call through with the decision.
func testApprovalAtLimit(t *testing.T, start starter) {
	stateAddr, _, _ := startState(t)
	f, opAddr := startStreamingFake(t, map[string]streamBehaviour{
		"careful": func(_ context.Context, in *operatorv1.OperatorInput, _ func(*operatorv1.ExecuteStreamResponse)) (*operatorv1.OperatorOutput, error) {
			return approvalAgent(in)
		},
	})
	o := start(t, registryYAML(t, agentsAt(opAddr, "careful")...), stateAddr, orchOptions{engine: orchestrator.Options{AskLimits: true, MaxSteps: 1}})
	ctx := ctxT(t)
	id := must[*orchestratorv1.StartWorkflowResponse](t)(o.client.StartWorkflow(ctx, &orchestratorv1.StartWorkflowRequest{
		AgentId: "careful", Input: &operatorv1.OperatorInput{Message: content.Text("tidy up")}})).GetWorkflowId()
	if wf := waitStatus(t, o, id, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED); len(wf.GetPendingApprovals()) != 2 {
		t.Fatalf("pending approvals = %v, want 2", wf.GetPendingApprovals())
	}
	must[*orchestratorv1.DecideApprovalsResponse](t)(o.client.DecideApprovals(ctx, &orchestratorv1.DecideApprovalsRequest{WorkflowId: id, Decisions: []*operatorv1.ToolDecision{
		{ToolUseId: "call-1", Approved: true, DecidedBy: "alice"}, {ToolUseId: "call-2", Reason: "no", DecidedBy: "alice"}}}))
	var wf *orchestratorv1.Workflow
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		wf = must[*orchestratorv1.GetWorkflowResponse](t)(o.client.GetWorkflow(ctx, &orchestratorv1.GetWorkflowRequest{WorkflowId: id})).GetWorkflow()
		if wf.GetLimitRequest() != nil || wf.GetStatus() == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED || time.Now().After(deadline) {
			break
		}
	}
	if lr := wf.GetLimitRequest(); wf.GetStatus() != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED ||
		lr.GetKind() != orchestratorv1.LimitKind_LIMIT_KIND_MAX_STEPS || lr.GetSteps() != 1 || lr.GetMaxSteps() != 1 {
		t.Fatalf("after the decision: %v, want SUSPENDED waiting for a raise of its 1 operator call", wf)
	}
	if n := len(f.inputs("careful")); n != 1 {
		t.Fatalf("operator calls before the raise = %d, want 1", n)
	}
	must[*orchestratorv1.UpdateWorkflowLimitsResponse](t)(limits(o, &orchestratorv1.UpdateWorkflowLimitsRequest{WorkflowId: id, MaxSteps: 2}))
	wf = waitStatus(t, o, id, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)
	if got := content.TextOf(wf.GetLastOutput().GetMessage()); got != "decided call-1:true:-:alice call-2:false:-:alice" {
		t.Fatalf("the resumed call answered %q, want both decisions", got)
	}
}
