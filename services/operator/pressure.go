package operator

import (
	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/services/operator/compaction"
	"github.com/secbear/neuron/services/operator/provider"
)

// DefaultContextPressure is the binary's --context-pressure: the fill of
// the context budget, in percent, at which ContextPressure is published.
const DefaultContextPressure = 80

// pressure measures msgs against b before a model call. When they fill
// at least Models.ContextPressure percent of the budget's limit
// (ContextWindow - Reserve, the size at which the strategies compact), it
// publishes a ContextPressure event: once, and again only after a
// compaction brought the context back under the threshold. ok is
// whether msgs fit the budget (compaction.Fits).
func (r *run) pressure(b compaction.Budget, msgs []provider.Message) (est, limit int, ok bool) {
	est, limit, ok = compaction.Fits(r.lim.system, r.specs, msgs, b)
	threshold := r.op.cfg.Models.ContextPressure
	if limit <= 0 || threshold <= 0 {
		return est, limit, ok
	}
	fill := 100 * float64(est) / float64(limit)
	if fill < threshold {
		r.pressured = false
		return est, limit, ok
	}
	if r.pressured {
		return est, limit, ok
	}
	r.pressured = true
	d := r.in.GetDispatch()
	r.op.events.Publish(&lifecyclev1.LifecycleEvent{
		WorkflowId: d.GetWorkflowId(), AgentId: d.GetAgentId(), CorrelationId: d.GetCorrelationId(),
		Event: &lifecyclev1.LifecycleEvent_Compaction{Compaction: &lifecyclev1.CompactionEvent{
			Kind: &lifecyclev1.CompactionEvent_ContextPressure{ContextPressure: &lifecyclev1.ContextPressure{
				AgentId: d.GetAgentId(), FillPercent: min(fill, 100),
				TokensUsed: uint64(est), TokensAvailable: uint64(limit),
			}},
		}},
	})
	return est, limit, ok
}

// publishFlush publishes PreCompactionFlush before the strategy compacts
// a context over its budget: what is worth keeping should be written to
// memory now. Its scope is the session's, where the summary goes (the
// workflow's for an invocation without a session).
func (r *run) publishFlush() {
	d := r.in.GetDispatch()
	var sc *typesv1.Scope
	switch {
	case r.in.SessionId != nil:
		sc = scope.Session(r.in.GetSessionId())
	case d.GetWorkflowId() != "":
		sc = scope.Workflow(d.GetWorkflowId())
	}
	r.op.events.Publish(&lifecyclev1.LifecycleEvent{
		WorkflowId: d.GetWorkflowId(), AgentId: d.GetAgentId(), CorrelationId: d.GetCorrelationId(),
		Event: &lifecyclev1.LifecycleEvent_Compaction{Compaction: &lifecyclev1.CompactionEvent{
			Kind: &lifecyclev1.CompactionEvent_PreCompactionFlush{PreCompactionFlush: &lifecyclev1.PreCompactionFlush{
				AgentId: d.GetAgentId(), Scope: sc,
			}},
		}},
	})
}
