package lifecycle

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
)

func TestObservableData(t *testing.T) {
	type payload struct {
		Name  string `json:"name"`
		Count int    `json:"count"`
		Skip  string `json:"-"`
	}
	mustValue := func(v any) *structpb.Value {
		t.Helper()
		out, err := structpb.NewValue(v)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	given := structpb.NewStringValue("as is")
	tests := []struct {
		name string
		data any
		want *structpb.Value // nil: no payload
		err  string          // non-empty: an unconvertible payload naming this
	}{
		{"nil", nil, nil, ""},
		{"string", "hello", structpb.NewStringValue("hello"), ""},
		{"number", 42, structpb.NewNumberValue(42), ""},
		{"map", map[string]any{"a": true, "b": []any{1.5, "x"}}, mustValue(map[string]any{"a": true, "b": []any{1.5, "x"}}), ""},
		{"struct via json", payload{Name: "n", Count: 3, Skip: "secret"}, mustValue(map[string]any{"name": "n", "count": 3}), ""},
		{"pointer to struct", &payload{Name: "p"}, mustValue(map[string]any{"name": "p", "count": 0}), ""},
		{"typed map via json", map[string]int{"x": 1}, mustValue(map[string]any{"x": 1}), ""},
		{"value as is", given, given, ""},
		{"proto message via protojson", &lifecyclev1.ContextPressure{AgentId: "a", TokensUsed: 5}, mustValue(map[string]any{"agentId": "a", "tokensUsed": "5"}), ""},
		{"typed nil message", (*lifecyclev1.ContextPressure)(nil), structpb.NewNullValue(), ""},
		{"invalid utf-8 repaired by json", "a\xffb", structpb.NewStringValue("a\uFFFDb"), ""},
		{"channel", make(chan int), nil, "chan int"},
		{"function in a map", map[string]any{"f": func() {}}, nil, "map[string]interface {}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := Observable(srcEnv, "env.exec", "wf", "ag", tt.data)
			if Kind(ev) != kObservable || ev.GetWorkflowId() != "wf" || ev.GetAgentId() != "ag" {
				t.Fatalf("envelope %v", ev)
			}
			obs := ev.GetObservable()
			if obs.GetSource() != srcEnv || obs.GetEventType() != "env.exec" {
				t.Fatalf("observable %v", obs)
			}
			got := obs.GetData()
			if tt.err != "" {
				if !strings.Contains(got.GetStringValue(), "unconvertible data of type "+tt.err) {
					t.Fatalf("data %v, want an error naming %q", got, tt.err)
				}
				if _, err := proto.Marshal(ev); err != nil {
					t.Fatalf("the event does not marshal: %v", err)
				}
				return
			}
			if tt.want == nil {
				if got != nil {
					t.Fatalf("data %v, want none", got)
				}
				return
			}
			if !proto.Equal(got, tt.want) {
				t.Fatalf("data %v, want %v", got, tt.want)
			}
		})
	}
}

func TestBuildersAndKind(t *testing.T) {
	b := Budget("wf", "ag", costEvent())
	if Kind(b) != kBudget || b.GetWorkflowId() != "wf" || b.GetAgentId() != "ag" || b.GetBudget().GetCostIncurred().GetAgentId() != "a1" {
		t.Errorf("Budget = %v", b)
	}
	c := Compaction("wf", "ag", pressureEvent())
	if Kind(c) != kCompaction || c.GetWorkflowId() != "wf" || c.GetAgentId() != "ag" || c.GetCompaction().GetContextPressure().GetFillPercent() != 90 {
		t.Errorf("Compaction = %v", c)
	}
	if k := Kind(&lifecyclev1.LifecycleEvent{}); k != lifecyclev1.EventKind_EVENT_KIND_UNSPECIFIED {
		t.Errorf("Kind(no event) = %v", k)
	}
	if k := Kind(nil); k != lifecyclev1.EventKind_EVENT_KIND_UNSPECIFIED {
		t.Errorf("Kind(nil) = %v", k)
	}
}
