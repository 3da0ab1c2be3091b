package effect_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"buf.build/go/protovalidate"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/tool"
	"github.com/secbear/neuron/services/operator/tool/effect"
)

// The delegate tool turns the model's brief arguments into a
// SubagentBrief; a message given with them rides along as context.
func TestDelegateBrief(t *testing.T) {
	in := `{"agent_id":"researcher","goal":"Find the 2024 revenue of ACME.","key_facts":["ACME is listed in Frankfurt","use the annual report"],
		"tools":["web_search","read_file"],"workspace_path":"reports/acme","output_format":"one line","output_schema":{"type":"object","required":["revenue"]},
		"max_turns":5,"max_cost":"0.25","message":"The user asked in German.","session_id":"s9"}`
	eff, ack, err := effect.Delegate().Declare(full, json.RawMessage(in))
	if err != nil {
		t.Fatal(err)
	}
	sch, _ := structpb.NewStruct(map[string]any{"type": "object", "required": []any{"revenue"}})
	want := &typesv1.Delegate{AgentId: "researcher", SessionId: "s9", Message: content.Text("The user asked in German."), Brief: &typesv1.SubagentBrief{
		Goal: "Find the 2024 revenue of ACME.", KeyFacts: []string{"ACME is listed in Frankfurt", "use the annual report"},
		Tools: []string{"web_search", "read_file"}, WorkspacePath: "reports/acme", OutputFormat: "one line", OutputSchema: sch,
		MaxTurns: proto.Uint32(5), MaxCost: &typesv1.Money{Amount: "0.25"},
	}}
	if !proto.Equal(want, eff.GetDelegate()) || ack != effect.DelegateAck {
		t.Errorf("Delegate = %v, ack %q; want %v", eff.GetDelegate(), ack, want)
	}
	if err := protovalidate.Validate(eff); err != nil {
		t.Errorf("protovalidate: %v", err)
	}
	// A goal alone is a brief without a message.
	eff, _, err = effect.Delegate().Declare(full, json.RawMessage(`{"agent_id":"a","goal":"g"}`))
	if err != nil || eff.GetDelegate().GetMessage() != nil || eff.GetDelegate().GetBrief().GetGoal() != "g" {
		t.Errorf("goal only: %v, %v; want a brief with goal g and no message", eff, err)
	}
}

// Bad brief arguments are refused with INVALID_ARGUMENT naming the
// argument and saying what to do, before anything is declared.
func TestDelegateBriefErrors(t *testing.T) {
	facts := make([]string, effect.MaxKeyFacts+1)
	for i := range facts {
		facts[i] = "f"
	}
	many, _ := json.Marshal(facts)
	tests := []struct{ name, input, want string }{
		{"no task", `{"agent_id":"a"}`, `no task: give the agent its task in "goal" (with "key_facts" it needs) or in "message"`},
		{"empty goal", `{"agent_id":"a","goal":""}`, `"goal" is empty; state what the agent is to achieve (a brief needs a goal)`},
		{"brief without goal", `{"agent_id":"a","message":"m","key_facts":["x"]}`, `"goal" is empty; state what the agent is to achieve (a brief needs a goal)`},
		{"long goal", `{"agent_id":"a","goal":"` + strings.Repeat("g", effect.MaxGoalLen+1) + `"}`, `"goal" is 16385 characters; the limit is 16384: move details into "key_facts"`},
		{"too many facts", `{"agent_id":"a","goal":"g","key_facts":` + string(many) + `}`, `"key_facts" has 33 entries; the limit is 32: merge or drop some`},
		{"long fact", `{"agent_id":"a","goal":"g","key_facts":["ok","` + strings.Repeat("f", effect.MaxKeyFactLen+1) + `"]}`, `"key_facts"[1] is 4097 characters; the limit is 4096: split or shorten it`},
		{"empty fact", `{"agent_id":"a","goal":"g","key_facts":[" "]}`, `"key_facts"[0] is empty; drop it`},
		{"absolute workspace", `{"agent_id":"a","goal":"g","workspace_path":"/etc"}`, `"workspace_path" "/etc" is absolute; give a path relative to the workspace, such as "reports/q3"`},
		{"dotdot workspace", `{"agent_id":"a","goal":"g","workspace_path":"reports/../../x"}`, `"workspace_path" "reports/../../x" has a ".." element; it must stay inside the workspace`},
		{"backslash workspace", `{"agent_id":"a","goal":"g","workspace_path":"a\\b"}`, `"workspace_path" "a\\b" has a backslash; separate directories with "/"`},
		{"duplicate tool", `{"agent_id":"a","goal":"g","tools":["x","x"]}`, `"tools" names "x" twice; name each tool once`},
		{"zero turns", `{"agent_id":"a","goal":"g","max_turns":0}`, `"max_turns" is 0; give a number from 1 to 1000`},
		{"bad cost", `{"agent_id":"a","goal":"g","max_cost":"-1"}`, `"max_cost" is "-1"; give US dollars as a decimal string such as "0.50"`},
		{"schema not an object", `{"agent_id":"a","goal":"g","output_schema":[1]}`, `"output_schema" must be a JSON Schema object such as {"type": "object", "properties": {...}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eff, _, err := effect.Delegate().Declare(full, json.RawMessage(tt.input))
			if err == nil || err.Error() != tt.want || !errors.Is(err, errs.InvalidArgument) || eff != nil {
				t.Fatalf("Declare = %v, %v; want %q wrapping INVALID_ARGUMENT", eff, err, tt.want)
			}
		})
	}
}

// The registry's schema check refuses what the JSON Schema can express,
// with the property named, before the tool's own checks.
func TestDelegateBriefSchema(t *testing.T) {
	r := tool.NewRegistry()
	if err := r.RegisterEffect(effect.Delegate()); err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]string{
		`{"agent_id":"a","goal":"g","max_turns":0}`:        "- at /max_turns: minimum",
		`{"agent_id":"a","goal":"g","max_cost":"ten"}`:     "- at /max_cost:",
		`{"agent_id":"a","goal":"g","tools":["x","x"]}`:    "- at /tools:",
		`{"agent_id":"a","goal":"g","output_schema":"no"}`: "- at /output_schema: got string, want object",
	} {
		_, _, err := r.Declare(full, "delegate", json.RawMessage(in))
		var ve *tool.ValidationError
		if !errors.As(err, &ve) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v; want a validation error containing %q", in, err, want)
		}
	}
}
