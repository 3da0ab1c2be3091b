package orchestrator_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/money"
	"github.com/shopspring/decimal"
)

// delegateBrief is a behaviour's Delegate effect with a brief.
func delegateBrief(agent string, b *typesv1.SubagentBrief, msg string) func(*operatorv1.OperatorInput) *typesv1.Effect {
	return func(*operatorv1.OperatorInput) *typesv1.Effect {
		d := &typesv1.Delegate{AgentId: agent, Brief: proto.CloneOf(b)}
		if msg != "" {
			d.Message = content.Text(msg)
		}
		return &typesv1.Effect{Kind: &typesv1.Effect_Delegate{Delegate: d}}
	}
}

// costing is a behaviour completing with text at cost.
func costing(text, cost string, effs ...func(*operatorv1.OperatorInput) *typesv1.Effect) behaviour {
	return func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
		var list []*typesv1.Effect
		for _, e := range effs {
			list = append(list, e(in))
		}
		return done(in, text, cost, list...), nil
	}
}

func TestDelegationBrief(t *testing.T) { backends(t, testDelegationBrief) }

// A brief narrows the child's invocation: its tools are the intersection
// of the brief's and the child definition's, its max_turns and max_cost
// the smaller of the brief's and the definition's, max_cost at most the
// workflow budget left; the child's task is laid out from the brief;
// the parent gets one JSON object per delegation with the answer, exit,
// cost, turns and whether the answer matched the brief's output schema.
// A message-only Delegate works as before.
func testDelegationBrief(t *testing.T, start starter) {
	ctx := ctxT(t)
	stateAddr, _, _ := startState(t)
	schema, _ := structpb.NewStruct(map[string]any{"type": "object", "required": []any{"revenue"},
		"properties": map[string]any{"revenue": map[string]any{"type": "number"}}})
	worker := &typesv1.SubagentBrief{
		Goal: "Find the 2024 revenue of ACME.", KeyFacts: []string{"ACME is listed in Frankfurt", "use the annual report"},
		Tools: []string{"read_file", "web_search", "shell"}, WorkspacePath: "reports/acme", OutputFormat: "The revenue in EUR.",
		OutputSchema: schema, MaxTurns: proto.Uint32(3), MaxCost: &typesv1.Money{Amount: "0.05"},
	}
	capped := &typesv1.SubagentBrief{Goal: "Summarise.", Tools: []string{"web_search"}, MaxTurns: proto.Uint32(50),
		MaxCost: &typesv1.Money{Amount: "5"}, OutputSchema: schema}
	fake, opAddr := startFake(t, map[string]behaviour{
		"lead": firstTime(costing("delegating", "0.10",
			delegateBrief("worker", worker, "The user asked in German."),
			delegateBrief("capped", capped, ""),
			delegateTo("plain", "just a message")),
			costing("all done", "0")),
		"worker": costing("```json\n{\"revenue\": 42}\n```", "0.01"),
		"capped": costing("not JSON at all", "0.02"),
		"plain":  costing("plain answer", "0"),
	})
	agents := agentsAt(opAddr, "lead", "worker", "capped", "plain")
	agents[1]["allowed_tools"] = []string{"read_file", "shell", "write_file"}
	agents[1]["max_turns"], agents[1]["max_cost"] = 20, "1"
	agents[2]["allowed_tools"] = []string{"read_file"}
	agents[2]["max_turns"] = 2
	o := start(t, registryYAML(t, agents...), stateAddr, orchOptions{})
	resp, err := o.client.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: "lead", WorkflowId: "brief", Input: userInput("x", ""),
		Budget: money.FromDecimal(decimal.RequireFromString("0.30"))})
	if err != nil {
		t.Fatal(err)
	}
	if got := content.TextOf(resp.GetOutput().GetMessage()); got != "all done" {
		t.Fatalf("workflow answered %q, want the lead's second answer", got)
	}

	w := fake.inputs("worker")
	if len(w) != 1 {
		t.Fatalf("worker called %d times, want 1", len(w))
	}
	cfg := w[0].GetConfig()
	if got := cfg.GetAllowedTools().GetNames(); strings.Join(got, ",") != "read_file,shell" {
		t.Errorf("worker allowed tools %q, want the intersection read_file,shell (web_search is not in its definition, write_file not in the brief)", got)
	}
	if cfg.GetMaxTurns() != 3 || cfg.GetMaxCost().GetAmount() != "0.05" {
		t.Errorf("worker max_turns %d, max_cost %q; want the brief's 3 and 0.05, below its definition's 20 and 1", cfg.GetMaxTurns(), cfg.GetMaxCost().GetAmount())
	}
	text := content.TextOf(w[0].GetMessage())
	for _, want := range []string{"Goal:\nFind the 2024 revenue of ACME.\n", "Key facts:\n- ACME is listed in Frankfurt\n- use the annual report\n",
		"Expected output:\nThe revenue in EUR.\n", `"required":["revenue"]`, "Workspace path: reports/acme", "Context from the delegating agent:", "The user asked in German."} {
		if !strings.Contains(text, want) {
			t.Errorf("worker's task text lacks %q:\n%s", want, text)
		}
	}
	if p := w[0].GetMetadata().GetFields()["workspace_path"].GetStringValue(); p != "reports/acme" {
		t.Errorf("worker metadata workspace_path %q, want reports/acme", p)
	}
	if w[0].GetTrigger() != operatorv1.TriggerType_TRIGGER_TYPE_TASK {
		t.Errorf("worker trigger %s, want TASK", w[0].GetTrigger())
	}

	c := fake.inputs("capped")
	if len(c) != 1 {
		t.Fatalf("capped called %d times, want 1", len(c))
	}
	cfg = c[0].GetConfig()
	if names := cfg.GetAllowedTools(); names == nil || len(names.GetNames()) != 0 {
		t.Errorf("capped allowed tools %v, want present and empty: the brief's web_search is not in its definition, so no tools", names)
	}
	// The workflow budget is 0.30; lead spent 0.10 and worker 0.01.
	if cfg.GetMaxTurns() != 2 || cfg.GetMaxCost().GetAmount() != "0.19" {
		t.Errorf("capped max_turns %d, max_cost %q; want its definition's 2 and the workflow's remaining 0.19 (the brief asked for 50 and 5)",
			cfg.GetMaxTurns(), cfg.GetMaxCost().GetAmount())
	}

	p := fake.inputs("plain")
	if len(p) != 1 || content.TextOf(p[0].GetMessage()) != "just a message" || p[0].GetConfig().GetAllowedTools() != nil {
		t.Errorf("plain inputs %v, want the message-only Delegate's message as is, with no tool restriction", p)
	}

	l := fake.inputs("lead")
	if len(l) != 2 {
		t.Fatalf("lead called %d times, want 2", len(l))
	}
	results := content.TextOf(l[1].GetMessage())
	ds := l[1].GetMetadata().GetFields()["delegations"].GetListValue().GetValues()
	if len(ds) != 3 {
		t.Fatalf("lead's results metadata has %d delegations, want 3:\n%s", len(ds), results)
	}
	type result struct {
		Agent   string         `json:"agent_id"`
		OK      bool           `json:"ok"`
		Exit    string         `json:"exit"`
		Cost    string         `json:"cost"`
		Turns   int            `json:"turns"`
		Answer  string         `json:"answer"`
		Parsed  *bool          `json:"output_parsed"`
		Problem string         `json:"output_problem"`
		Output  map[string]any `json:"output"`
	}
	var got []result
	for _, d := range ds {
		var r result
		if err := json.Unmarshal([]byte(jsonOf(t, d)), &r); err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	if r := got[0]; r.Agent != "worker" || !r.OK || r.Exit != "COMPLETE" || r.Cost != "0.01" || r.Turns != 1 ||
		r.Parsed == nil || !*r.Parsed || r.Output["revenue"] != float64(42) {
		t.Errorf("worker's result %+v, want COMPLETE, cost 0.01, 1 turn, the answer parsed to revenue 42", r)
	}
	if r := got[1]; r.Agent != "capped" || r.Cost != "0.02" || r.Parsed == nil || *r.Parsed || !strings.Contains(r.Problem, "not JSON") {
		t.Errorf("capped's result %+v, want cost 0.02 and output_parsed false saying the answer is not JSON", r)
	}
	if r := got[2]; r.Agent != "plain" || r.Answer != "plain answer" || r.Parsed != nil {
		t.Errorf("plain's result %+v, want its answer and no output_parsed (no schema)", r)
	}
	// The text the model reads carries the same objects.
	for _, want := range []string{"Results of delegated tasks:", "[1] agent worker (COMPLETE):\n{", `"output_parsed": true`, `"cost": "0.02"`, `"answer": "plain answer"`} {
		if !strings.Contains(results, want) {
			t.Errorf("lead's results text lacks %q:\n%s", want, results)
		}
	}
	o.replayed(t, "brief", "")
}

func TestDelegationBriefRefused(t *testing.T) { backends(t, testDelegationBriefRefused) }

// An operator declaring a Delegate that breaks its rules (an absolute or
// escaping workspace path, an empty goal, too many key facts, no task)
// fails the workflow with INVALID_ARGUMENT naming the field; the child
// never runs.
func testDelegationBriefRefused(t *testing.T, start starter) {
	ctx := ctxT(t)
	stateAddr, _, _ := startState(t)
	facts := make([]string, 33)
	for i := range facts {
		facts[i] = "f"
	}
	tests := []struct {
		name string
		d    *typesv1.Delegate
		want string
	}{
		{"absolute", &typesv1.Delegate{Brief: &typesv1.SubagentBrief{Goal: "g", WorkspacePath: "/etc"}}, "brief.workspace_path: must be a relative path"},
		{"dotdot", &typesv1.Delegate{Brief: &typesv1.SubagentBrief{Goal: "g", WorkspacePath: "a/../../b"}}, "brief.workspace_path: must be a relative path"},
		{"empty goal", &typesv1.Delegate{Brief: &typesv1.SubagentBrief{KeyFacts: []string{"x"}}}, "brief.goal: must be at least 1 characters"},
		{"too many facts", &typesv1.Delegate{Brief: &typesv1.SubagentBrief{Goal: "g", KeyFacts: facts}}, "brief.key_facts: must contain no more than 32 item(s)"},
		{"no task", &typesv1.Delegate{}, "set brief (a goal for the agent) or message (its task)"},
	}
	agents := map[string]behaviour{"child": answer("child")}
	for _, tt := range tests {
		d := proto.CloneOf(tt.d)
		d.AgentId = "child"
		agents["lead-"+strings.ReplaceAll(tt.name, " ", "-")] = answer("lead", func(*operatorv1.OperatorInput) *typesv1.Effect {
			return &typesv1.Effect{Kind: &typesv1.Effect_Delegate{Delegate: proto.CloneOf(d)}}
		})
	}
	fake, opAddr := startFake(t, agents)
	var ids []string
	for id := range agents {
		ids = append(ids, id)
	}
	o := start(t, registryYAML(t, agentsAt(opAddr, ids...)...), stateAddr, orchOptions{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := o.client.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: "lead-" + strings.ReplaceAll(tt.name, " ", "-"), Input: userInput("x", "")})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "invalid Delegate") {
				t.Errorf("Dispatch: %v; want INVALID_ARGUMENT containing %q", err, tt.want)
			}
		})
	}
	if n := len(fake.inputs("child")); n != 0 {
		t.Errorf("child called %d times; an invalid Delegate must not run it", n)
	}
}

// Through the real operator: the model's delegate tool call with brief
// arguments reaches the child as a narrowed OperatorConfig (the brief's
// tools its definition allows, the brief's smaller max_turns), and the
// parent model reads the child's answer in a JSON result.
func TestDelegationBriefThroughOperator(t *testing.T) {
	ctx := ctxT(t)
	stateAddr, _, _ := startState(t)
	opAddr := startOperator(t, stateAddr)
	planner := script([]map[string]any{
		{"tool_calls": []any{call("delegate", map[string]any{"agent_id": "researcher", "goal": "Find three facts.", "key_facts": []any{"about ACME"},
			"tools": []any{"write_memory", "signal"}, "max_turns": 3, "max_cost": "0.5"})}, "cost": "0.01"},
		{"text": "Delegated.", "cost": "0.01"},
	}, map[string]any{"contains": "Results of delegated tasks", "turns": []any{map[string]any{"text": "Done.", "cost": "0.01"}}})
	researcher := script([]map[string]any{{"text": "Facts: a, b, c.", "cost": "0.02"}})
	var (
		mu     sync.Mutex
		inputs = map[string][]*operatorv1.OperatorInput{}
	)
	record := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if r, ok := req.(*operatorv1.ExecuteRequest); ok {
			mu.Lock()
			inputs[r.GetInput().GetDispatch().GetAgentId()] = append(inputs[r.GetInput().GetDispatch().GetAgentId()], proto.CloneOf(r.GetInput()))
			mu.Unlock()
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	o := startOrch(t, t.TempDir(), registryYAML(t,
		map[string]any{"id": "planner", "operator": opAddr, "metadata": planner},
		map[string]any{"id": "researcher", "operator": opAddr, "metadata": researcher, "allowed_tools": []string{"write_memory", "delegate"}, "max_turns": 10},
	), stateAddr, orchOptions{chain: []grpc.UnaryClientInterceptor{record}})
	resp, err := o.client.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: "planner", Input: userInput("go", "")})
	if err != nil {
		t.Fatal(err)
	}
	if got := content.TextOf(resp.GetOutput().GetMessage()); got != "Done." {
		t.Errorf("planner answered %q, want Done.", got)
	}
	mu.Lock()
	defer mu.Unlock()
	r := inputs["researcher"]
	if len(r) != 1 {
		t.Fatalf("researcher called %d times, want 1", len(r))
	}
	if got := r[0].GetConfig().GetAllowedTools().GetNames(); strings.Join(got, ",") != "write_memory" || r[0].GetConfig().GetMaxTurns() != 3 ||
		r[0].GetConfig().GetMaxCost().GetAmount() != "0.5" {
		t.Errorf("researcher config %v, want allowed tools [write_memory], max_turns 3, max_cost 0.5", r[0].GetConfig())
	}
	if text := content.TextOf(r[0].GetMessage()); !strings.Contains(text, "Goal:\nFind three facts.") || !strings.Contains(text, "- about ACME") {
		t.Errorf("researcher's task %q, want the brief's goal and key facts", text)
	}
	p := inputs["planner"]
	if len(p) != 2 || !strings.Contains(content.TextOf(p[1].GetMessage()), `"answer": "Facts: a, b, c."`) {
		t.Errorf("planner's inputs %v, want a second one with the researcher's answer in a JSON result", p)
	}
}

// The brief is in the delegating operator's journaled output: after a
// restart a child whose result was recorded is not run again, a child in
// flight at the stop is called again with the same brief-built input,
// and the parent gets both results.
func TestBriefResumeAfterRestart(t *testing.T) {
	ctx := ctxT(t)
	stateAddr, _, _ := startState(t)
	release := make(chan struct{})
	slowStarted := make(chan struct{}, 4)
	brief := func(goal string) *typesv1.SubagentBrief {
		return &typesv1.SubagentBrief{Goal: goal, Tools: []string{"read_file"}, MaxTurns: proto.Uint32(2), MaxCost: &typesv1.Money{Amount: "0.5"}}
	}
	fake, opAddr := startFake(t, map[string]behaviour{
		"parent": firstTime(answer("delegating", delegateBrief("quick", brief("quick task"), ""), delegateBrief("slow", brief("slow task"), "ctx")),
			answer("all done")),
		"quick": costing("quick result", "0.01"),
		"slow": func(ctx context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			slowStarted <- struct{}{}
			select {
			case <-release:
				return done(in, "slow result", "0.02"), nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		},
	})
	dir := t.TempDir()
	reg := registryYAML(t, agentsAt(opAddr, "parent", "quick", "slow")...)
	first := startOrch(t, dir, reg, stateAddr, orchOptions{})
	if _, err := first.client.StartWorkflow(ctx, &orchestratorv1.StartWorkflowRequest{WorkflowId: "rb", AgentId: "parent", Input: userInput("go", "")}); err != nil {
		t.Fatal(err)
	}
	<-slowStarted
	first.stop()
	close(release)
	second := startOrch(t, dir, reg, stateAddr, orchOptions{})
	waitStatus(t, second, "rb", orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)
	if n := len(fake.inputs("quick")); n != 1 {
		t.Errorf("quick called %d times, want 1: its result was journaled before the restart", n)
	}
	s := fake.inputs("slow")
	if len(s) != 2 {
		t.Fatalf("slow called %d times, want 2 (in flight at the stop)", len(s))
	}
	if !proto.Equal(s[0].GetConfig(), s[1].GetConfig()) || !proto.Equal(s[0].GetMessage(), s[1].GetMessage()) ||
		s[1].GetConfig().GetMaxTurns() != 2 || !strings.Contains(content.TextOf(s[1].GetMessage()), "Goal:\nslow task") {
		t.Errorf("slow's inputs before and after the restart differ or lack the brief:\n%v\n%v", s[0], s[1])
	}
	p := fake.inputs("parent")
	if len(p) != 2 {
		t.Fatalf("parent called %d times, want 2", len(p))
	}
	text := content.TextOf(p[1].GetMessage())
	for _, want := range []string{`"answer": "quick result"`, `"cost": "0.01"`, `"answer": "slow result"`, `"cost": "0.02"`} {
		if !strings.Contains(text, want) {
			t.Errorf("parent's results lack %q:\n%s", want, text)
		}
	}
}
