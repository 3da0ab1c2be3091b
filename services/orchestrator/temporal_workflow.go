package orchestrator

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/shopspring/decimal"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
	"google.golang.org/protobuf/proto"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/lifecycle"
	"github.com/secbear/neuron/pkg/money"
)

// The Temporal workflow is the same agent loop as the bbolt engine's
// runner, written against workflow.Context: operator calls and effects
// are activities, delegates run inline (depth + 1), handoffs continue
// with the next agent, signals arrive on a Temporal signal channel and
// queries read the workflow's own view of itself. Only references cross
// the history: operator inputs are planned (which output, which effect)
// and built by the call activity, and every OperatorOutput (the
// transcript) is kept in the State service under the workflow's scope.
//
// Decisions that depend on the process (the agent registry, the budget
// policy) are taken inside workflow.SideEffect, so a replay on a worker
// with a different registry still follows the recorded path.

// Names registered with Temporal. Changing one breaks running workflows.
const (
	twName         = "neuron.workflow"
	twCallActivity = "neuron.call"
	twEffActivity  = "neuron.effect"
	twSignal       = "neuron.signal"
	twCancelSignal = "neuron.cancel"
	twQueryResult  = "neuron.result"
	twQuerySigKey  = "neuron.signal_key"
	// errTypeOperator marks an operator failure that retrying cannot fix.
	errTypeOperator = "neuron.operator_failed"
	// errTypeRetryable marks one a retry may fix (the agent's policy).
	errTypeRetryable = "neuron.operator_retryable"
	// errTypeWorkflow is a workflow that failed; its details are a failure.
	errTypeWorkflow = "neuron.workflow_failed"
	// memo keys, read by ListWorkflows without a worker.
	memoFingerprint = "fingerprint"
	memoRootAgent   = "root_agent"
	memoStatus      = "status"
	memoAgent       = "current_agent"
	memoSteps       = "steps"
	memoSpent       = "spent"
	memoBudget      = "budget"
)

// twInput is the workflow's argument: the request, and the settings that
// must not change under a running workflow.
type twInput struct {
	RootAgent    string            `json:"root_agent"`
	Input        []byte            `json:"input"` // OperatorInput, binary
	Budget       string            `json:"budget,omitempty"`
	Deadline     time.Time         `json:"deadline,omitzero"`
	Trace        map[string]string `json:"trace,omitempty"`
	MaxDepth     uint32            `json:"max_depth"`
	MaxSteps     uint64            `json:"max_steps"`
	WarnFraction string            `json:"warn_fraction"`
}

// stepPlan tells the call activity how to build an operator input.
type stepPlan struct {
	// Kind: "input" (Input as is), "delegate" (the Delegate effect Effect
	// of step Step's output), "results" (delegation results), "handoff"
	// (the Handoff effect Effect of step Step, with Results).
	Kind    string          `json:"kind"`
	Input   []byte          `json:"input,omitempty"`
	Step    uint64          `json:"step,omitempty"`
	Effect  int             `json:"effect,omitempty"`
	Session *string         `json:"session,omitempty"`
	From    string          `json:"from,omitempty"`
	Results []delegationRef `json:"results,omitempty"`
}

// delegationRef is a delegation's result by reference: the child's last
// output is step Step's.
type delegationRef struct {
	Agent  string `json:"agent"`
	Key    string `json:"key"`
	OK     bool   `json:"ok"`
	Exit   string `json:"exit,omitempty"`
	Step   uint64 `json:"step,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// twSignalIn is a signal as the workflow receives it.
type twSignalIn struct {
	Key     string `json:"key"`
	Payload []byte `json:"payload"` // SignalPayload, binary
}

// callArgs is one operator call.
type callArgs struct {
	WorkflowID string            `json:"workflow_id"`
	N          uint64            `json:"n"`
	Agent      string            `json:"agent"`
	Plan       stepPlan          `json:"plan"`
	Model      string            `json:"model,omitempty"`
	Downgraded bool              `json:"downgraded,omitempty"`
	Parent     string            `json:"parent,omitempty"`
	Cause      string            `json:"cause,omitempty"`
	Corr       string            `json:"corr"`
	Depth      uint32            `json:"depth"`
	Trace      map[string]string `json:"trace,omitempty"`
	Signals    []signalRecord    `json:"signals,omitempty"`
	// Remaining is the workflow budget left; empty for none.
	Remaining string `json:"remaining,omitempty"`
}

// callResult is what the workflow needs of an output.
type callResult struct {
	Exit        string       `json:"exit"`
	ResumeToken string       `json:"resume_token,omitempty"`
	Cost        string       `json:"cost"`
	Effects     []effectInfo `json:"effects,omitempty"`
}

// effectInfo is an effect by reference, with what the workflow decides on.
type effectInfo struct {
	Kind    string  `json:"kind"`
	Key     string  `json:"key"`
	Agent   string  `json:"agent,omitempty"`   // delegate, handoff
	Session *string `json:"session,omitempty"` // delegate
}

// effectArgs is one non-dispatching effect.
type effectArgs struct {
	WorkflowID string `json:"workflow_id"`
	Agent      string `json:"agent"`
	Step       uint64 `json:"step"`
	Index      int    `json:"index"`
	Key        string `json:"key"`
}

// effectOutcome is an executed effect.
type effectOutcome struct {
	Key     string `json:"key"`
	Applied bool   `json:"applied"`
	Detail  string `json:"detail"`
}

// twStep is a step as queries show it.
type twStep struct {
	N        uint64    `json:"n"`
	Dispatch string    `json:"dispatch_id"`
	Agent    string    `json:"agent"`
	Depth    uint32    `json:"depth"`
	Trigger  string    `json:"trigger"`
	Started  time.Time `json:"started"`
	State    string    `json:"state"`
	Error    string    `json:"error,omitempty"`
	Exit     string    `json:"exit,omitempty"`
	Cost     string    `json:"cost,omitempty"`
	Effects  []string  `json:"effects,omitempty"` // idempotency keys
	Signals  []uint64  `json:"signals,omitempty"`
}

// twResult is the workflow's view of itself (query neuron.result, and
// the workflow's result).
type twResult struct {
	Status       string                   `json:"status"`
	RootAgent    string                   `json:"root_agent"`
	CurrentAgent string                   `json:"current_agent"`
	Steps        uint32                   `json:"steps"`
	Spent        string                   `json:"spent"`
	Budget       string                   `json:"budget,omitempty"`
	LastStep     uint64                   `json:"last_step,omitempty"`
	Failure      *failure                 `json:"failure,omitempty"`
	StepList     []*twStep                `json:"step_list,omitempty"`
	Outcomes     map[string]effectOutcome `json:"outcomes,omitempty"`
	Signals      []*signalRecord          `json:"signals,omitempty"`
	Pending      uint32                   `json:"pending"`
}

// agentInfo is a registry lookup as recorded in the history.
type agentInfo struct {
	Err        string        `json:"err,omitempty"`
	Code       int32         `json:"code,omitempty"`
	Model      string        `json:"model,omitempty"`
	Downgrade  string        `json:"downgrade,omitempty"`
	Attempts   int           `json:"attempts"`
	Initial    time.Duration `json:"initial"`
	MaxBackoff time.Duration `json:"max_backoff"`
}

// twFrame is one agent's place in the workflow.
type twFrame struct {
	agent   string
	info    agentInfo
	depth   uint32
	chain   []string
	parent  string
	cause   string
	session *string
}

// tw is one execution of the workflow.
type tw struct {
	t      *Temporal
	ctx    workflow.Context
	id     string
	in     twInput
	n      uint64
	spent  decimal.Decimal
	budget decimal.NullDecimal
	warn   decimal.Decimal
	warned bool
	models map[string]string
	agents map[string]agentInfo
	corr   string
	res    twResult
	sigKey map[string]uint64
	reason string // a CancelWorkflow's reason
	// cancels carries the reason a CancelWorkflow sends before it
	// cancels; it may not have been read when the cancellation lands.
	cancels workflow.ReceiveChannel
	sigs    workflow.ReceiveChannel
}

// drain takes every signal and cancellation reason delivered so far.
func (w *tw) drain() {
	for {
		var s twSignalIn
		if !w.sigs.ReceiveAsync(&s) {
			break
		}
		w.addSignal(s)
	}
	for {
		var r string
		if !w.cancels.ReceiveAsync(&r) {
			break
		}
		if w.reason == "" {
			w.reason = r
		}
	}
}

// workflow is the Temporal workflow function.
func (t *Temporal) workflow(ctx workflow.Context, in twInput) (*twResult, error) {
	w := &tw{t: t, ctx: ctx, id: workflow.GetInfo(ctx).WorkflowExecution.ID, in: in,
		models: map[string]string{}, agents: map[string]agentInfo{}, sigKey: map[string]uint64{}}
	w.res = twResult{Status: statusName(orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING), RootAgent: in.RootAgent,
		CurrentAgent: in.RootAgent, Spent: "0", Budget: in.Budget, Outcomes: map[string]effectOutcome{}}
	if in.Budget != "" {
		b, err := decimal.NewFromString(in.Budget)
		if err != nil {
			return nil, w.fail(fmt.Errorf("budget %q: %v: %w", in.Budget, err, errs.InvalidArgument))
		}
		w.budget = decimal.NewNullDecimal(b)
	}
	w.warn = decimal.RequireFromString(DefaultWarnFraction)
	if f, err := decimal.NewFromString(in.WarnFraction); err == nil {
		w.warn = f
	}
	if err := workflow.SetQueryHandler(ctx, twQueryResult, func() (*twResult, error) { return &w.res, nil }); err != nil {
		return nil, err
	}
	if err := workflow.SetQueryHandler(ctx, twQuerySigKey, func(key string) (uint64, error) { return w.sigKey[key], nil }); err != nil {
		return nil, err
	}
	w.sigs = workflow.GetSignalChannel(ctx, twSignal)
	w.cancels = workflow.GetSignalChannel(ctx, twCancelSignal)
	// Signals are taken from the channels' buffers, never by a blocked
	// Receive: a blocked Receive takes a signal the moment it is
	// delivered, before its goroutine runs, where the workflow's own
	// code could not see it.
	workflow.Go(ctx, func(c workflow.Context) {
		for {
			if err := workflow.Await(c, func() bool { return w.sigs.Len() > 0 || w.cancels.Len() > 0 }); err != nil {
				return
			}
			w.drain()
		}
	})

	root := &operatorv1.OperatorInput{}
	if err := proto.Unmarshal(in.Input, root); err != nil {
		return nil, w.fail(fmt.Errorf("the workflow's input is corrupt: %v: %w", err, errs.Internal))
	}
	w.corr = root.GetDispatch().GetCorrelationId()
	if w.corr == "" {
		w.corr = w.id
	}
	info, err := w.lookup(in.RootAgent)
	if err != nil {
		return nil, w.fail(err)
	}
	f := twFrame{agent: in.RootAgent, info: info, chain: []string{in.RootAgent}, cause: root.GetDispatch().GetCausationId(), session: root.SessionId}
	out, err := w.agent(f, stepPlan{Kind: "input", Input: in.Input}, true)
	if err != nil {
		return nil, w.fail(err)
	}
	w.res.Status = statusName(orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)
	w.memo()
	w.event(w.res.CurrentAgent, "orchestrator.workflow.completed", map[string]any{"steps": w.res.Steps, "spent": w.res.Spent, "exit": out.Exit})
	return &w.res, nil
}

// addSignal queues a signal unless its key was seen.
func (w *tw) addSignal(s twSignalIn) {
	if _, dup := w.sigKey[s.Key]; dup && s.Key != "" {
		return
	}
	seq := uint64(len(w.res.Signals)) + 1
	if s.Key != "" {
		w.sigKey[s.Key] = seq
	}
	w.res.Signals = append(w.res.Signals, &signalRecord{Seq: seq, Payload: s.Payload, Key: s.Key, Accepted: workflow.Now(w.ctx)})
	w.res.Pending++
}

// pending takes the signals not yet delivered, marking them delivered by
// step n.
func (w *tw) pending(n uint64) []signalRecord {
	w.drain()
	var out []signalRecord
	for _, s := range w.res.Signals {
		if s.Step == 0 {
			s.Step = n
			out = append(out, signalRecord{Seq: s.Seq, Payload: s.Payload})
		}
	}
	w.res.Pending = 0
	return out
}

// event publishes an orchestrator event, once: not while replaying.
func (w *tw) event(agent, typ string, data map[string]any) {
	w.publish(lifecycle.Observable(lifecyclev1.EventSource_EVENT_SOURCE_ORCHESTRATOR, typ, w.id, agent, data))
}

func (w *tw) publish(ev *lifecyclev1.LifecycleEvent) {
	if w.t.bus != nil && !workflow.IsReplaying(w.ctx) {
		w.t.bus.Publish(ev)
	}
}

// memo publishes the workflow's summary for ListWorkflows.
func (w *tw) memo() {
	err := workflow.UpsertMemo(w.ctx, map[string]any{
		memoStatus: w.res.Status, memoAgent: w.res.CurrentAgent, memoSteps: w.res.Steps, memoSpent: w.res.Spent,
	})
	if err != nil {
		workflow.GetLogger(w.ctx).Warn("updating the workflow memo", "error", err)
	}
}

// lookup asks the registry about an agent, once per agent and workflow,
// recording the answer in the history.
func (w *tw) lookup(id string) (agentInfo, error) {
	info, ok := w.agents[id]
	if !ok {
		err := workflow.SideEffect(w.ctx, func(workflow.Context) any {
			a, err := w.t.reg.Lookup(id)
			if err != nil {
				return agentInfo{Err: err.Error(), Code: int32(errs.Code(err))}
			}
			r := a.Retry.withDefaults()
			return agentInfo{Model: a.Defaults.Model, Downgrade: a.Defaults.DowngradeModel,
				Attempts: r.MaxAttempts, Initial: r.InitialBackoff, MaxBackoff: r.MaxBackoff}
		}).Get(&info)
		if err != nil {
			return info, err
		}
		w.agents[id] = info
	}
	if info.Err != "" {
		return info, (&failure{Code: info.Code, Message: info.Err}).err()
	}
	return info, nil
}

// fail records the workflow's end for err and returns the error that
// ends the Temporal workflow.
func (w *tw) fail(err error) error {
	var f *failure
	var agentErr *agentError
	switch {
	case errors.Is(w.ctx.Err(), workflow.ErrCanceled) || temporal.IsCanceledError(err):
		w.drain()
		reason := w.reason
		if reason == "" {
			reason = "cancelled through Temporal"
		}
		w.res.Status = statusName(orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED)
		w.res.Failure = &failure{Code: int32(errs.Code(errs.Canceled)), Message: reason}
		w.event(w.res.CurrentAgent, "orchestrator.workflow.canceled", map[string]any{"reason": reason})
		return temporal.NewCanceledError(reason)
	case errors.As(err, &agentErr):
		f = toFailure(agentErr.err)
	default:
		f = toFailure(err)
	}
	w.res.Status = statusName(orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED)
	w.res.Failure = f
	w.memo()
	w.event(w.res.CurrentAgent, "orchestrator.workflow.failed", map[string]any{"code": f.Code, "message": f.Message, "reason": f.Reason})
	return temporal.NewNonRetryableApplicationError(f.Message, errTypeWorkflow, nil, f)
}

// agent runs one agent to its end, like runner.agent.
func (w *tw) agent(f twFrame, plan stepPlan, root bool) (*callResult, error) {
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
			info, err := w.lookup(handoff.Agent)
			if err != nil {
				return nil, err
			}
			chain := append(append([]string(nil), f.chain[:len(f.chain)-1]...), handoff.Agent)
			plan = stepPlan{Kind: "handoff", Step: out.step, Effect: handoff.index, Session: f.session, From: f.agent, Results: results}
			f = twFrame{agent: handoff.Agent, info: info, depth: f.depth, chain: chain, parent: dispatchID, cause: handoff.Key, session: f.session}
			continue
		}
		if len(results) > 0 {
			f.parent, f.cause = dispatchID, ""
			plan = stepPlan{Kind: "results", Session: f.session, Results: results}
			continue
		}
		if !root {
			return &out.callResult, nil
		}
		suspended := out.Exit == operatorv1.ExitKind_EXIT_KIND_SUSPENDED.String()
		w.drain()
		if w.res.Pending == 0 {
			if !suspended {
				return &out.callResult, nil
			}
			w.res.Status = statusName(orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED)
			w.memo()
			w.event(w.res.CurrentAgent, "orchestrator.workflow.suspended", map[string]any{"steps": w.res.Steps, "spent": w.res.Spent, "exit": out.Exit})
			if err := workflow.Await(w.ctx, func() bool { return w.res.Pending > 0 }); err != nil {
				return nil, err
			}
			w.res.Status = statusName(orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING)
			w.memo()
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
		plan = stepPlan{Kind: "input", Input: b}
	}
}

// stepOut is a finished step.
type stepOut struct {
	callResult
	step uint64
}

// step makes the next operator call.
func (w *tw) step(f twFrame, plan stepPlan) (*stepOut, string, error, error) {
	w.n++
	n := w.n
	if n > w.in.MaxSteps {
		return nil, "", nil, fmt.Errorf("the workflow reached its limit of %d operator calls (agents may be handing off or delegating in a loop): %w",
			w.in.MaxSteps, errs.FailedPrecondition)
	}
	id := dispatchID(w.id, n)
	model, downgraded := w.models[f.agent]
	args := callArgs{WorkflowID: w.id, N: n, Agent: f.agent, Plan: plan, Model: model, Downgraded: downgraded,
		Parent: f.parent, Cause: f.cause, Corr: w.corr, Depth: f.depth, Trace: w.in.Trace, Signals: w.pending(n)}
	if w.budget.Valid {
		args.Remaining = w.budget.Decimal.Sub(w.spent).String()
	}
	st := &twStep{N: n, Dispatch: id, Agent: f.agent, Depth: f.depth, Trigger: triggerOf(plan, args.Signals), Started: workflow.Now(w.ctx), State: "running"}
	for _, s := range args.Signals {
		st.Signals = append(st.Signals, s.Seq)
	}
	w.res.StepList = append(w.res.StepList, st)

	ao := workflow.ActivityOptions{
		StartToCloseTimeout: w.t.opts.CallTimeout,
		HeartbeatTimeout:    w.t.opts.HeartbeatTimeout,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval: f.info.Initial, BackoffCoefficient: 2, MaximumInterval: f.info.MaxBackoff,
			MaximumAttempts: int32(f.info.Attempts), NonRetryableErrorTypes: []string{errTypeOperator},
		},
	}
	if !w.in.Deadline.IsZero() {
		left := w.in.Deadline.Sub(workflow.Now(w.ctx))
		if left <= 0 {
			return nil, id, nil, w.deadlineErr(st)
		}
		ao.ScheduleToCloseTimeout = left
	}
	var res callResult
	err := workflow.ExecuteActivity(workflow.WithActivityOptions(w.ctx, ao), twCallActivity, args).Get(w.ctx, &res)
	if err != nil {
		if w.ctx.Err() != nil {
			return nil, id, nil, w.ctx.Err()
		}
		fl := activityFailure(err)
		// Past the caller's deadline, the call ends either by Temporal's
		// schedule-to-close timeout or by the operator call's own
		// DEADLINE_EXCEEDED, whichever the worker sees first.
		var timeout *temporal.TimeoutError
		if !w.in.Deadline.IsZero() && !workflow.Now(w.ctx).Before(w.in.Deadline) &&
			(errors.As(err, &timeout) || fl.Code == int32(errs.Code(errs.DeadlineExceeded))) {
			return nil, id, nil, w.deadlineErr(st)
		}
		st.State, st.Error = "failed", fl.Message
		return nil, id, nil, &agentError{agent: f.agent, err: fl.err()}
	}
	cost, _ := decimal.NewFromString(res.Cost)
	w.spent = w.spent.Add(cost)
	st.State, st.Exit, st.Cost = "done", res.Exit, cost.String()
	for _, e := range res.Effects {
		st.Effects = append(st.Effects, e.Key)
	}
	w.res.Steps++
	w.res.Spent = w.spent.String()
	w.res.LastStep = n
	w.res.CurrentAgent = f.agent
	w.memo()
	halt := w.budgetCheck(f, cost)
	return &stepOut{callResult: res, step: n}, id, halt, nil
}

// deadlineErr fails a step on the Dispatch caller's deadline.
func (w *tw) deadlineErr(st *twStep) error {
	st.State, st.Error = "failed", "the Dispatch caller's deadline passed"
	return fmt.Errorf("the Dispatch caller's deadline passed during step %d: %w", st.N, errs.DeadlineExceeded)
}

// triggerOf is the trigger a planned step will carry.
func triggerOf(plan stepPlan, sigs []signalRecord) string {
	switch {
	case len(sigs) > 0:
		return operatorv1.TriggerType_TRIGGER_TYPE_SIGNAL.String()
	case plan.Kind == "input":
		in := &operatorv1.OperatorInput{}
		_ = proto.Unmarshal(plan.Input, in)
		return in.GetTrigger().String()
	}
	return operatorv1.TriggerType_TRIGGER_TYPE_TASK.String()
}

// activityFailure is the failure an activity's error carries.
func activityFailure(err error) *failure {
	var app *temporal.ApplicationError
	if errors.As(err, &app) {
		var f failure
		if app.HasDetails() && app.Details(&f) == nil && f.Code != 0 {
			return &f
		}
		return &failure{Code: int32(errs.Code(errs.Unavailable)), Message: app.Error()}
	}
	var timeout *temporal.TimeoutError
	if errors.As(err, &timeout) {
		return &failure{Code: int32(errs.Code(errs.Unavailable)), Message: "the operator call timed out (" + timeout.TimeoutType().String() + ")", Reason: errs.ReasonRetryable}
	}
	return &failure{Code: int32(errs.Code(errs.Unavailable)), Message: err.Error()}
}

// budgetCheck is runner.budget in the workflow: events go out once, and
// the policy's decision is recorded in the history.
func (w *tw) budgetCheck(f twFrame, cost decimal.Decimal) error {
	w.publish(lifecycle.Budget(w.id, f.agent, &lifecyclev1.BudgetEvent{Kind: &lifecyclev1.BudgetEvent_CostIncurred{
		CostIncurred: &lifecyclev1.CostIncurred{AgentId: f.agent, Cost: money.FromDecimal(cost), Cumulative: money.FromDecimal(w.spent)},
	}}))
	if !w.budget.Valid {
		return nil
	}
	limit := w.budget.Decimal
	if !w.warned && w.spent.GreaterThanOrEqual(limit.Mul(w.warn)) {
		w.warned = true
		w.publish(lifecycle.Budget(w.id, f.agent, &lifecyclev1.BudgetEvent{Kind: &lifecyclev1.BudgetEvent_BudgetWarning{
			BudgetWarning: &lifecyclev1.BudgetWarning{WorkflowId: w.id, Spent: money.FromDecimal(w.spent), Limit: money.FromDecimal(limit)},
		}}))
	}
	model := f.info.Model
	if m, ok := w.models[f.agent]; ok {
		model = m
	}
	state := BudgetState{WorkflowID: w.id, AgentID: f.agent, Model: model, DowngradeModel: f.info.Downgrade,
		Spent: w.spent, Limit: limit, WarnFraction: w.warn}
	d := &lifecyclev1.BudgetDecision{}
	if err := workflow.SideEffect(w.ctx, func(workflow.Context) any { return w.t.policy.Decide(state) }).Get(&d); err != nil {
		return err
	}
	kind := d.GetKind()
	if kind == lifecyclev1.BudgetDecisionKind_BUDGET_DECISION_KIND_UNSPECIFIED || kind == lifecyclev1.BudgetDecisionKind_BUDGET_DECISION_KIND_CONTINUE {
		return nil
	}
	if kind == lifecyclev1.BudgetDecisionKind_BUDGET_DECISION_KIND_DOWNGRADE_MODEL {
		if w.models[f.agent] == d.GetToModel() || d.GetToModel() == "" {
			return nil
		}
		w.models[f.agent] = d.GetToModel()
	}
	w.publish(lifecycle.Budget(w.id, f.agent, &lifecyclev1.BudgetEvent{Kind: &lifecyclev1.BudgetEvent_BudgetAction{
		BudgetAction: &lifecyclev1.BudgetAction{WorkflowId: w.id, Decision: d},
	}}))
	if kind == lifecyclev1.BudgetDecisionKind_BUDGET_DECISION_KIND_HALT_WORKFLOW {
		return fmt.Errorf("the workflow budget of %s USD is spent (%s USD after %d operator calls): %w",
			limit.String(), w.spent.String(), w.n, errs.BudgetExhausted)
	}
	return nil
}

// twHandoff is the handoff an output follows.
type twHandoff struct {
	effectInfo
	index int
}

// effects executes an output's effects in order, like runner.effects.
func (w *tw) effects(f twFrame, dispatchID string, out *stepOut, halt error) ([]delegationRef, *twHandoff, error) {
	var (
		results []delegationRef
		handoff *twHandoff
	)
	for i, eff := range out.Effects {
		switch eff.Kind {
		case "delegate":
			d, err := w.delegate(f, dispatchID, out.step, i, eff, halt)
			if err != nil {
				return nil, nil, err
			}
			results = append(results, d)
		case "handoff":
			var detail string
			switch {
			case handoff != nil:
				detail = fmt.Sprintf("not followed: this output already handed off to %q; only the first handoff counts", handoff.Agent)
			case halt != nil:
				detail = "not followed: the workflow budget is spent"
			default:
				if _, err := w.lookup(eff.Agent); err != nil {
					detail = "not followed: " + err.Error()
				}
			}
			ok := detail == ""
			if ok {
				handoff = &twHandoff{effectInfo: eff, index: i}
				detail = fmt.Sprintf("handed off to %q", eff.Agent)
			}
			w.record(f, dispatchID, eff, ok, detail)
		default:
			var o effectOutcome
			ao := workflow.ActivityOptions{
				StartToCloseTimeout: time.Minute,
				// A worker that dies mid-effect is noticed this soon; the
				// retry carries the same idempotency key.
				HeartbeatTimeout: w.t.opts.HeartbeatTimeout,
				// State outages are waited out, as the bbolt engine does.
				RetryPolicy: &temporal.RetryPolicy{InitialInterval: 100 * time.Millisecond, BackoffCoefficient: 2, MaximumInterval: 10 * time.Second},
			}
			args := effectArgs{WorkflowID: w.id, Agent: f.agent, Step: out.step, Index: i, Key: eff.Key}
			if err := workflow.ExecuteActivity(workflow.WithActivityOptions(w.ctx, ao), twEffActivity, args).Get(w.ctx, &o); err != nil {
				return nil, nil, err
			}
			w.res.Outcomes[eff.Key] = o
		}
	}
	return results, handoff, nil
}

// record keeps the outcome of an effect the workflow itself decided.
func (w *tw) record(f twFrame, dispatchID string, eff effectInfo, applied bool, detail string) {
	w.res.Outcomes[eff.Key] = effectOutcome{Key: eff.Key, Applied: applied, Detail: detail}
	t := "orchestrator.effect.applied"
	if !applied {
		t = "orchestrator.effect.not_applied"
	}
	w.event(f.agent, t, map[string]any{"dispatch_id": dispatchID, "effect": eff.Kind, "idempotency_key": eff.Key, "detail": detail})
}

// delegate runs a Delegate effect's child agent, like runner.delegate.
func (w *tw) delegate(f twFrame, dispatchID string, step uint64, i int, eff effectInfo, halt error) (delegationRef, error) {
	res := delegationRef{Agent: eff.Agent, Key: eff.Key}
	notRun := func(detail string) (delegationRef, error) {
		res.Detail = detail
		w.record(f, dispatchID, eff, false, detail)
		return res, nil
	}
	if halt != nil {
		return notRun("not run: the workflow budget is spent")
	}
	info, err := w.lookup(eff.Agent)
	if err != nil {
		return notRun(err.Error())
	}
	chain := append(append([]string(nil), f.chain...), eff.Agent)
	if slices.Contains(f.chain, eff.Agent) {
		return res, guardError("delegation cycle: %s", strings.Join(chain, " -> "))
	}
	if f.depth+1 > w.in.MaxDepth {
		return res, guardError("delegation depth limit of %d reached: %s", w.in.MaxDepth, strings.Join(chain, " -> "))
	}
	child := twFrame{agent: eff.Agent, info: info, depth: f.depth + 1, chain: chain, parent: dispatchID, cause: eff.Key, session: eff.Session}
	out, err := w.agent(child, stepPlan{Kind: "delegate", Step: step, Effect: i}, false)
	var failed *agentError
	switch {
	case errors.As(err, &failed):
		return notRun("failed: " + failed.err.Error())
	case err != nil:
		return res, err
	}
	res.OK = true
	res.Step = w.res.LastStep
	res.Exit = strings.TrimPrefix(out.Exit, "EXIT_KIND_")
	w.record(f, dispatchID, eff, true, fmt.Sprintf("agent %q ran (%s)", eff.Agent, res.Exit))
	return res, nil
}
