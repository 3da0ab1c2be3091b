package lifecycle

import (
	"math"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
)

// Marshal's bytes parse to the event proto.Marshal encodes, of the same
// size, for every shape of data: the orchestrator's events, nested
// structs and lists, every kind of value at its zero and beyond, empty
// keys, non-ASCII text, events with no data or of other kinds.
func TestMarshalMatchesProto(t *testing.T) {
	nested, err := structpb.NewValue(map[string]any{
		"list":   []any{1.5, "two", true, nil, map[string]any{"deep": []any{}}, []any{0.0, ""}},
		"empty":  map[string]any{},
		"":       "empty key",
		"zero":   0.0,
		"false":  false,
		"null":   nil,
		"text":   "héllo, 世界 \u0000",
		"big":    math.MaxFloat64,
		"neg":    -1e-300,
		"inf":    math.Inf(1),
		"string": "",
	})
	if err != nil {
		t.Fatal(err)
	}
	events := []*lifecyclev1.LifecycleEvent{
		Observable(srcOrch, "orchestrator.dispatch.completed", "wf-1", "echo", map[string]any{
			"dispatch_id": "wf-1#1", "exit": "EXIT_KIND_COMPLETE", "cost": "0", "duration_ms": int64(3), "effects": 0, "signals": nil,
		}),
		Observable(srcOrch, "orchestrator.workflow.started", "wf-1", "echo", map[string]any{"agent_id": "echo", "detached": false}),
		Observable(srcOrch, "x", "", "", nested),
		Observable(srcOrch, "x", "", "", structpb.NewNullValue()),
		Observable(srcOrch, "x", "", "", structpb.NewStringValue("")),
		Observable(srcOrch, "x", "", "", structpb.NewNumberValue(0)),
		Observable(srcOrch, "x", "", "", structpb.NewBoolValue(false)),
		Observable(srcOrch, "x", "", "", &structpb.Value{}),
		Observable(srcOrch, "x", "", "", structpb.NewListValue(&structpb.ListValue{})),
		Observable(srcOrch, "no data", "wf", "a", nil),
		Budget("wf", "a", &lifecyclev1.BudgetEvent{Kind: &lifecyclev1.BudgetEvent_CostIncurred{CostIncurred: &lifecyclev1.CostIncurred{
			AgentId: "a", Cost: &typesv1.Money{Amount: "0.1"}}}}),
		{},
	}
	full := Observable(srcOrch, "orchestrator.effect.applied", "wf-2", "writer", map[string]any{"detail": "written (revision 3)"})
	full.Sequence, full.WorkflowSequence, full.CorrelationId, full.Time = 9, 4, "corr", timestamppb.Now()
	full.GetObservable().SinceWorkflowStart, full.GetObservable().TraceId = durationpb.New(1500), "0af7651916cd43dd8448eb211c80319c"
	events = append(events, full)
	for i, ev := range events {
		want, err := proto.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Marshal(ev)
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if len(got) != len(want) {
			t.Errorf("event %d: %d bytes, proto.Marshal %d", i, len(got), len(want))
		}
		back := &lifecyclev1.LifecycleEvent{}
		if err := proto.Unmarshal(got, back); err != nil {
			t.Fatalf("event %d: Marshal's bytes do not parse: %v", i, err)
		}
		if !proto.Equal(back, ev) {
			t.Errorf("event %d: parsed back as\n%v\nwant\n%v", i, back, ev)
		}
	}
}

// What proto.Marshal refuses, Marshal refuses too: text that is not
// UTF-8, in a value or a key, at any depth.
func TestMarshalRefusesWhatProtoRefuses(t *testing.T) {
	bad := string([]byte{0xff, 'x'})
	for _, data := range []*structpb.Value{
		structpb.NewStringValue(bad),
		structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{bad: structpb.NewNullValue()}}),
		structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"k": structpb.NewStringValue(bad)}})}}),
	} {
		ev := Observable(srcOrch, "x", "", "", data)
		_, want := proto.Marshal(ev)
		_, got := Marshal(ev)
		if want == nil || got == nil || !strings.Contains(got.Error(), "UTF-8") {
			t.Errorf("data %v: Marshal error %v, proto.Marshal's %v", data, got, want)
		}
	}
	env := Observable(srcOrch, "x", string([]byte{0xc0}), "", map[string]any{"k": "v"})
	if _, err := Marshal(env); err == nil {
		t.Error("an envelope that is not UTF-8 was encoded")
	}
}

func BenchmarkMarshal(b *testing.B) {
	ev := Observable(srcOrch, "orchestrator.dispatch.completed", "wf-0123456789ab-00112233445566778899", "echo", map[string]any{
		"dispatch_id": "wf-0123456789ab-00112233445566778899#1", "exit": "EXIT_KIND_COMPLETE", "cost": "0", "duration_ms": int64(3), "effects": 0, "signals": nil,
	})
	ev.Time = timestamppb.Now()
	b.Run("proto", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			_, _ = proto.Marshal(ev)
		}
	})
	b.Run("lifecycle", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			_, _ = Marshal(ev)
		}
	})
}
