package agents

import (
	"context"
	"strings"
	"testing"

	agentv1 "github.com/secbear/neuron/gen/layer0/agent/v1"
	"github.com/secbear/neuron/services/orchestrator"
)

// TestWithModels: a model an OpenAI-compatible server serves is in no
// catalog; the deployment names it (--models) and definitions may use it,
// while a name neither knows is still refused naming the field.
func TestWithModels(t *testing.T) {
	base, err := DefaultModels()
	if err != nil {
		t.Fatal(err)
	}
	models := WithModels(base, "llama3.2", " ", "qwen3")
	agent := func(model string) *agentv1.Agent {
		return &agentv1.Agent{Name: "a", Definition: &agentv1.AgentDefinition{
			Model: &agentv1.ModelSettings{Name: model},
			Route: &agentv1.Route{Target: &agentv1.Route_Operator{Operator: &agentv1.OperatorRoute{Address: "x:1"}}},
		}}
	}
	for _, m := range []string{"llama3.2", "qwen3", "gpt-4.1-mini"} {
		if err := Validate(context.Background(), agent(m), models, nil); err != nil {
			t.Errorf("model %q refused: %v", m, err)
		}
	}
	err = Validate(context.Background(), agent("mistral"), models, nil)
	if err == nil || !strings.Contains(err.Error(), `agent.definition.model.name: unknown model "mistral"`) || !strings.Contains(err.Error(), "llama3.2") {
		t.Errorf("unknown model: %v, want INVALID_ARGUMENT naming the field and listing llama3.2", err)
	}
	if err := Validate(context.Background(), agent("llama3.2"), base, nil); err == nil {
		t.Error("the catalog alone accepts llama3.2")
	}
}

// TestToAgentMinimal: a definition with nothing but a route converts, and
// leaves the operator's defaults alone.
func TestToAgentMinimal(t *testing.T) {
	a, err := ToAgent(&agentv1.Agent{Name: "a", Revision: 3, Definition: &agentv1.AgentDefinition{
		Route: &agentv1.Route{Target: &agentv1.Route_Operator{Operator: &agentv1.OperatorRoute{Address: "x:1"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if a.Operator != "x:1" || a.Revision != 3 || a.Defaults.SessionHistory != nil || a.Defaults.AllowedTools != nil {
		t.Errorf("ToAgent of a bare definition: %+v", a)
	}
}

// TestCheckAtStart: the start-up check refuses what the file gets wrong
// (the sizes, tools, schemas), without the proto rules, which the background seeding
// checks (Validate) so that start-up does not build protovalidate.
func TestCheckAtStart(t *testing.T) {
	parse := func(yaml string) *orchestrator.Registry {
		t.Helper()
		reg, err := orchestrator.ParseRegistry([]byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		return reg
	}
	long := parse("agents:\n  - id: a\n    operator: x:1\n    instructions: " + strings.Repeat("x", MaxInstructionsBytes+1) + "\n")
	if err := Check(context.Background(), long); err == nil || !strings.Contains(err.Error(), "agent.definition.instructions") {
		t.Errorf("Check of instructions over the limit: %v, want them refused naming the field", err)
	}
	label := parse("agents:\n  - id: a\n    operator: x:1\n    labels: {\"bad key!\": v}\n")
	if err := Check(context.Background(), label); err != nil {
		t.Errorf("Check ran the proto rules at start: %v", err)
	}
	if err := Validate(context.Background(), FromAgent(label.Agents()[0]), nil, nil); err == nil || !strings.Contains(err.Error(), "agent.definition.labels") {
		t.Errorf("Validate (the seeding's) of a bad label key: %v, want INVALID_ARGUMENT naming the labels", err)
	}
}
