package lifecycle

import (
	"fmt"
	"slices"

	"google.golang.org/protobuf/reflect/protoreflect"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	"github.com/secbear/neuron/pkg/errs"
)

// Filter selects events. Empty fields match everything; set fields must
// all match.
type Filter struct {
	// Kinds: only events of these kinds.
	Kinds []lifecyclev1.EventKind
	// WorkflowID: only events whose envelope names this workflow.
	WorkflowID string
	// AgentID: only events whose envelope names this agent.
	AgentID string
	// Sources: only observable events from these sources. A non-empty
	// Sources excludes budget and compaction events.
	Sources []lifecyclev1.EventSource
}

// FilterFrom is the filter of a SubscribeRequest.
func FilterFrom(req *lifecyclev1.SubscribeRequest) Filter {
	return Filter{
		Kinds:      req.GetKinds(),
		WorkflowID: req.GetWorkflowId(),
		AgentID:    req.GetAgentId(),
		Sources:    req.GetSources(),
	}.clone()
}

// Match reports whether ev passes the filter. The workflow and agent are
// compared with the envelope's workflow_id and agent_id, exactly.
func (f Filter) Match(ev *lifecyclev1.LifecycleEvent) bool {
	if ev == nil {
		return false
	}
	if f.WorkflowID != "" && ev.GetWorkflowId() != f.WorkflowID {
		return false
	}
	if f.AgentID != "" && ev.GetAgentId() != f.AgentID {
		return false
	}
	if len(f.Kinds) > 0 && !slices.Contains(f.Kinds, Kind(ev)) {
		return false
	}
	if len(f.Sources) > 0 {
		obs := ev.GetObservable()
		if obs == nil || !slices.Contains(f.Sources, obs.GetSource()) {
			return false
		}
	}
	return true
}

// Validate reports a filter naming an unspecified or unknown kind or
// source, wrapping errs.InvalidArgument (the rules of SubscribeRequest).
func (f Filter) Validate() error {
	for i, k := range f.Kinds {
		if !defined(k) {
			return fmt.Errorf("kinds[%d]: %v is not an event kind: %w", i, k, errs.InvalidArgument)
		}
	}
	for i, s := range f.Sources {
		if !defined(s) {
			return fmt.Errorf("sources[%d]: %v is not an event source: %w", i, s, errs.InvalidArgument)
		}
	}
	return nil
}

func defined[E interface {
	~int32
	protoreflect.Enum
}](e E) bool {
	return e != 0 && e.Descriptor().Values().ByNumber(e.Number()) != nil
}

func (f Filter) clone() Filter {
	f.Kinds = slices.Clone(f.Kinds)
	f.Sources = slices.Clone(f.Sources)
	return f
}
