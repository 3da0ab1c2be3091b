package orchestrator

import (
	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	"github.com/secbear/neuron/pkg/lifecycle"
)

// publish sends a lifecycle event; without a bus it is dropped.
func (e *Engine) publish(ev *lifecyclev1.LifecycleEvent) {
	if e.bus != nil {
		e.bus.Publish(ev)
	}
}

// event publishes an orchestrator ObservableEvent.
func (e *Engine) event(workflowID, agentID, eventType string, data map[string]any) {
	e.publish(observable(workflowID, agentID, eventType, data))
}

// observable is an orchestrator ObservableEvent.
func observable(workflowID, agentID, eventType string, data map[string]any) *lifecyclev1.LifecycleEvent {
	return lifecycle.Observable(lifecyclev1.EventSource_EVENT_SOURCE_ORCHESTRATOR, eventType, workflowID, agentID, data)
}
