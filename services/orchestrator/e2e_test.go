package orchestrator_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/scope"
)

// The three agents of the end-to-end workflow, on the real operator with
// the scripted model: the planner writes memory and delegates research;
// given the results it hands off to the writer, who answers.
func e2eAgents(opAddr string) []map[string]any {
	planner := script([]map[string]any{
		{"text": "Planning.", "tool_calls": []any{
			call("write_memory", map[string]any{"scope": "workflow", "key": "plan", "value": "research, then write"}),
			call("delegate", map[string]any{"agent_id": "researcher", "message": "Find three facts."}),
		}, "cost": "0.01"},
		{"text": "Research delegated.", "cost": "0.01"},
	}, map[string]any{"contains": "Results of delegated tasks", "turns": []any{
		map[string]any{"tool_calls": []any{call("handoff", map[string]any{"agent_id": "writer", "state": map[string]any{"facts": 3}})}, "cost": "0.01"},
		map[string]any{"text": "Handing off to the writer.", "cost": "0.01"},
	}})
	researcher := script([]map[string]any{
		{"tool_calls": []any{call("write_memory", map[string]any{"scope": "workflow", "key": "facts", "value": []any{"a", "b", "c"}})}, "cost": "0.02"},
		{"text": "Facts: a, b, c.", "cost": "0.02"},
	})
	writer := script([]map[string]any{{"text": "Report: a, b and c.", "cost": "0.005"}})
	return []map[string]any{
		{"id": "planner", "operator": opAddr, "metadata": planner},
		{"id": "researcher", "operator": opAddr, "metadata": researcher},
		{"id": "writer", "operator": opAddr, "metadata": writer},
	}
}

func userInput(text, session string) *operatorv1.OperatorInput {
	in := &operatorv1.OperatorInput{Message: content.Text(text), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_USER}
	if session != "" {
		in.SessionId = &session
	}
	return in
}

func TestEndToEndDelegateHandoffHistory(t *testing.T) {
	stateAddr, st, writes := startState(t)
	opAddr := startOperator(t, stateAddr)
	o := startOrch(t, t.TempDir(), registryYAML(t, e2eAgents(opAddr)...), stateAddr, orchOptions{})
	testEndToEnd(t, o, st, writes)
}

// testEndToEnd runs the three agents of e2eAgents through o: a
// delegation, a handoff, memory written once, session history kept,
// queries, events and a repeated Dispatch.
func testEndToEnd(t *testing.T, o *orch, st statev1.StateServiceClient, writes *writeCounter) {
	ctx := ctxT(t)

	resp, err := o.client.Dispatch(ctx, &orchestratorv1.DispatchRequest{
		AgentId: "planner", WorkflowId: "wf-e2e-1", Input: userInput("Write a report.", "s1"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := content.TextOf(resp.GetOutput().GetMessage()); got != "Report: a, b and c." {
		t.Fatalf("final output %q, want the writer's answer", got)
	}
	// planner (0.02) + researcher (0.04) + planner again (0.02) + writer (0.005)
	if resp.GetTotalCost().GetAmount() != "0.085" {
		t.Errorf("total cost %s, want 0.085", resp.GetTotalCost().GetAmount())
	}
	// History (x3: the researcher has no session), write_memory (x2),
	// delegate, handoff: all applied.
	if len(resp.GetEffects()) != 7 {
		t.Errorf("%d effect outcomes, want 7: %v", len(resp.GetEffects()), resp.GetEffects())
	}
	for _, e := range resp.GetEffects() {
		if !e.GetApplied() {
			t.Errorf("effect %s not applied: %s", e.GetIdempotencyKey(), e.GetDetail())
		}
	}
	// Memory written through the State service, once each.
	for key, want := range map[string]string{"plan": `"research, then write"`, "facts": `["a","b","c"]`} {
		r, err := st.Read(ctx, &statev1.ReadRequest{Scope: scope.Workflow("wf-e2e-1"), Key: key})
		if err != nil {
			t.Fatalf("read %s: %v", key, err)
		}
		if got, n := jsonOf(t, r.GetValue()), writes.count(scope.Workflow("wf-e2e-1"), key); got != want || n != 1 {
			t.Errorf("%s = %s (applied %d times), want %s applied once", key, got, n, want)
		}
	}
	// The session's conversation: planner twice and the writer (the
	// researcher ran in a fresh session).
	if n := countKeys(t, st, scope.Session("s1"), "conversation/"); n != 3 {
		t.Errorf("session s1 has %d conversation entries after one dispatch, want 3", n)
	}

	q, err := o.client.Query(ctx, &orchestratorv1.QueryRequest{WorkflowId: "wf-e2e-1", QueryType: "status"})
	if err != nil {
		t.Fatal(err)
	}
	m := q.GetResult().GetStructValue().AsMap()
	if m["status"] != "COMPLETED" || m["current_agent"] != "writer" || m["steps"] != 4.0 || m["spent"] != "0.085" {
		t.Errorf("status query = %v", m)
	}
	steps, err := o.client.Query(ctx, &orchestratorv1.QueryRequest{WorkflowId: "wf-e2e-1", QueryType: "steps"})
	if err != nil {
		t.Fatal(err)
	}
	var agents []string
	for _, s := range steps.GetResult().GetListValue().AsSlice() {
		item := s.(map[string]any)
		agents = append(agents, item["agent"].(string))
		if item["agent"] == "researcher" && item["depth"] != 1.0 {
			t.Errorf("researcher at depth %v, want 1", item["depth"])
		}
	}
	if got := strings.Join(agents, ","); got != "planner,researcher,planner,writer" {
		t.Errorf("steps ran %s", got)
	}

	// A second dispatch in the same session sees the stored history and
	// adds to it.
	resp2, err := o.client.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: "writer", Input: userInput("Again.", "s1")})
	if err != nil {
		t.Fatal(err)
	}
	if resp2.GetWorkflowId() == "wf-e2e-1" || resp2.GetWorkflowId() == "" {
		t.Errorf("second dispatch ran in workflow %q", resp2.GetWorkflowId())
	}
	if n := countKeys(t, st, scope.Session("s1"), "conversation/"); n != 4 {
		t.Errorf("session s1 has %d conversation entries after two dispatches, want 4", n)
	}
	if tokens := resp2.GetOutput().GetMetadata().GetTokensIn(); tokens <= resp.GetOutput().GetMetadata().GetTokensIn() {
		t.Errorf("second dispatch read %d input tokens, first %d: history was not in context", tokens, resp.GetOutput().GetMetadata().GetTokensIn())
	}

	// Events, from the workflow's log: one dispatch.completed and one
	// CostIncurred per operator call.
	evs, ended := readLog(t, o, "wf-e2e-1", 0, nil)
	costs := 0
	for _, e := range evs {
		if e.ev.GetBudget().GetCostIncurred() != nil {
			costs++
		}
	}
	if completed := count(evs, "orchestrator.dispatch.completed"); !ended || completed != 4 || costs != 4 {
		t.Errorf("events: %d dispatch.completed and %d cost_incurred (log ended: %v), want 4 each: %v", completed, costs, ended, evs)
	}

	// A repeated Dispatch with the same id and request returns the
	// recorded result; a different request reusing the id is refused.
	again, err := o.client.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: "planner", WorkflowId: "wf-e2e-1", Input: userInput("Write a report.", "s1")})
	if err != nil {
		t.Fatal(err)
	}
	if content.TextOf(again.GetOutput().GetMessage()) != "Report: a, b and c." || countKeys(t, st, scope.Session("s1"), "conversation/") != 4 {
		t.Errorf("a repeated Dispatch ran again")
	}
	_, err = o.client.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: "planner", WorkflowId: "wf-e2e-1", Input: userInput("Something else.", "s1")})
	if status.Code(err) != codes.AlreadyExists {
		t.Errorf("different request for a finished workflow: %v, want ALREADY_EXISTS", err)
	}
	o.replayed(t, "wf-e2e-1", "delegate-handoff-history")
}

func countKeys(t *testing.T, st statev1.StateServiceClient, sc *typesv1.Scope, prefix string) int {
	t.Helper()
	l, err := st.List(context.Background(), &statev1.ListRequest{Scope: sc, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return len(l.GetItems())
}
