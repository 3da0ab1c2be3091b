package temporal

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/shopspring/decimal"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/lifecycle"
	"github.com/secbear/neuron/services/orchestrator"
)

// The Temporal workflow runs the shared workflow (orchestrator.Run) on a
// host whose every answer is recorded in the workflow's history: operator
// calls and effects are activities, registry lookups and budget decisions
// side effects, signals arrive on a Temporal signal channel, and queries
// read the workflow's own view of itself (twResult). A worker that picks
// the workflow up after a crash replays the history, so Run takes the
// path it took before.
//
// Replaying requires the host to issue the same Temporal commands in the
// same order as the build that recorded the history; the recorded
// histories in ../testdata/temporal-histories pin that order: a side
// effect for each agent's first lookup; per step the call activity, a
// memo update, and (with a budget) a side effect for the budget decision;
// an activity per non-dispatching effect; around a suspension a memo
// update before and after waiting; a memo update before the end, except
// for a cancellation.

// retryChange is the change after which the workflow retries operator
// failures per the agent's policy itself (and runs a call again whose
// attempts timed out), rather than Temporal within the activity. Histories
// recorded before it have no marker of it and replay with
// workflow.DefaultVersion, where such a failure reaching the workflow was
// final, as it was then.
const retryChange = "neuron.call-retries"

// maxEventsPage bounds the events one neuron.events query returns.
const maxEventsPage = 512

// The call activity's Temporal retry policy: the retries of attempts
// whose worker died and of State failures, without limit (bounded by the
// Dispatch caller's deadline when there is one).
const (
	callRetryInitial = 100 * time.Millisecond
	callRetryMax     = 10 * time.Second
)

// workflow is the Temporal workflow function.
func (e *Engine) workflow(ctx workflow.Context, in twInput) (*twResult, error) {
	h := &host{e: e, ctx: ctx, id: workflow.GetInfo(ctx).WorkflowExecution.ID, in: in,
		agents: map[string]agentInfo{}, sigKey: map[string]uint64{}}
	h.res = twResult{Status: statusName(orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING), RootAgent: in.RootAgent,
		CurrentAgent: in.RootAgent, Spent: "0", Budget: in.Budget, MaxSteps: in.MaxSteps, Outcomes: map[string]effectOutcome{}}
	spec := &orchestrator.Spec{ID: h.id, RootAgent: in.RootAgent, Detached: in.Detached, Input: in.Input, Trace: in.Trace,
		MaxDepth: in.MaxDepth, MaxSteps: in.MaxSteps, WarnFraction: decimal.RequireFromString(orchestrator.DefaultWarnFraction),
		AskLimits: in.AskLimits}
	if in.Budget != "" {
		b, err := decimal.NewFromString(in.Budget)
		if err != nil {
			f := orchestrator.FailureOf(fmt.Errorf("budget %q: %v: %w", in.Budget, err, errs.InvalidArgument))
			h.End(orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED, f,
				lifecycle.Observable(lifecyclev1.EventSource_EVENT_SOURCE_ORCHESTRATOR, "orchestrator.workflow.failed", h.id, in.RootAgent,
					map[string]any{"code": f.Code, "message": f.Message, "reason": f.Reason}))
			h.span(orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED)
			return nil, failed(f)
		}
		spec.Budget = decimal.NewNullDecimal(b)
	}
	if f, err := decimal.NewFromString(in.WarnFraction); err == nil {
		spec.WarnFraction = f
	}
	if err := workflow.SetQueryHandler(ctx, twQueryResult, func() (*twResult, error) { return &h.res, nil }); err != nil {
		return nil, err
	}
	if err := workflow.SetQueryHandler(ctx, twQuerySigKey, func(key string) (uint64, error) { return h.sigKey[key], nil }); err != nil {
		return nil, err
	}
	if err := workflow.SetQueryHandler(ctx, twQueryEvents, h.eventsAfter); err != nil {
		return nil, err
	}
	h.sigs = workflow.GetSignalChannel(ctx, twSignal)
	h.cancels = workflow.GetSignalChannel(ctx, twCancelSignal)
	// Signals are taken from the channels' buffers, never by a blocked
	// Receive: a blocked Receive takes a signal the moment it is
	// delivered, before its goroutine runs, where the workflow's own
	// code could not see it.
	workflow.Go(ctx, func(c workflow.Context) {
		for {
			if err := workflow.Await(c, func() bool { return h.sigs.Len() > 0 || h.cancels.Len() > 0 }); err != nil {
				return
			}
			h.drain()
		}
	})

	exit := orchestrator.Run(h, spec)
	h.span(exit.Status)
	switch exit.Status {
	case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED:
		return &h.res, nil
	case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED:
		if h.stop != nil {
			return nil, temporal.NewCanceledError(h.stop.Reason)
		}
	}
	f := exit.Failure
	if f == nil {
		// Run ends a workflow Temporal runs COMPLETED, FAILED or CANCELED
		// only: the host neither parks nor pauses it.
		f = &orchestrator.Failure{Code: int32(errs.Code(errs.Internal)), Message: "the workflow stopped " + statusName(exit.Status)}
	}
	return nil, failed(f)
}

// failed is the error a workflow that failed with f ends with.
func failed(f *orchestrator.Failure) error {
	p := failureOf(f)
	return temporal.NewNonRetryableApplicationError(p.Message, errTypeWorkflow, nil, p)
}

// host is the Temporal orchestrator.Host of one workflow execution.
type host struct {
	e      *Engine
	ctx    workflow.Context
	id     string
	in     twInput
	spent  decimal.Decimal
	res    twResult
	agents map[string]agentInfo // lookups, failed ones too
	sigKey map[string]uint64
	reason string // a CancelWorkflow's reason
	// raised: UpdateWorkflowLimits changed the budget (the memo shows it).
	raised bool
	// stop is set once the workflow was stopped through Temporal.
	stop *orchestrator.Stop
	// events is the workflow's event log (see record).
	events []*lifecyclev1.LifecycleEvent
	// cancels carries the reason a CancelWorkflow sends before it
	// cancels; it may not have been read when the cancellation lands.
	cancels workflow.ReceiveChannel
	sigs    workflow.ReceiveChannel
}

var _ orchestrator.Host = (*host)(nil)

// Now implements orchestrator.Host.
func (h *host) Now() time.Time { return workflow.Now(h.ctx) }

// Publish implements orchestrator.Host: the event joins the workflow's
// event log and goes out, once: not again while the history is replayed.
func (h *host) Publish(ev *lifecyclev1.LifecycleEvent) {
	ev = h.record(ev)
	if h.e.deps.Bus != nil && !workflow.IsReplaying(h.ctx) {
		h.e.deps.Bus.Publish(ev)
	}
}

// record appends an event to the workflow's event log, timed by the
// workflow's clock. The log is no history payload: the workflow rebuilds
// it as it replays (it publishes the same events in the same order every
// time), and the query neuron.events reads it. The event returned is the
// one to send: as on the journal engine's live stream, it has no
// position.
func (h *host) record(ev *lifecyclev1.LifecycleEvent) *lifecyclev1.LifecycleEvent {
	ev = proto.Clone(ev).(*lifecyclev1.LifecycleEvent)
	if ev.Time == nil {
		ev.Time = timestamppb.New(workflow.Now(h.ctx))
	}
	logged := proto.Clone(ev).(*lifecyclev1.LifecycleEvent)
	logged.WorkflowSequence = uint64(len(h.events)) + 1
	h.events = append(h.events, logged)
	return ev
}

// eventsAfter answers the query neuron.events: up to maxEventsPage events
// of the log after position after, binary.
func (h *host) eventsAfter(after uint64) ([][]byte, error) {
	var out [][]byte
	for i := after; i < uint64(len(h.events)) && len(out) < maxEventsPage; i++ {
		b, err := proto.Marshal(h.events[i])
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// drain takes every signal and cancellation reason delivered so far.
func (h *host) drain() {
	for {
		var s twSignalIn
		if !h.sigs.ReceiveAsync(&s) {
			break
		}
		h.addSignal(s)
	}
	for {
		var r string
		if !h.cancels.ReceiveAsync(&r) {
			break
		}
		if h.reason == "" {
			h.reason = r
		}
	}
}

// addSignal queues a signal unless its key was seen.
func (h *host) addSignal(s twSignalIn) {
	if _, dup := h.sigKey[s.Key]; dup && s.Key != "" {
		return
	}
	seq := uint64(len(h.res.Signals)) + 1
	if s.Key != "" {
		h.sigKey[s.Key] = seq
	}
	h.res.Signals = append(h.res.Signals, &signalRecord{Seq: seq, Payload: s.Payload, Key: s.Key, Accepted: workflow.Now(h.ctx)})
	h.res.Pending++
	// Engine.Signal sends the event, from the process the signal reached;
	// the log has it where the workflow took the signal.
	h.record(lifecycle.Observable(lifecyclev1.EventSource_EVENT_SOURCE_ORCHESTRATOR, "orchestrator.signal.accepted", h.id, "",
		map[string]any{"sequence": seq, "signal_type": orchestrator.SignalType(s.Payload)}))
}

// pending takes the signals not yet delivered, marking them delivered by
// step n.
func (h *host) pending(n uint64) []signalRecord {
	h.drain()
	var out []signalRecord
	for _, s := range h.res.Signals {
		if s.Step == 0 {
			s.Step = n
			out = append(out, signalRecord{Seq: s.Seq, Payload: s.Payload})
		}
	}
	h.res.Pending = 0
	return out
}

// memo publishes the workflow's summary for List and Get.
func (h *host) memo() {
	m := map[string]any{memoStatus: h.res.Status, memoAgent: h.res.CurrentAgent, memoSteps: h.res.Steps, memoSpent: h.res.Spent}
	if f := h.res.Failure; f != nil && h.res.Status == statusName(orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED) {
		m[memoFailCode], m[memoFailMessage] = f.Code, f.Message
		if f.Reason != "" {
			m[memoFailReason] = f.Reason
		}
	}
	if h.raised {
		m[memoBudget] = h.res.Budget
	}
	if err := workflow.UpsertMemo(h.ctx, m); err != nil {
		workflow.GetLogger(h.ctx).Warn("updating the workflow memo", "error", err)
	}
}

// Lookup implements orchestrator.Host: the registry is asked once per
// agent and workflow, in a side effect, so a replay on a worker with a
// different registry follows the recorded path. A failed lookup is
// remembered too: asking again would record another side effect.
func (h *host) Lookup(id string) (orchestrator.AgentInfo, error) {
	info, ok := h.agents[id]
	if !ok {
		err := workflow.SideEffect(h.ctx, func(workflow.Context) any {
			var rev uint64
			if id == h.in.RootAgent {
				rev = h.in.RootRevision
			}
			a, err := h.e.deps.Registry.LookupRevision(id, rev)
			if err != nil {
				return agentInfo{Err: err.Error(), Code: int32(errs.Code(err))}
			}
			return infoOf(a)
		}).Get(&info)
		if err != nil {
			return orchestrator.AgentInfo{}, err
		}
		h.agents[id] = info
	}
	if info.Err != "" {
		return orchestrator.AgentInfo{}, (&orchestrator.Failure{Code: info.Code, Message: info.Err}).Err()
	}
	return info.port(), nil
}

// Call implements orchestrator.Host: the call activity, with the
// signals pending delivered with it.
func (h *host) Call(c *orchestrator.StepCall) (*orchestrator.StepResult, error) {
	args := callArgs{WorkflowID: h.id, N: c.N, Agent: c.Agent, Plan: planOf(c.Plan), Model: c.Model, Downgraded: c.Downgraded,
		Parent: c.Parent, Cause: c.Cause, Corr: c.Corr, Depth: c.Depth, Trace: c.Trace, Signals: h.pending(c.N), Revision: c.Info.Revision}
	sigs := make([]orchestrator.Signal, len(args.Signals))
	for i, s := range args.Signals {
		sigs[i] = orchestrator.Signal{Seq: s.Seq, Payload: s.Payload}
	}
	lim, err := orchestrator.ApplyLimits(c, sigs)
	if err != nil {
		return nil, err
	}
	if lim != nil && !lim.Rejected {
		if c.Budget.Valid {
			h.res.Budget, h.raised = c.Budget.Decimal.String(), true
		}
		h.res.MaxSteps = c.MaxSteps
	}
	if c.Remaining.Valid {
		args.Remaining = c.Remaining.Decimal.String()
	}
	st := &twStep{N: c.N, Dispatch: c.Dispatch, Agent: c.Agent, Depth: c.Depth, Trigger: triggerOf(args.Plan, args.Signals),
		Started: workflow.Now(h.ctx), State: "running"}
	for _, s := range args.Signals {
		st.Signals = append(st.Signals, s.Seq)
	}
	h.res.StepList = append(h.res.StepList, st)

	res, err := h.call(c, st, args)
	if err != nil {
		return nil, err
	}
	cost, _ := decimal.NewFromString(res.Cost)
	h.spent = h.spent.Add(cost)
	st.State, st.Exit, st.Cost = "done", res.Exit, cost.String()
	for _, e := range res.Effects {
		st.Effects = append(st.Effects, e.Key)
	}
	h.res.Steps++
	h.res.Spent = h.spent.String()
	h.res.LastStep = c.N
	h.res.CurrentAgent = c.Agent
	h.memo()
	out := res.port(st.Signals)
	out.Limits = lim
	return out, nil
}

// call runs the call activity until it returns an output or fails for
// good. Temporal retries an attempt whose worker died (its heartbeat or
// start-to-close timeout) and State failures, without limit; the
// workflow retries operator failures the agent's policy may fix, up to
// its attempts, so that only those count. Each attempt is bounded by the
// Dispatch caller's deadline.
func (h *host) call(c *orchestrator.StepCall, st *twStep, args callArgs) (*callResult, error) {
	policy := c.Info.Retry.WithDefaults()
	ao := workflow.ActivityOptions{
		// The activity bounds the operator call by the call timeout and
		// gets a heartbeat timeout more to keep the output: an operator
		// that hangs fails the call rather than time the activity out.
		StartToCloseTimeout: h.e.opts.Engine.CallTimeout + h.e.opts.HeartbeatTimeout,
		HeartbeatTimeout:    h.e.opts.HeartbeatTimeout,
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: callRetryInitial, BackoffCoefficient: 2, MaximumInterval: callRetryMax,
			NonRetryableErrorTypes: []string{errTypeOperator, errTypeRetryable}},
	}
	deaths := 0
	for attempt := 1; ; {
		if !h.in.Deadline.IsZero() {
			left := h.in.Deadline.Sub(workflow.Now(h.ctx))
			if left <= 0 {
				return nil, h.deadlineErr(st)
			}
			ao.ScheduleToCloseTimeout = left
		}
		var res callResult
		err := workflow.ExecuteActivity(workflow.WithActivityOptions(h.ctx, ao), twCallActivity, args).Get(h.ctx, &res)
		if err == nil {
			return &res, nil
		}
		if h.ctx.Err() != nil {
			return nil, h.ctx.Err()
		}
		fl := activityFailure(err)
		// Past the caller's deadline, the call ends either by Temporal's
		// schedule-to-close timeout or by the operator call's own
		// DEADLINE_EXCEEDED, whichever the worker sees first.
		var timeout *temporal.TimeoutError
		timedOut := errors.As(err, &timeout)
		if !h.in.Deadline.IsZero() && !workflow.Now(h.ctx).Before(h.in.Deadline) &&
			(timedOut || fl.Code == int32(errs.Code(errs.DeadlineExceeded))) {
			return nil, h.deadlineErr(st)
		}
		var app *temporal.ApplicationError
		retryable := errors.As(err, &app) && app.Type() == errTypeRetryable
		// A timeout reaching the workflow before the deadline is an
		// attempt whose worker died that Temporal did not retry (the SDK's
		// test environment does not): it does not count either.
		died := timedOut && timeout.TimeoutType() != enumspb.TIMEOUT_TYPE_SCHEDULE_TO_CLOSE
		if (retryable || died) && h.retries() {
			if died {
				// Waited like Temporal's own retries, so that a call whose
				// attempts keep dying does not spin.
				if err := workflow.Sleep(h.ctx, min(callRetryInitial<<min(deaths, 16), callRetryMax)); err != nil {
					return nil, err
				}
				deaths++
				continue
			}
			if attempt < policy.MaxAttempts {
				if err := workflow.Sleep(h.ctx, policy.Backoff(attempt, jitter(c.Dispatch, attempt))); err != nil {
					return nil, err
				}
				attempt++
				continue
			}
			if attempt > 1 {
				fl.Message = fmt.Sprintf("after %d attempts: %s", attempt, fl.Message)
			}
		}
		st.State, st.Error = "failed", fl.Message
		return nil, &orchestrator.OperatorError{Failure: fl.port()}
	}
}

// retries says whether the workflow retries operator failures itself
// (see retryChange).
func (h *host) retries() bool {
	return workflow.GetVersion(h.ctx, retryChange, workflow.DefaultVersion, 1) >= 1
}

// jitter is the random number of a retry's backoff: derived from the
// dispatch and attempt, since workflow code must be deterministic.
func jitter(dispatch string, attempt int) func() float64 {
	return func() float64 {
		sum := sha256.Sum256([]byte(dispatch + "/" + strconv.Itoa(attempt)))
		return float64(binary.BigEndian.Uint64(sum[:8])>>11) / (1 << 53)
	}
}

// deadlineErr fails a step on the Dispatch caller's deadline.
func (h *host) deadlineErr(st *twStep) error {
	st.State, st.Error = "failed", "the Dispatch caller's deadline passed"
	return fmt.Errorf("the Dispatch caller's deadline passed during step %d: %w", st.N, errs.DeadlineExceeded)
}

// triggerOf is the trigger a planned step will carry.
func triggerOf(plan stepPlan, sigs []signalRecord) string {
	switch {
	case len(sigs) > 0:
		return operatorv1.TriggerType_TRIGGER_TYPE_SIGNAL.String()
	case plan.Kind == string(orchestrator.PlanInput):
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

// Apply implements orchestrator.Host: the effect activity.
func (h *host) Apply(c *orchestrator.EffectCall) (orchestrator.Outcome, error) {
	ao := workflow.ActivityOptions{
		StartToCloseTimeout: time.Minute,
		// A worker that dies mid-effect is noticed this soon; the retry
		// carries the same idempotency key.
		HeartbeatTimeout: h.e.opts.HeartbeatTimeout,
		// State outages are waited out, as the journal engine does.
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: 100 * time.Millisecond, BackoffCoefficient: 2, MaximumInterval: 10 * time.Second},
	}
	args := effectArgs{WorkflowID: h.id, Agent: c.Agent, Step: c.Step, Index: c.Index, Key: c.Ref.Key}
	var o effectOutcome
	if err := workflow.ExecuteActivity(workflow.WithActivityOptions(h.ctx, ao), twEffActivity, args).Get(h.ctx, &o); err != nil {
		return orchestrator.Outcome{}, err
	}
	out, err := o.port()
	o.Events = nil
	h.res.Outcomes[c.Ref.Key] = o
	return out, err
}

// Record implements orchestrator.Host: the outcome joins the workflow's
// view, which its history rebuilds.
func (h *host) Record(c *orchestrator.EffectCall, o orchestrator.Outcome) error {
	h.res.Outcomes[c.Ref.Key] = effectOutcome{Key: c.Ref.Key, Applied: o.Applied, Detail: o.Detail}
	return nil
}

// Decide implements orchestrator.Host: the policy's decision is a side
// effect, so a replay follows it even if the policy changed.
func (h *host) Decide(s orchestrator.BudgetState) (*lifecyclev1.BudgetDecision, error) {
	policy := h.e.opts.Engine.Policy
	d := &lifecyclev1.BudgetDecision{}
	if err := workflow.SideEffect(h.ctx, func(workflow.Context) any { return policy.Decide(s) }).Get(&d); err != nil {
		return nil, err
	}
	return d, nil
}

// Await implements orchestrator.Host. A suspended workflow waits here,
// in Temporal, for its next signal.
func (h *host) Await(suspended bool, ending *lifecyclev1.LifecycleEvent) (bool, error) {
	return h.await(suspended, "", ending, orchestrator.Wakes)
}

// AwaitRaise implements orchestrator.Host: Await, suspended, that only a
// limits change ends.
func (h *host) AwaitRaise(asking string, ending *lifecyclev1.LifecycleEvent) (bool, error) {
	return h.await(true, asking, ending, orchestrator.Raises)
}

// waking says whether a pending signal wakes the workflow (nil wakes: any
// does).
func (h *host) waking(wakes func([]byte) bool) bool {
	if h.res.Pending == 0 || wakes == nil {
		return h.res.Pending > 0
	}
	for _, s := range h.res.Signals {
		if s.Step == 0 && wakes(s.Payload) {
			return true
		}
	}
	return false
}

// await ends the workflow COMPLETED, or suspends it (waiting for a raise
// of asking, "" for none) until a signal that wakes it arrives, unless
// one is pending.
func (h *host) await(suspended bool, asking string, ending *lifecyclev1.LifecycleEvent, wakes func([]byte) bool) (bool, error) {
	h.drain()
	if h.waking(wakes) {
		return true, nil
	}
	if !suspended {
		h.res.Status = statusName(orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)
		h.memo()
		h.Publish(ending)
		return false, nil
	}
	h.res.Status, h.res.Asking = statusName(orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED), asking
	h.memo()
	h.Publish(ending)
	if err := workflow.Await(h.ctx, func() bool { return h.waking(wakes) }); err != nil {
		return false, err
	}
	h.res.Status, h.res.Asking = statusName(orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING), ""
	h.memo()
	return true, nil
}

// Stopped implements orchestrator.Host: a Temporal cancellation stops
// the workflow, with the reason CancelWorkflow signalled first.
func (h *host) Stopped(err error) *orchestrator.Stop {
	if !errors.Is(h.ctx.Err(), workflow.ErrCanceled) && !temporal.IsCanceledError(err) {
		return nil
	}
	h.drain()
	reason := h.reason
	if reason == "" {
		reason = "cancelled through Temporal"
	}
	h.stop = &orchestrator.Stop{Reason: reason}
	return h.stop
}

// End implements orchestrator.Host. Only a workflow whose cancellation
// was requested can end CANCELED in Temporal; one that failed with a
// CANCELED status otherwise (an operator's) ends FAILED, as it always
// has. A cancellation updates no memo (Temporal's status says it).
func (h *host) End(status orchestratorv1.WorkflowStatus, f *orchestrator.Failure, ending *lifecyclev1.LifecycleEvent) bool {
	if status == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED && h.stop == nil {
		status = orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED
	}
	h.res.Status = statusName(status)
	h.res.Failure = failureOf(f)
	if status == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED {
		h.memo()
	}
	h.Publish(ending)
	return true
}

// span reports the workflow's span (orchestrator.EndWorkflowSpan) as it
// ends with status. A replay of the workflow (a worker that took it
// over, a query of a finished one) ends it again: only the live run
// reports it.
func (h *host) span(status orchestratorv1.WorkflowStatus) {
	if workflow.IsReplaying(h.ctx) {
		return
	}
	if status == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED && h.stop == nil {
		status = orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED // as End records it
	}
	orchestrator.EndWorkflowSpan(h.in.Trace, h.id, h.in.RootAgent, status, workflow.GetInfo(h.ctx).WorkflowStartTime, workflow.Now(h.ctx))
}
