package lifecycle

import (
	"errors"
	"strings"
	"testing"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	"github.com/secbear/neuron/pkg/errs"
)

const (
	kBudget     = lifecyclev1.EventKind_EVENT_KIND_BUDGET
	kCompaction = lifecyclev1.EventKind_EVENT_KIND_COMPACTION
	kObservable = lifecyclev1.EventKind_EVENT_KIND_OBSERVABLE
	srcEnv      = lifecyclev1.EventSource_EVENT_SOURCE_ENVIRONMENT
	srcOrch     = lifecyclev1.EventSource_EVENT_SOURCE_ORCHESTRATOR
	srcState    = lifecyclev1.EventSource_EVENT_SOURCE_STATE
)

func costEvent() *lifecyclev1.BudgetEvent {
	return &lifecyclev1.BudgetEvent{Kind: &lifecyclev1.BudgetEvent_CostIncurred{CostIncurred: &lifecyclev1.CostIncurred{AgentId: "a1"}}}
}

func pressureEvent() *lifecyclev1.CompactionEvent {
	return &lifecyclev1.CompactionEvent{Kind: &lifecyclev1.CompactionEvent_ContextPressure{ContextPressure: &lifecyclev1.ContextPressure{FillPercent: 90}}}
}

func TestFilterMatch(t *testing.T) {
	events := map[string]*lifecyclev1.LifecycleEvent{
		"budget wf1/a1":     Budget("wf1", "a1", costEvent()),
		"compaction wf2/a1": Compaction("wf2", "a1", pressureEvent()),
		"env wf1/a2":        Observable(srcEnv, "env.exec", "wf1", "a2", nil),
		"orch wf2/-":        Observable(srcOrch, "orchestrator.effect.applied", "wf2", "", nil),
		"no kind wf1/a1":    {WorkflowId: "wf1", AgentId: "a1"},
	}
	tests := []struct {
		name   string
		filter Filter
		want   []string
	}{
		{"empty matches all", Filter{}, []string{"budget wf1/a1", "compaction wf2/a1", "env wf1/a2", "orch wf2/-", "no kind wf1/a1"}},
		{"one kind", Filter{Kinds: []lifecyclev1.EventKind{kBudget}}, []string{"budget wf1/a1"}},
		{"two kinds", Filter{Kinds: []lifecyclev1.EventKind{kCompaction, kObservable}}, []string{"compaction wf2/a1", "env wf1/a2", "orch wf2/-"}},
		{"workflow", Filter{WorkflowID: "wf1"}, []string{"budget wf1/a1", "env wf1/a2", "no kind wf1/a1"}},
		{"workflow is exact", Filter{WorkflowID: "wf"}, nil},
		{"agent", Filter{AgentID: "a1"}, []string{"budget wf1/a1", "compaction wf2/a1", "no kind wf1/a1"}},
		{"workflow and agent", Filter{WorkflowID: "wf2", AgentID: "a1"}, []string{"compaction wf2/a1"}},
		{"sources exclude non-observable", Filter{Sources: []lifecyclev1.EventSource{srcEnv}}, []string{"env wf1/a2"}},
		{"two sources", Filter{Sources: []lifecyclev1.EventSource{srcOrch, srcEnv}}, []string{"env wf1/a2", "orch wf2/-"}},
		{"source matching nothing", Filter{Sources: []lifecyclev1.EventSource{srcState}}, nil},
		{"sources with budget kind", Filter{Kinds: []lifecyclev1.EventKind{kBudget, kObservable}, Sources: []lifecyclev1.EventSource{srcOrch}}, []string{"orch wf2/-"}},
		{"everything", Filter{Kinds: []lifecyclev1.EventKind{kObservable}, WorkflowID: "wf1", AgentID: "a2", Sources: []lifecyclev1.EventSource{srcEnv}}, []string{"env wf1/a2"}},
		{"everything but one field", Filter{Kinds: []lifecyclev1.EventKind{kObservable}, WorkflowID: "wf1", AgentID: "a1", Sources: []lifecyclev1.EventSource{srcEnv}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := map[string]bool{}
			for _, w := range tt.want {
				want[w] = true
			}
			for name, ev := range events {
				if got := tt.filter.Match(ev); got != want[name] {
					t.Errorf("Match(%s) = %v, want %v", name, got, want[name])
				}
			}
			if tt.filter.Match(nil) {
				t.Error("Match(nil) = true")
			}
		})
	}
}

func TestFilterFrom(t *testing.T) {
	req := &lifecyclev1.SubscribeRequest{
		Kinds:      []lifecyclev1.EventKind{kObservable},
		WorkflowId: "wf",
		AgentId:    "ag",
		Sources:    []lifecyclev1.EventSource{srcEnv},
	}
	f := FilterFrom(req)
	req.Kinds[0] = kBudget // the filter owns its slices
	if len(f.Kinds) != 1 || f.Kinds[0] != kObservable || f.WorkflowID != "wf" || f.AgentID != "ag" ||
		len(f.Sources) != 1 || f.Sources[0] != srcEnv {
		t.Fatalf("FilterFrom = %+v", f)
	}
	if f := FilterFrom(nil); f.Kinds != nil || f.Sources != nil || f.WorkflowID != "" || f.AgentID != "" {
		t.Fatalf("FilterFrom(nil) = %+v", f)
	}
}

func TestFilterValidate(t *testing.T) {
	tests := []struct {
		name   string
		filter Filter
		want   string // "" for valid
	}{
		{"empty", Filter{}, ""},
		{"defined", Filter{Kinds: []lifecyclev1.EventKind{kBudget}, Sources: []lifecyclev1.EventSource{srcEnv}}, ""},
		{"unspecified kind", Filter{Kinds: []lifecyclev1.EventKind{kBudget, 0}}, "kinds[1]"},
		{"unknown kind", Filter{Kinds: []lifecyclev1.EventKind{99}}, "kinds[0]"},
		{"unspecified source", Filter{Sources: []lifecyclev1.EventSource{0}}, "sources[0]"},
		{"unknown source", Filter{Sources: []lifecyclev1.EventSource{srcEnv, 42}}, "sources[1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.filter.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate = %v", err)
				}
				return
			}
			if !errors.Is(err, errs.InvalidArgument) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate = %v, want INVALID_ARGUMENT naming %q", err, tt.want)
			}
			if _, err := NewBus(Options{}).Subscribe(tt.filter, nil); !errors.Is(err, errs.InvalidArgument) {
				t.Fatalf("Subscribe = %v, want INVALID_ARGUMENT", err)
			}
		})
	}
}
