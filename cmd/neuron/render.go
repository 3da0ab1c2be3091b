package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
)

// Event types the CLI knows by name.
const (
	// eventRunRequested is published by `neuron run` before it
	// dispatches: its sequence is where the run's event replay starts.
	eventRunRequested = "neuron.run.requested"
	eventDispatchDone = "orchestrator.dispatch.completed"
	eventWorkflowPfx  = "orchestrator.workflow."
	eventEffectPfx    = "orchestrator.effect."
)

// workflowEnded reports whether ev says its workflow stopped (completed,
// failed, canceled or suspended).
func workflowEnded(ev *lifecyclev1.LifecycleEvent) bool {
	t := ev.GetObservable().GetEventType()
	switch strings.TrimPrefix(t, eventWorkflowPfx) {
	case "completed", "failed", "canceled", "suspended":
		return strings.HasPrefix(t, eventWorkflowPfx)
	}
	return false
}

// money formats an amount of USD ("" is zero).
func money(m *typesv1.Money) string { return usd(m.GetAmount()) }

// usd formats a decimal amount string of USD.
func usd(amount string) string {
	if amount == "" {
		amount = "0"
	}
	return "$" + amount
}

// describe is one line about ev for a person, without its envelope.
func describe(ev *lifecyclev1.LifecycleEvent) string {
	switch e := ev.GetEvent().(type) {
	case *lifecyclev1.LifecycleEvent_Budget:
		switch b := e.Budget.GetKind().(type) {
		case *lifecyclev1.BudgetEvent_CostIncurred:
			return fmt.Sprintf("cost +%s (workflow total %s)", money(b.CostIncurred.GetCost()), money(b.CostIncurred.GetCumulative()))
		case *lifecyclev1.BudgetEvent_BudgetWarning:
			return fmt.Sprintf("budget warning: spent %s of %s", money(b.BudgetWarning.GetSpent()), money(b.BudgetWarning.GetLimit()))
		case *lifecyclev1.BudgetEvent_BudgetAction:
			d := b.BudgetAction.GetDecision()
			s := "budget decision: " + strings.TrimPrefix(d.GetKind().String(), "BUDGET_DECISION_KIND_")
			if d.GetFromModel() != "" || d.GetToModel() != "" {
				s += fmt.Sprintf(" (%s -> %s)", d.GetFromModel(), d.GetToModel())
			}
			return s
		}
	case *lifecyclev1.LifecycleEvent_Compaction:
		switch k := e.Compaction.GetKind().(type) {
		case *lifecyclev1.CompactionEvent_ContextPressure:
			p := k.ContextPressure
			return fmt.Sprintf("context %.0f%% full (%d of %d tokens)", p.GetFillPercent(), p.GetTokensUsed(), p.GetTokensAvailable())
		case *lifecyclev1.CompactionEvent_PreCompactionFlush:
			return "flush memory before compaction"
		case *lifecyclev1.CompactionEvent_CompactionComplete:
			c := k.CompactionComplete
			return fmt.Sprintf("context compacted (%s, %d tokens freed)", c.GetStrategy(), c.GetTokensFreed())
		}
	case *lifecyclev1.LifecycleEvent_Observable:
		return describeObservable(e.Observable)
	}
	return "event " + string(protoLine(ev))
}

// describeObservable describes the observable events the CLI knows by
// type; others as their type and data.
func describeObservable(o *lifecyclev1.ObservableEvent) string {
	d, _ := o.GetData().AsInterface().(map[string]any)
	str := func(k string) string {
		switch v := d[k].(type) {
		case string:
			return v
		case nil:
			return ""
		case float64:
			return fmt.Sprint(v)
		default:
			b, _ := json.Marshal(v)
			return string(b)
		}
	}
	t := o.GetEventType()
	switch t {
	case eventRunRequested:
		return "dispatch requested by neuron run"
	case "orchestrator.workflow.started":
		return fmt.Sprintf("workflow started (agent %s)", str("agent_id"))
	case eventDispatchDone:
		return fmt.Sprintf("operator call %s: %s, %s effect(s), cost %s, %sms",
			str("dispatch_id"), strings.TrimPrefix(str("exit"), "EXIT_KIND_"), str("effects"), usd(str("cost")), str("duration_ms"))
	case "orchestrator.dispatch.failed":
		return fmt.Sprintf("operator call %s failed: %s: %s", str("dispatch_id"), codeFromData(d["code"]), str("message"))
	case "orchestrator.effect.applied":
		return fmt.Sprintf("effect %s applied: %s", str("effect"), str("detail"))
	case "orchestrator.effect.not_applied":
		return fmt.Sprintf("effect %s NOT applied: %s", str("effect"), str("detail"))
	case "orchestrator.effect.unhandled":
		return fmt.Sprintf("custom effect %s has no handler", str("effect_type"))
	case "orchestrator.workflow.completed", "orchestrator.workflow.suspended":
		return fmt.Sprintf("workflow %s: %s operator call(s), spent %s, exit %s",
			strings.TrimPrefix(t, eventWorkflowPfx), str("steps"), usd(str("spent")), strings.TrimPrefix(str("exit"), "EXIT_KIND_"))
	case "orchestrator.workflow.failed", "orchestrator.workflow.canceled":
		return fmt.Sprintf("workflow %s: %s: %s", strings.TrimPrefix(t, eventWorkflowPfx), codeFromData(d["code"]), str("message"))
	case "orchestrator.signal.accepted":
		return fmt.Sprintf("signal %s accepted", str("sequence"))
	case "operator.log":
		return fmt.Sprintf("log %s: %s", str("level"), str("message"))
	}
	if o.GetData() == nil {
		return t
	}
	return t + " " + string(protoLine(o.GetData()))
}

// codeFromData names a gRPC code carried as a JSON number.
func codeFromData(v any) string {
	if f, ok := v.(float64); ok {
		return codeName(codes.Code(uint32(f)))
	}
	return fmt.Sprint(v)
}

// eventLine is one line for `neuron events`: sequence, time, workflow,
// agent and the description.
func eventLine(ev *lifecyclev1.LifecycleEvent) string {
	ts := ""
	if ev.GetTime() != nil {
		ts = ev.GetTime().AsTime().Local().Format("15:04:05.000")
	}
	wf, agent := ev.GetWorkflowId(), ev.GetAgentId()
	if wf == "" {
		wf = "-"
	}
	if agent == "" {
		agent = "-"
	}
	return fmt.Sprintf("%d  %s  %s  %s  %s", ev.GetSequence(), ts, wf, agent, describe(ev))
}

// effectKinds maps effect idempotency keys to their kind ("write_memory",
// "delegate", ...), learned from the orchestrator's effect events.
type effectKinds map[string]string

// learn records the kind of the effect an effect event is about.
func (k effectKinds) learn(ev *lifecyclev1.LifecycleEvent) {
	o := ev.GetObservable()
	if !strings.HasPrefix(o.GetEventType(), eventEffectPfx) {
		return
	}
	d, _ := o.GetData().AsInterface().(map[string]any)
	key, _ := d["idempotency_key"].(string)
	kind, _ := d["effect"].(string)
	if key != "" && kind != "" {
		k[key] = kind
	}
}

// isScripted reports whether out came from the built-in scripted model.
func isScripted(out *operatorv1.OperatorOutput) bool {
	return out.GetMetadata().GetProvider() == "scripted"
}

// printResult writes the answer, the model, the tool calls, the cost and
// the effects of a finished dispatch.
func printResult(w io.Writer, agent string, resp *orchestratorv1.DispatchResponse, kinds effectKinds) {
	out := resp.GetOutput()
	md := out.GetMetadata()
	exit := strings.TrimPrefix(out.GetExitReason().GetKind().String(), "EXIT_KIND_")
	fmt.Fprintf(w, "\nanswer (%s):\n", agent)
	text := strings.TrimSpace(content.TextOf(out.GetMessage()))
	if text == "" {
		text = "(no text)"
	}
	for _, l := range strings.Split(text, "\n") {
		fmt.Fprintf(w, "  %s\n", l)
	}
	if msg := out.GetExitReason().GetMessage(); msg != "" {
		exit += ": " + msg
	}
	fmt.Fprintf(w, "\nexit:     %s (workflow %s)\n", exit, resp.GetWorkflowId())
	model := md.GetModel()
	if md.GetProvider() != "" && md.GetProvider() != model {
		model += " (" + md.GetProvider() + ")"
	}
	if isScripted(out) {
		model = "scripted: the built-in deterministic model, NOT a language model; this answer comes from a script"
	}
	if model != "" {
		fmt.Fprintf(w, "model:    %s\n", model)
	}
	if subs := md.GetSubDispatches(); len(subs) > 0 {
		parts := make([]string, 0, len(subs))
		for _, s := range subs {
			p := s.GetName()
			if !s.GetSuccess() {
				p += " (failed: " + oneLine(s.GetError()) + ")"
			}
			parts = append(parts, p)
		}
		fmt.Fprintf(w, "tools:    %s (in the last operator call)\n", strings.Join(parts, ", "))
	}
	fmt.Fprintf(w, "tokens:   %d in, %d out (last operator call)\n", md.GetTokensIn(), md.GetTokensOut())
	cost := "cost:     " + money(resp.GetTotalCost()) + " for the whole workflow, delegations included"
	if isScripted(out) {
		cost += " (the scripted model is free)"
	}
	fmt.Fprintln(w, cost)
	if len(resp.GetEffects()) == 0 {
		fmt.Fprintln(w, "effects:  none")
		return
	}
	fmt.Fprintln(w, "effects:")
	for _, e := range resp.GetEffects() {
		state := "applied    "
		if !e.GetApplied() {
			state = "NOT applied"
		}
		kind := kinds[e.GetIdempotencyKey()]
		if kind == "" {
			kind = "effect"
		}
		fmt.Fprintf(w, "  %s  %-13s %s  [%s]\n", state, kind, oneLine(e.GetDetail()), e.GetIdempotencyKey())
	}
}

// elapsed formats a duration for progress lines: "+1.2s".
func elapsed(d time.Duration) string {
	return fmt.Sprintf("+%.1fs", d.Seconds())
}
