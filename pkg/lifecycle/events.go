package lifecycle

import (
	"encoding/json"
	"fmt"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
)

// Observable builds an observable event. data becomes the event's JSON
// payload: a *structpb.Value is used as is, a proto message through
// protojson, a value structpb.NewValue accepts directly, and anything else
// through a JSON round trip (so structs with json tags work). Observable
// never fails: when data cannot be converted, the payload is a string
// naming the type and the error. A nil data leaves the payload unset.
func Observable(source lifecyclev1.EventSource, eventType, workflowID, agentID string, data any) *lifecyclev1.LifecycleEvent {
	return &lifecyclev1.LifecycleEvent{
		WorkflowId: workflowID,
		AgentId:    agentID,
		Event: &lifecyclev1.LifecycleEvent_Observable{Observable: &lifecyclev1.ObservableEvent{
			Source:    source,
			EventType: eventType,
			Data:      toValue(data),
		}},
	}
}

// Budget wraps a budget event in an envelope.
func Budget(workflowID, agentID string, ev *lifecyclev1.BudgetEvent) *lifecyclev1.LifecycleEvent {
	return &lifecyclev1.LifecycleEvent{
		WorkflowId: workflowID,
		AgentId:    agentID,
		Event:      &lifecyclev1.LifecycleEvent_Budget{Budget: ev},
	}
}

// Compaction wraps a compaction event in an envelope.
func Compaction(workflowID, agentID string, ev *lifecyclev1.CompactionEvent) *lifecyclev1.LifecycleEvent {
	return &lifecyclev1.LifecycleEvent{
		WorkflowId: workflowID,
		AgentId:    agentID,
		Event:      &lifecyclev1.LifecycleEvent_Compaction{Compaction: ev},
	}
}

// Kind is the kind of ev's event, EVENT_KIND_UNSPECIFIED when none is set.
func Kind(ev *lifecyclev1.LifecycleEvent) lifecyclev1.EventKind {
	switch ev.GetEvent().(type) {
	case *lifecyclev1.LifecycleEvent_Budget:
		return lifecyclev1.EventKind_EVENT_KIND_BUDGET
	case *lifecyclev1.LifecycleEvent_Compaction:
		return lifecyclev1.EventKind_EVENT_KIND_COMPACTION
	case *lifecyclev1.LifecycleEvent_Observable:
		return lifecyclev1.EventKind_EVENT_KIND_OBSERVABLE
	default:
		return lifecyclev1.EventKind_EVENT_KIND_UNSPECIFIED
	}
}

// toValue converts data to a JSON value; see Observable.
func toValue(data any) *structpb.Value {
	switch d := data.(type) {
	case nil:
		return nil
	case *structpb.Value:
		return d
	case proto.Message:
		if !d.ProtoReflect().IsValid() { // a typed nil
			return structpb.NewNullValue()
		}
		b, err := protojson.Marshal(d)
		if err != nil {
			return unconvertible(data, err)
		}
		v := &structpb.Value{}
		if err := protojson.Unmarshal(b, v); err != nil {
			return unconvertible(data, err)
		}
		return v
	}
	if v, err := structpb.NewValue(data); err == nil {
		return v
	}
	b, err := json.Marshal(data)
	if err != nil {
		return unconvertible(data, err)
	}
	var generic any
	if err := json.Unmarshal(b, &generic); err != nil {
		return unconvertible(data, err)
	}
	v, err := structpb.NewValue(generic)
	if err != nil {
		return unconvertible(data, err)
	}
	return v
}

func unconvertible(data any, err error) *structpb.Value {
	return structpb.NewStringValue(strings.ToValidUTF8(fmt.Sprintf("unconvertible data of type %T: %v", data, err), "\uFFFD"))
}
