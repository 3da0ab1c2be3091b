package orchestrator

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/shopspring/decimal"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/lifecycle"
	"github.com/secbear/neuron/pkg/money"
)

// The workflow, written once for every engine: the root agent's operator
// calls, their effects (memory, signals, logs and custom effects through
// the host; delegates and handoffs here), re-invocations with delegation
// results, handoffs, signals, suspension, budgets and the delegation
// guards. Each operator call is step n, counted in execution order. The
// code is deterministic given its host's answers (see Host), which is
// what lets an engine replay it after a crash.

// Exit is how a run of the workflow ended.
type Exit struct {
	// Status: COMPLETED, SUSPENDED, FAILED or CANCELED; RUNNING when the
	// workflow was paused for a shutdown.
	Status  orchestratorv1.WorkflowStatus
	Failure *Failure
}

// Run runs the workflow on h from the top (an engine's replay
// fast-forwards through what it recorded) until it ends, suspends or is
// stopped.
func Run(h Host, s *Spec) Exit {
	w := &workflow{h: h, s: s, models: map[string]string{}, agents: map[string]AgentInfo{}, limit: s.Budget, maxSteps: s.MaxSteps}
	root := &operatorv1.OperatorInput{}
	if err := proto.Unmarshal(s.Input, root); err != nil {
		return w.fail(fmt.Errorf("the workflow's input is corrupt: %v: %w", err, errs.Internal))
	}
	w.corr = root.GetDispatch().GetCorrelationId()
	if w.corr == "" {
		w.corr = s.ID
	}
	w.event(s.RootAgent, "orchestrator.workflow.started", object(str("agent_id", s.RootAgent), flag("detached", s.Detached)))
	info, err := w.lookup(s.RootAgent)
	if err != nil {
		return w.fail(err)
	}
	f := frame{agent: s.RootAgent, info: info, chain: []string{s.RootAgent}, cause: root.GetDispatch().GetCausationId(), session: root.SessionId}
	_, err = w.agent(f, Plan{Kind: PlanInput, Input: s.Input}, true)
	if err != nil && !errors.Is(err, errParked) {
		return w.fail(err)
	}
	if w.parked {
		return Exit{Status: orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED}
	}
	return Exit{Status: orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED}
}

// workflow is one run of a workflow.
type workflow struct {
	h       Host
	s       *Spec
	n       uint64 // steps begun
	steps   uint32 // steps done
	last    uint64 // the last step done
	current string // the agent of the last step done
	spent   decimal.Decimal
	warned  bool
	models  map[string]string // downgraded models by agent
	agents  map[string]AgentInfo
	corr    string
	parked  bool // suspended, to run again when a signal arrives
	// limit and maxSteps are the workflow's limits, as UpdateWorkflowLimits
	// changed them; asking names the one it reached and waits for a raise
	// of before its next operator call ("" when none).
	limit    decimal.NullDecimal
	maxSteps uint64
	asking   string
}

// errParked unwinds a workflow that suspended (to wait for a raise) in the
// middle of an agent, up to Run; the engine runs it again when a signal
// arrives.
var errParked = errors.New("the workflow suspended")

// frame is one agent's place in the workflow.
type frame struct {
	agent   string
	info    AgentInfo
	depth   uint32
	chain   []string // delegation ancestry, root first, this agent last
	parent  string   // the dispatch that caused this one
	cause   string   // the effect that caused it
	session *string
	// at and index locate the Delegate effect a delegated agent runs for
	// (0: not delegated), so that its re-invocations keep its brief.
	at    uint64
	index int
}

// agentError is an operator call that failed for good, on its way up to
// the delegating parent or the workflow's end.
type agentError struct {
	agent string
	err   *OperatorError
}

func (e *agentError) Error() string { return fmt.Sprintf("agent %q: %v", e.agent, e.err) }
func (e *agentError) Unwrap() error { return e.err }

// event publishes an orchestrator ObservableEvent.
func (w *workflow) event(agent, typ string, data *structpb.Value) {
	w.h.Publish(w.observable(agent, typ, data))
}

func (w *workflow) observable(agent, typ string, data *structpb.Value) *lifecyclev1.LifecycleEvent {
	return lifecycle.Observable(lifecyclev1.EventSource_EVENT_SOURCE_ORCHESTRATOR, typ, w.s.ID, agent, data)
}

// lookup asks the host about an agent, once per agent.
func (w *workflow) lookup(id string) (AgentInfo, error) {
	if info, ok := w.agents[id]; ok {
		return info, nil
	}
	info, err := w.h.Lookup(id)
	if err != nil {
		return info, err
	}
	w.agents[id] = info
	return info, nil
}

// fail ends the workflow for err, unless it was stopped from outside
// without an end to record.
func (w *workflow) fail(err error) Exit {
	status := orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED
	var f *Failure
	if stop := w.h.Stopped(err); stop != nil {
		if stop.Pause {
			return Exit{Status: orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING}
		}
		status = orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED
		f = &Failure{Code: int32(errs.Code(errs.Canceled)), Message: stop.Reason}
	} else {
		f = FailureOf(err)
		if f.Code == int32(errs.Code(errs.Canceled)) {
			status = orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED
		}
	}
	ending := w.observable(w.current, "orchestrator.workflow.failed", object(num("code", f.Code), str("message", f.Message), str("reason", f.Reason)))
	if status == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED {
		ending = w.observable(w.current, "orchestrator.workflow.canceled", object(str("reason", f.Message)))
	}
	w.h.End(status, f, ending)
	return Exit{Status: status, Failure: f}
}

// agent runs one agent to its end: its operator calls, their effects,
// re-invocations with delegation results and handoffs. root marks the
// workflow's top level, where signals keep the workflow going and the
// end is recorded.
func (w *workflow) agent(f frame, plan Plan, root bool) (*StepResult, error) {
	for {
		out, dispatchID, halt, err := w.step(f, plan)
		if err != nil {
			return nil, err
		}
		results, handoff, err := w.effects(f, dispatchID, out, halt)
		if err != nil {
			return nil, err
		}
		if halt != nil {
			return nil, halt
		}
		if handoff != nil {
			info, err := w.lookup(handoff.Ref.Agent)
			if err != nil {
				return nil, err
			}
			chain := append(append([]string(nil), f.chain[:len(f.chain)-1]...), handoff.Ref.Agent)
			plan = Plan{Kind: PlanHandoff, Step: handoff.Step, Effect: handoff.Index, Session: f.session, From: f.agent, Results: results}
			f = frame{agent: handoff.Ref.Agent, info: info, depth: f.depth, chain: chain, parent: dispatchID, cause: handoff.Ref.Key, session: f.session}
			continue
		}
		if len(results) > 0 {
			f.parent, f.cause = dispatchID, ""
			plan = Plan{Kind: PlanResults, Session: f.session, Results: results, Step: f.at, Effect: f.index}
			continue
		}
		if !root {
			return out, nil
		}
		suspended := out.Exit == operatorv1.ExitKind_EXIT_KIND_SUSPENDED.String()
		kind := "orchestrator.workflow.completed"
		if suspended {
			kind = "orchestrator.workflow.suspended"
		}
		data := object(num("steps", w.steps), str("spent", w.spent.String()), str("exit", out.Exit))
		if suspended && len(out.Pending) > 0 {
			data.GetStructValue().Fields["approvals"] = approvals(out.Pending)
		}
		more, err := w.h.Await(suspended, w.observable(w.current, kind, data))
		if err != nil {
			return nil, err
		}
		if !more {
			w.parked = suspended
			return out, nil
		}
		// Signals arrived: the current agent gets them.
		f.parent, f.cause = dispatchID, ""
		in := &operatorv1.OperatorInput{Trigger: operatorv1.TriggerType_TRIGGER_TYPE_SIGNAL, SessionId: f.session}
		if suspended {
			in.Resume = &operatorv1.Resume{ResumeToken: out.ResumeToken}
		}
		b, err := proto.Marshal(in)
		if err != nil {
			return nil, err
		}
		plan = Plan{Kind: PlanInput, Input: b}
	}
}

// step makes the next operator call. halt is set when the budget policy
// ends the workflow after this call (its effects are still executed,
// except dispatches).
func (w *workflow) step(f frame, plan Plan) (out *StepResult, id string, halt error, err error) {
	if w.n+1 > w.maxSteps {
		if !w.s.AskLimits {
			return nil, "", nil, fmt.Errorf("the workflow reached its limit of %d operator calls (agents may be handing off or delegating in a loop): %w",
				w.maxSteps, errs.FailedPrecondition)
		}
		w.asking = LimitMaxSteps
	}
	if w.asking != "" {
		if err := w.wait(f); err != nil {
			return nil, "", nil, err
		}
	}
	w.n++
	n := w.n
	id = DispatchID(w.s.ID, n)
	model, downgraded := w.models[f.agent]
	c := &StepCall{N: n, Dispatch: id, Agent: f.agent, Info: f.info, Plan: plan, Model: model, Downgraded: downgraded,
		Parent: f.parent, Cause: f.cause, Corr: w.corr, Depth: f.depth, Trace: w.s.Trace,
		Budget: w.limit, Spent: w.spent, MaxSteps: w.maxSteps, Asking: w.asking}
	if w.limit.Valid {
		c.Remaining = decimal.NewNullDecimal(w.limit.Decimal.Sub(w.spent))
	}
	out, err = w.h.Call(c)
	w.asking = ""
	if out != nil && out.Limits != nil {
		w.limits(f, out.Limits)
	}
	var opErr *OperatorError
	switch {
	case errors.As(err, &opErr):
		w.event(f.agent, "orchestrator.dispatch.failed", object(str("dispatch_id", id), num("code", opErr.Failure.Code),
			str("message", opErr.Failure.Message), str("reason", opErr.Failure.Reason)))
		return nil, id, nil, &agentError{agent: f.agent, err: opErr}
	case err != nil:
		return nil, id, nil, err
	}
	out.N = n
	w.steps++
	w.last = n
	w.current = f.agent
	w.spent = w.spent.Add(out.Cost)
	w.event(f.agent, "orchestrator.dispatch.completed", object(str("dispatch_id", id), str("exit", out.Exit), str("cost", out.Cost.String()),
		num("duration_ms", out.Duration.Milliseconds()), num("effects", len(out.Effects)), numbers("signals", out.Signals)))
	halt, err = w.budget(f, out.Cost)
	return out, id, halt, err
}

// wait suspends the workflow until a signal arrives, reporting the limit
// it reached (Workflow.limit_request); the next operator call applies the
// raise (ApplyLimits). An engine that cannot wait ends this run: errParked.
func (w *workflow) wait(f frame) error {
	data := object(num("steps", w.steps), str("spent", w.spent.String()), str("exit", "LIMIT_REACHED"))
	data.GetStructValue().Fields["limit_request"] = w.limitRequest(w.asking, f.agent)
	more, err := w.h.AwaitRaise(w.asking, w.observable(f.agent, "orchestrator.workflow.suspended", data))
	if err != nil {
		return err
	}
	if !more {
		w.parked = true
		return errParked
	}
	return nil
}

// limits takes in a change of the workflow's limits delivered with its
// last operator call, and reports it.
func (w *workflow) limits(f frame, l *Limits) {
	if l.Rejected {
		return // ApplyLimits failed the call if it mattered
	}
	if l.Budget.Valid {
		w.limit = l.Budget
		w.warned = w.spent.GreaterThanOrEqual(w.limit.Decimal.Mul(w.s.WarnFraction))
	}
	if l.MaxSteps > 0 {
		w.maxSteps = l.MaxSteps
	}
	fields := []field{numbers("signals", l.Seqs), str("reason", l.Reason), num("max_steps", w.maxSteps)}
	if l.Budget.Valid {
		fields = append(fields, str("budget", w.limit.Decimal.String()))
	}
	w.event(f.agent, "orchestrator.workflow.limits_changed", object(fields...))
}

// field is one field of an event's data: the JSON value it is stored
// as, built directly (an event's data is a google.protobuf.Struct).
type field struct {
	key string
	val *structpb.Value
}

func str(key, v string) field { return field{key, structpb.NewStringValue(v)} }

func flag(key string, v bool) field { return field{key, structpb.NewBoolValue(v)} }

func num[T int | int32 | int64 | uint32 | uint64](key string, v T) field {
	return field{key, structpb.NewNumberValue(float64(v))}
}

// numbers is seqs as a JSON array; null for none.
func numbers(key string, seqs []uint64) field {
	if seqs == nil {
		return field{key, structpb.NewNullValue()}
	}
	vals := make([]*structpb.Value, len(seqs))
	for i, s := range seqs {
		vals[i] = structpb.NewNumberValue(float64(s))
	}
	return field{key, structpb.NewListValue(&structpb.ListValue{Values: vals})}
}

// approvals is the list of tool calls a suspension waits on, as an
// event's data shows it.
func approvals(calls []PendingCall) *structpb.Value {
	vals := make([]*structpb.Value, len(calls))
	for i, c := range calls {
		v := object(str("tool_use_id", c.ID), str("name", c.Name), str("reason", c.Reason))
		in := &structpb.Value{}
		if c.Input != nil && protojson.Unmarshal(c.Input, in) == nil {
			v.GetStructValue().Fields["input"] = in
		}
		vals[i] = v
	}
	return structpb.NewListValue(&structpb.ListValue{Values: vals})
}

// object is an event's data of these fields.
func object(fs ...field) *structpb.Value {
	m := make(map[string]*structpb.Value, len(fs))
	for _, f := range fs {
		m[f.key] = f.val
	}
	return structpb.NewStructValue(&structpb.Struct{Fields: m})
}

// budget reports the call's cost, warns as the budget nears its end, and
// asks the policy what to do. It returns halt when the policy halts.
func (w *workflow) budget(f frame, cost decimal.Decimal) (halt error, err error) {
	w.h.Publish(lifecycle.Budget(w.s.ID, f.agent, &lifecyclev1.BudgetEvent{Kind: &lifecyclev1.BudgetEvent_CostIncurred{
		CostIncurred: &lifecyclev1.CostIncurred{AgentId: f.agent, Cost: money.FromDecimal(cost), Cumulative: money.FromDecimal(w.spent)},
	}}))
	if !w.limit.Valid {
		return nil, nil
	}
	limit := w.limit.Decimal
	if !w.warned && w.spent.GreaterThanOrEqual(limit.Mul(w.s.WarnFraction)) {
		w.warned = true
		w.h.Publish(lifecycle.Budget(w.s.ID, f.agent, &lifecyclev1.BudgetEvent{Kind: &lifecyclev1.BudgetEvent_BudgetWarning{
			BudgetWarning: &lifecyclev1.BudgetWarning{WorkflowId: w.s.ID, Spent: money.FromDecimal(w.spent), Limit: money.FromDecimal(limit)},
		}}))
	}
	model := f.info.Model
	if m, ok := w.models[f.agent]; ok {
		model = m
	}
	d, err := w.h.Decide(BudgetState{WorkflowID: w.s.ID, AgentID: f.agent, Model: model, DowngradeModel: f.info.DowngradeModel,
		Spent: w.spent, Limit: limit, WarnFraction: w.s.WarnFraction, Ask: w.s.AskLimits})
	if err != nil {
		return nil, err
	}
	kind := d.GetKind()
	if kind == lifecyclev1.BudgetDecisionKind_BUDGET_DECISION_KIND_UNSPECIFIED || kind == lifecyclev1.BudgetDecisionKind_BUDGET_DECISION_KIND_CONTINUE {
		return nil, nil
	}
	if kind == lifecyclev1.BudgetDecisionKind_BUDGET_DECISION_KIND_DOWNGRADE_MODEL {
		if w.models[f.agent] == d.GetToModel() || d.GetToModel() == "" {
			return nil, nil // already downgraded: nothing new to announce
		}
		w.models[f.agent] = d.GetToModel()
	}
	w.h.Publish(lifecycle.Budget(w.s.ID, f.agent, &lifecyclev1.BudgetEvent{Kind: &lifecyclev1.BudgetEvent_BudgetAction{
		BudgetAction: &lifecyclev1.BudgetAction{WorkflowId: w.s.ID, Decision: d},
	}}))
	if kind == lifecyclev1.BudgetDecisionKind_BUDGET_DECISION_KIND_REQUEST_INCREASE && w.s.AskLimits {
		w.asking = LimitBudget // before the next operator call, wait for the raise
	}
	if kind == lifecyclev1.BudgetDecisionKind_BUDGET_DECISION_KIND_HALT_WORKFLOW {
		return fmt.Errorf("the workflow budget of %s USD is spent (%s USD after %d operator calls): %w",
			limit.String(), w.spent.String(), w.n, errs.BudgetExhausted), nil
	}
	return nil, nil
}

// handoff is the Handoff effect an output follows.
type handoff struct {
	EffectCall
}

// effects executes an output's effects in declaration order, each once.
// Delegates run their child agents to the end; the first Handoff is
// returned for the caller to follow. With halt set (the budget is spent)
// dispatching effects are recorded as not applied.
func (w *workflow) effects(f frame, dispatchID string, out *StepResult, halt error) ([]DelegationRef, *handoff, error) {
	var (
		results []DelegationRef
		next    *handoff
	)
	for i, ref := range out.Effects {
		c := &EffectCall{Step: out.N, Index: i, Dispatch: dispatchID, Agent: f.agent, Ref: ref}
		switch ref.Kind {
		case "delegate":
			d, err := w.delegate(f, c, halt)
			if err != nil {
				return nil, nil, err
			}
			results = append(results, d)
		case "handoff":
			if err := allowed(f, "hand off", ref.Agent); err != nil {
				return nil, nil, err
			}
			var detail string
			switch {
			case next != nil:
				detail = fmt.Sprintf("not followed: this output already handed off to %q; only the first handoff counts", next.Ref.Agent)
			case halt != nil:
				detail = "not followed: the workflow budget is spent"
			default:
				if _, err := w.lookup(ref.Agent); err != nil {
					detail = "not followed: " + err.Error()
				}
			}
			ok := detail == ""
			if ok {
				next = &handoff{*c}
				detail = fmt.Sprintf("handed off to %q", ref.Agent)
			}
			if err := w.record(c, Outcome{Applied: ok, Detail: detail}); err != nil {
				return nil, nil, err
			}
		default:
			o, err := w.h.Apply(c)
			if err != nil {
				return nil, nil, err
			}
			for _, ev := range o.Events {
				w.h.Publish(ev)
			}
			w.effectEvent(c, o)
		}
	}
	return results, next, nil
}

// record keeps the outcome of an effect the workflow decided and
// reports it.
func (w *workflow) record(c *EffectCall, o Outcome) error {
	if err := w.h.Record(c, o); err != nil {
		return err
	}
	w.effectEvent(c, o)
	return nil
}

func (w *workflow) effectEvent(c *EffectCall, o Outcome) {
	t := "orchestrator.effect.applied"
	if !o.Applied {
		t = "orchestrator.effect.not_applied"
	}
	w.event(c.Agent, t, object(str("dispatch_id", c.Dispatch), str("effect", c.Ref.Kind), str("idempotency_key", c.Ref.Key), str("detail", o.Detail)))
}

// guardError is a delegation guard (depth, cycle) tripping: it fails the
// workflow with FAILED_PRECONDITION.
func guardError(format string, a ...any) error {
	return fmt.Errorf(format+": %w", append(a, errs.FailedPrecondition)...)
}

// allowed checks the delegation allowlist of f's agent (its definition's
// delegation.allowed_agents): dispatching an agent outside it fails the
// workflow, like the other delegation guards.
func allowed(f frame, verb, to string) error {
	if !f.info.Restricted || slices.Contains(f.info.AllowedAgents, to) {
		return nil
	}
	list := "none"
	if len(f.info.AllowedAgents) > 0 {
		list = strings.Join(f.info.AllowedAgents, ", ")
	}
	return guardError("agent %q may not %s to agent %q: it is not in %q's delegation allowlist (allowed: %s); add it to delegation.allowed_agents of %q",
		f.agent, verb, to, f.agent, list, f.agent)
}

// delegate runs a Delegate effect's child agent to its end.
func (w *workflow) delegate(f frame, c *EffectCall, halt error) (DelegationRef, error) {
	res := DelegationRef{Agent: c.Ref.Agent, Key: c.Ref.Key}
	notRun := func(detail string) (DelegationRef, error) {
		res.Detail = detail
		return res, w.record(c, Outcome{Detail: detail})
	}
	if halt != nil {
		return notRun("not run: the workflow budget is spent")
	}
	if c.Ref.Invalid != "" {
		// The operator's tool refuses such a brief before declaring it;
		// an operator declaring one anyway is refused like a request.
		return res, fmt.Errorf("agent %q declared an invalid Delegate (effect %d of operator call %d, to agent %q): %s: %w",
			f.agent, c.Index, c.Step, c.Ref.Agent, c.Ref.Invalid, errs.InvalidArgument)
	}
	if err := allowed(f, "delegate", c.Ref.Agent); err != nil {
		return res, err
	}
	info, err := w.lookup(c.Ref.Agent)
	if err != nil {
		return notRun(err.Error())
	}
	chain := append(append([]string(nil), f.chain...), c.Ref.Agent)
	if slices.Contains(f.chain, c.Ref.Agent) {
		return res, guardError("delegation cycle: %s", strings.Join(chain, " -> "))
	}
	if f.depth+1 > w.s.MaxDepth {
		return res, guardError("delegation depth limit of %d reached: %s", w.s.MaxDepth, strings.Join(chain, " -> "))
	}
	child := frame{agent: c.Ref.Agent, info: info, depth: f.depth + 1, chain: chain, parent: c.Dispatch, cause: c.Ref.Key, session: c.Ref.Session,
		at: c.Step, index: c.Index}
	res.First, res.At, res.Index = w.n+1, c.Step, c.Index
	out, err := w.agent(child, Plan{Kind: PlanDelegate, Step: c.Step, Effect: c.Index}, false)
	var failed *agentError
	switch {
	case errors.As(err, &failed):
		return notRun("failed: " + failed.err.Error())
	case err != nil:
		return res, err
	}
	res.OK = true
	res.Step = w.last
	res.Exit = strings.TrimPrefix(out.Exit, "EXIT_KIND_")
	return res, w.record(c, Outcome{Applied: true, Detail: fmt.Sprintf("agent %q ran (%s)", c.Ref.Agent, res.Exit)})
}
