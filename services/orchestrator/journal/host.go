package journal

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/lifecycle"
	"github.com/secbear/neuron/pkg/middleware/dispatch"
	"github.com/secbear/neuron/services/orchestrator"
)

// host is the journal's orchestrator.Host for one run of a workflow. The
// workflow runs from the top every time; the host answers what is
// journaled from the journal (a replay) and does the rest now, journaling
// it before anything outside the process depends on it.
//
// Writes are held back and made together (commit): a step's intent with
// everything before it, just before the operator is called; a step's
// result, the outcomes of its effects and the workflow's end in one
// write at the end. What is held back is committed before the workflow
// next acts outside the process (an operator call, an effect, the
// answer to its caller: sync), so a crash with writes held back is a
// crash just before they were made, which a run after it recovers from
// as it always did: it calls again the step whose result was held back
// (never a step whose effects were applied: those commit it first) and
// applies again, under the same idempotency key, the effect whose
// outcome was held back. A workflow's creation waits for its first
// write too (Engine.Start).
//
// One exception, which makes a one-step Dispatch one commit: a workflow
// that a Dispatch naming no workflow started holds its first write (its
// creation, its first step's intent) back over its first operator call,
// to the next commit (the step's result, or the sync before an effect,
// or the next step's intent). Nothing outside the process depends on it
// durably until the Dispatch answers: the caller cannot name the
// workflow before, and whoever else names it meanwhile commits it
// first (see deferral). A crash during that call loses the workflow,
// which nobody was promised; the caller sees UNAVAILABLE.
type host struct {
	e   *Engine
	id  string
	ctx context.Context // the run's; its cause says why it stopped
	// callCtx bounds operator calls by the Dispatch caller's deadline;
	// effects run under ctx.
	callCtx context.Context
	cancel  context.CancelFunc
	n       uint64 // the last step called
	// wi counts the events the workflow published in this run; the
	// first logged of them are in the log already (the workflow publishes
	// the same events in the same order in every run), the rest go out
	// and are logged, encoded, with the workflow's next write.
	wi, logged uint64
	events     [][]byte
	// lookups recorded, and staged ones, journaled with the workflow's
	// next write: until then nothing depends on them durably.
	lookups, staged map[string]*lookupRecord
	// root and rootRev: the root agent's lookup reads the revision the
	// workflow started with.
	root    string
	rootRev uint64
	// held are writes held back until the next commit.
	held []op
	// outputs of the steps this run called or replayed; live marks those
	// it called, whose effects no earlier run can have recorded.
	outputs map[uint64]*operatorv1.OperatorOutput
	live    map[uint64]bool
	// creating is the record of a workflow that exists in memory only:
	// the first commit creates it and tells created how that went, and
	// the events it published meanwhile (unsent) go out once it exists.
	// notCreated is why that commit failed: the run stops, writing
	// nothing.
	creating *record
	created  func(existing *record, err error)
	// deferred, until the first operator call, holds the creation back
	// over that call (see deferral).
	deferred   *deferral
	unsent     []*lifecyclev1.LifecycleEvent
	notCreated error
	// broken is an event that could not be encoded: the next commit
	// fails with it.
	broken error
	// stalled is the journal write that failed because the disk is full:
	// the run pauses (the workflow stays RUNNING) and the engine runs it
	// again once the journal can be written.
	stalled error
}

func newHost(e *Engine, ctx context.Context, rec *record, logged uint64, lookups map[string]*lookupRecord) *host {
	h := &host{e: e, id: rec.ID, ctx: ctx, callCtx: ctx, cancel: func() {}, logged: logged,
		root: rec.RootAgent, rootRev: rec.RootRevision,
		lookups: lookups, staged: map[string]*lookupRecord{}, outputs: map[uint64]*operatorv1.OperatorOutput{}, live: map[uint64]bool{}}
	if !rec.Deadline.IsZero() {
		h.callCtx, h.cancel = context.WithDeadline(ctx, rec.Deadline)
	}
	return h
}

func (h *host) close() { h.cancel() }

// errNotCreated: the write that was to create the workflow failed, so
// the run stops without writing anything.
var errNotCreated = errors.New("the workflow was not created")

// commit makes the writes held back, the staged lookups and events, and
// ops durable in one write of the journal (creating the workflow with
// it, when its creation waits for its first write).
func (h *host) commit(ops ...op) error {
	if h.notCreated != nil {
		return h.notCreated
	}
	if h.broken != nil {
		return h.broken
	}
	all := make([]op, 0, len(h.held)+1+len(ops))
	all = append(append(append(all, h.held...), h.flush), ops...)
	err := h.e.j.write(h.id, h.creating, all...)
	if h.creating != nil {
		var ex *existsError
		switch {
		case errors.As(err, &ex):
			h.created(ex.existing, nil)
		default:
			h.created(nil, err)
		}
		if err != nil {
			h.notCreated = fmt.Errorf("%w: %w", errNotCreated, err)
			h.unsent = nil
			return h.notCreated
		}
		h.creating = nil
		for _, ev := range h.unsent {
			h.e.give(ev)
		}
		h.unsent = nil
	}
	if err != nil {
		return err
	}
	h.held = h.held[:0]
	h.clear()
	return nil
}

// hold keeps o for the next commit.
func (h *host) hold(o op) { h.held = append(h.held, o) }

// holdStep holds o, a step's result, back: in place of the step's
// intent held at h.held[intent] (its record written once), or after
// what is held (intent < 0).
func (h *host) holdStep(intent int, o op) {
	if intent < 0 {
		h.hold(o)
		return
	}
	h.held[intent] = o
}

// sync commits what is held back, before the workflow acts outside the
// process.
func (h *host) sync() error {
	if len(h.held) == 0 {
		return nil
	}
	return h.commit()
}

// flush writes the staged lookups and events; clear forgets them once
// written.
func (h *host) flush(w *wtx) error {
	for agent, l := range h.staged {
		if err := put(w.b, prefixed(prefixLookup, []byte(agent)), l); err != nil {
			return err
		}
	}
	if len(h.events) == 0 {
		return nil
	}
	if _, err := w.log(h.events...); err != nil {
		return err
	}
	w.own(h.wi)
	return nil
}

func (h *host) clear() {
	h.e.progress(h.id) // a write went through: nothing to wait for
	for agent, l := range h.staged {
		h.lookups[agent] = l
	}
	clear(h.staged)
	clear(h.events)
	h.events = h.events[:0]
}

// next counts the workflow's next event and says whether it is new:
// not in the log yet.
func (h *host) next() bool {
	h.wi++
	return h.wi > h.logged
}

// stage sends a new event and keeps it, encoded, for the next write.
func (h *host) stage(ev *lifecyclev1.LifecycleEvent) {
	raw, err := h.encode(ev)
	if err != nil {
		return
	}
	h.events = append(h.events, raw)
	h.send(ev)
}

// encode is ev, given its time when it has none, in its binary form; an
// error breaks the next commit.
func (h *host) encode(ev *lifecyclev1.LifecycleEvent) ([]byte, error) {
	if ev.Time == nil {
		ev.Time = timestamppb.Now()
	}
	raw, err := lifecycle.Marshal(ev)
	if err != nil && h.broken == nil {
		h.broken = fmt.Errorf("encode event %s: %w", ev.GetObservable().GetEventType(), err)
	}
	return raw, err
}

// send gives ev to the lifecycle bus, or keeps it until the workflow
// exists.
func (h *host) send(ev *lifecyclev1.LifecycleEvent) {
	if h.creating != nil {
		h.unsent = append(h.unsent, ev)
		return
	}
	h.e.give(ev)
}

// withEnding records the ending event (encoded: raw), when new, after
// what flush wrote, and its position in *pos.
func (h *host) withEnding(raw []byte, isNew bool, pos *uint64) op {
	return func(w *wtx) error {
		if !isNew {
			return nil
		}
		p, err := w.log(raw)
		if err != nil {
			return err
		}
		*pos = p
		w.own(h.wi)
		return nil
	}
}

// Now implements orchestrator.Host.
func (h *host) Now() time.Time { return time.Now() }

// Publish implements orchestrator.Host.
func (h *host) Publish(ev *lifecyclev1.LifecycleEvent) {
	if h.next() {
		h.stage(ev)
	}
}

// Lookup implements orchestrator.Host.
func (h *host) Lookup(agentID string) (orchestrator.AgentInfo, error) {
	l := h.lookups[agentID]
	if l == nil {
		l = h.staged[agentID]
	}
	if l == nil {
		l = &lookupRecord{}
		var rev uint64
		if agentID == h.root {
			rev = h.rootRev
		}
		a, err := h.e.deps.Registry.LookupRevision(agentID, rev)
		if err != nil {
			l.Err, l.Code = err.Error(), int32(errs.Code(err))
		} else {
			r := a.Retry.WithDefaults()
			l.Model, l.DowngradeModel, l.Attempts, l.Initial, l.MaxBackoff = a.Defaults.Model, a.Defaults.DowngradeModel, r.MaxAttempts, r.InitialBackoff, r.MaxBackoff
			l.Revision, l.Restricted, l.AllowedAgents = a.Revision, a.Restricted, a.AllowedAgents
		}
		h.staged[agentID] = l
	}
	if l.Err != "" {
		return orchestrator.AgentInfo{}, (&orchestrator.Failure{Code: l.Code, Message: l.Err}).Err()
	}
	return orchestrator.AgentInfo{Model: l.Model, DowngradeModel: l.DowngradeModel,
		Retry:    orchestrator.RetryPolicy{MaxAttempts: l.Attempts, InitialBackoff: l.Initial, MaxBackoff: l.MaxBackoff},
		Revision: l.Revision, Restricted: l.Restricted, AllowedAgents: l.AllowedAgents}, nil
}

// Call implements orchestrator.Host: it journals the step's intent (the
// exact input, with the pending signals folded in) with everything held
// back, calls the operator, and holds back the output or the failure for
// the next commit.
func (h *host) Call(c *orchestrator.StepCall) (*orchestrator.StepResult, error) {
	h.n = c.N
	var (
		agent  *orchestrator.Agent
		built  *operatorv1.OperatorInput
		st     *stepRecord
		replay bool
		lim    *orchestrator.Limits
		err    error
	)
	d := h.deferred
	h.deferred = nil
	intent := -1 // where the held intent is in h.held
	if d != nil && h.creating != nil {
		// The workflow's creation and this intent are held back over the
		// call (see deferral).
		if agent, built, st, err = h.intent(c); err != nil {
			return nil, err
		}
		h.hold(putStep(c.N, st.marshal()))
		intent = len(h.held) - 1
	} else {
		d = nil
		err = h.commit(beginStep(c.N, func(w *wtx, pending []*signalRecord) (*stepRecord, error) {
			a, err := h.e.deps.Registry.LookupRevision(c.Agent, c.Info.Revision)
			if err != nil {
				return nil, err
			}
			agent = a
			sigs := make([]orchestrator.Signal, len(pending))
			for i, s := range pending {
				sigs[i] = orchestrator.Signal{Seq: s.Seq, Payload: s.Payload}
			}
			if lim, err = orchestrator.ApplyLimits(c, sigs); err != nil {
				return nil, err // over a limit still: nothing is journaled, the workflow fails
			}
			in, seqs, err := orchestrator.BuildInput(a, c, h.id, sigs, func(n uint64) (*operatorv1.OperatorOutput, error) {
				if out := h.outputs[n]; out != nil {
					return out, nil
				}
				st, err := stepOutput(w.b, n)
				if err != nil {
					return nil, err
				}
				return decodeOutput(st, n)
			})
			if err != nil {
				return nil, err
			}
			raw, err := proto.Marshal(in)
			if err != nil {
				return nil, err
			}
			built = in
			return &stepRecord{Agent: c.Agent, Input: raw, Signals: seqs, Started: time.Now()}, nil
		}, &st, &replay))
	}
	if err != nil {
		return nil, err
	}
	if st.Agent != c.Agent {
		return nil, fmt.Errorf("journal mismatch at step %d: recorded agent %q, replay reached %q: %w", c.N, st.Agent, c.Agent, errs.Internal)
	}
	if replay && len(st.Signals) > 0 {
		if lim, err = h.limits(c, st.Signals); err != nil {
			return nil, err
		}
	}
	switch {
	case st.Error != nil:
		return nil, &orchestrator.OperatorError{Failure: &orchestrator.Failure{Code: st.Error.Code, Message: st.Error.Message, Reason: st.Error.Reason}}
	case st.Output != nil:
		out, err := decodeOutput(st, c.N)
		if err != nil {
			return nil, err
		}
		h.outputs[c.N] = out
		res := orchestrator.ResultOf(c.Dispatch, out)
		res.Signals, res.Limits = st.Signals, lim
		return res, nil
	}
	// Not called yet, or in flight when the orchestrator stopped: call
	// (again) with the journaled input.
	if agent == nil {
		if agent, err = h.e.deps.Registry.LookupRevision(c.Agent, c.Info.Revision); err != nil {
			return nil, err
		}
	}
	in := built
	if replay || in == nil {
		in = &operatorv1.OperatorInput{}
		if err := proto.Unmarshal(st.Input, in); err != nil {
			return nil, fmt.Errorf("journaled input of step %d is corrupt: %v: %w", c.N, err, errs.Internal)
		}
	}
	started := time.Now()
	if d != nil {
		d.hold(h)
	}
	out, err := h.call(c, agent, in)
	if d != nil && !d.take() { // from here on this run's state is its own again
		intent = -1 // revealed: the intent is journaled
	}
	if err != nil {
		if h.ctx.Err() != nil {
			return nil, context.Cause(h.ctx) // stopped, not failed: a resume calls again
		}
		// The operator may see the deadline pass a moment before this
		// process does.
		deadline := h.callCtx.Err() != nil || errs.Code(err) == errs.Code(errs.DeadlineExceeded) && orchestrator.DeadlineNear(h.callCtx)
		f := orchestrator.FailureOf(err)
		if deadline {
			f = &orchestrator.Failure{Code: int32(errs.Code(errs.DeadlineExceeded)), Message: "the Dispatch caller's deadline passed"}
		}
		st.Error = &failure{Code: f.Code, Message: f.Message, Reason: f.Reason}
		h.holdStep(intent, finishStep(c.N, st, nil))
		if deadline {
			return nil, fmt.Errorf("the Dispatch caller's deadline passed during step %d: %w", c.N, errs.DeadlineExceeded)
		}
		return nil, &orchestrator.OperatorError{Failure: f}
	}
	if st.Output, err = proto.Marshal(out); err != nil {
		return nil, err
	}
	res := orchestrator.ResultOf(c.Dispatch, out)
	h.holdStep(intent, finishStep(c.N, st, func(r *record) {
		r.Steps++
		r.Spent = r.Spent.Add(res.Cost)
		r.LastOutput = st.Output
		r.CurrentAgent = c.Agent
		if lim != nil {
			r.Limit, r.LimitSteps = c.Budget, c.MaxSteps
		}
	}))
	h.outputs[c.N], h.live[c.N] = out, true
	res.Signals, res.Limits = st.Signals, lim
	res.Duration = time.Since(started)
	return res, nil
}

// limits applies to c the limits changes among the signals step c.N
// was journaled with (ApplyLimits again, as the step's first run did).
func (h *host) limits(c *orchestrator.StepCall, seqs []uint64) (*orchestrator.Limits, error) {
	all, err := h.e.j.Signals(h.id)
	if err != nil {
		return nil, err
	}
	var sigs []orchestrator.Signal
	for _, s := range all {
		if slices.Contains(seqs, s.Seq) {
			sigs = append(sigs, orchestrator.Signal{Seq: s.Seq, Payload: s.Payload})
		}
	}
	return orchestrator.ApplyLimits(c, sigs)
}

// intent is the first step of a workflow that exists in memory only,
// built as beginStep would plan it: it has no signals, and no earlier
// steps to read outputs from.
func (h *host) intent(c *orchestrator.StepCall) (*orchestrator.Agent, *operatorv1.OperatorInput, *stepRecord, error) {
	a, err := h.e.deps.Registry.LookupRevision(c.Agent, c.Info.Revision)
	if err != nil {
		return nil, nil, nil, err
	}
	in, seqs, err := orchestrator.BuildInput(a, c, h.id, nil, func(n uint64) (*operatorv1.OperatorOutput, error) {
		if out := h.outputs[n]; out != nil {
			return out, nil
		}
		return nil, fmt.Errorf("step %d of a new workflow refers to step %d, which it has not run: %w", c.N, n, errs.Internal)
	})
	if err != nil {
		return nil, nil, nil, err
	}
	raw, err := proto.Marshal(in)
	if err != nil {
		return nil, nil, nil, err
	}
	return a, in, &stepRecord{Agent: c.Agent, Input: raw, Signals: seqs, Started: time.Now()}, nil
}

func decodeOutput(st *stepRecord, n uint64) (*operatorv1.OperatorOutput, error) {
	if st == nil || st.Output == nil {
		return nil, fmt.Errorf("step %d has no journaled output: %w", n, errs.Internal)
	}
	out := &operatorv1.OperatorOutput{}
	if err := proto.Unmarshal(st.Output, out); err != nil {
		return nil, fmt.Errorf("journaled output of step %d is corrupt: %v: %w", n, err, errs.Internal)
	}
	return out, nil
}

// call runs the operator, retrying operator failures per the agent's
// policy. Each attempt is bounded by the call timeout and the Dispatch
// caller's deadline.
func (h *host) call(c *orchestrator.StepCall, agent *orchestrator.Agent, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
	policy := c.Info.Retry.WithDefaults()
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(dispatch.WithBudget(h.callCtx, c.Remaining), h.e.opts.CallTimeout)
		out, err := h.e.deps.Caller.Call(actx, agent, in)
		cancel()
		if err == nil {
			return out, nil
		}
		if h.ctx.Err() != nil {
			return nil, context.Cause(h.ctx)
		}
		if h.callCtx.Err() != nil {
			return nil, fmt.Errorf("%v: %w", h.callCtx.Err(), errs.DeadlineExceeded)
		}
		if !orchestrator.Retryable(err) || attempt >= policy.MaxAttempts {
			if attempt > 1 {
				err = fmt.Errorf("after %d attempts: %w", attempt, err)
			}
			return nil, err
		}
		d := policy.Backoff(attempt, rand.Float64)
		h.e.log.Warn("operator call failed; retrying", "workflow_id", h.id, "agent", c.Agent,
			"attempt", attempt, "backoff", d.String(), "err", err)
		if err := h.e.sleep(h.callCtx, d); err != nil {
			return nil, err
		}
	}
}

// Apply implements orchestrator.Host. What is held back (the step's
// output, the outcomes of the effects before this one) is committed
// before the effect acts outside the process (any effect but a log);
// its own outcome is held back. Transient
// State failures are retried with capped backoff for as long as the
// workflow runs: an effect is never dropped because the State service
// was briefly away.
func (h *host) Apply(c *orchestrator.EffectCall) (orchestrator.Outcome, error) {
	if o, ok, err := h.recorded(c); err != nil || ok {
		return o, err
	}
	out := h.outputs[c.Step]
	if out == nil {
		return orchestrator.Outcome{}, fmt.Errorf("effect %d of step %d: the step's output is not known to this run: %w", c.Index, c.Step, errs.Internal)
	}
	if c.Index >= len(out.GetEffects()) {
		return orchestrator.Outcome{}, fmt.Errorf("step %d has no effect %d: %w", c.Step, c.Index, errs.Internal)
	}
	eff := out.GetEffects()[c.Index]
	if eff.GetLog() == nil { // a log effect only adds to the event log
		if err := h.sync(); err != nil {
			return orchestrator.Outcome{}, err
		}
	}
	var events []*lifecyclev1.LifecycleEvent
	env := orchestrator.EffectEnv{State: h.e.deps.State, Handlers: h.e.opts.Handlers,
		Publish: func(ev *lifecyclev1.LifecycleEvent) { events = append(events, ev) },
		Signal: func(ctx context.Context, id string, payload []byte, key string) (uint64, bool, error) {
			return h.e.Signal(ctx, id, payload, key)
		}}
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		events = events[:0]
		applied, detail, err := orchestrator.ApplyEffect(h.ctx, env, h.id, c.Agent, c.Ref.Key, eff)
		if h.ctx.Err() != nil {
			return orchestrator.Outcome{}, context.Cause(h.ctx)
		}
		if err == nil {
			o := orchestrator.Outcome{Applied: applied, Detail: detail, Events: events}
			if !applied {
				h.e.log.Warn("effect not applied", "workflow_id", h.id, "agent", c.Agent, "effect", c.Ref.Kind, "key", c.Ref.Key, "detail", detail)
			}
			return o, h.record(c, o)
		}
		if !orchestrator.Transient(err) {
			return orchestrator.Outcome{}, err
		}
		h.e.log.Warn("the State service did not take the effect; retrying", "workflow_id", h.id, "effect", c.Ref.Kind, "attempt", attempt, "err", err)
		h.e.waiting(h.id, fmt.Sprintf("effect %s (%s) of step %d: %v", c.Ref.Key, c.Ref.Kind, c.Step, err))
		if err := h.e.sleep(h.ctx, backoff); err != nil {
			return orchestrator.Outcome{}, err
		}
		backoff = min(backoff*2, 10*time.Second)
	}
}

// recorded returns an effect's journaled outcome.
func (h *host) recorded(c *orchestrator.EffectCall) (orchestrator.Outcome, bool, error) {
	if h.live[c.Step] {
		return orchestrator.Outcome{}, false, nil
	}
	prev, err := h.e.j.Effect(h.id, c.Ref.Key)
	if err != nil || prev == nil {
		return orchestrator.Outcome{}, false, err
	}
	o := orchestrator.Outcome{Applied: prev.Applied, Detail: prev.Detail}
	for _, raw := range prev.Events {
		ev := &lifecyclev1.LifecycleEvent{}
		if err := proto.Unmarshal(raw, ev); err != nil {
			return o, false, fmt.Errorf("journaled event of effect %q is corrupt: %v: %w", c.Ref.Key, err, errs.Internal)
		}
		o.Events = append(o.Events, ev)
	}
	return o, true, nil
}

// Record implements orchestrator.Host.
func (h *host) Record(c *orchestrator.EffectCall, o orchestrator.Outcome) error {
	if _, ok, err := h.recorded(c); err != nil || ok {
		return err
	}
	return h.record(c, o)
}

// record holds back an effect's outcome for the next commit. Its events
// are encoded now: the workflow publishes them next.
func (h *host) record(c *orchestrator.EffectCall, o orchestrator.Outcome) error {
	rec := &effectRecord{Applied: o.Applied, Detail: o.Detail, Step: c.Step, Time: time.Now()}
	for _, ev := range o.Events {
		raw, err := lifecycle.Marshal(ev)
		if err != nil {
			return err
		}
		rec.Events = append(rec.Events, raw)
	}
	h.hold(recordEffect(c.Ref.Key, rec))
	return nil
}

// Decide implements orchestrator.Host: the policy is a pure function of
// its input, so a replay decides the same again.
func (h *host) Decide(s orchestrator.BudgetState) (*lifecyclev1.BudgetDecision, error) {
	return h.e.opts.Policy.Decide(s), nil
}

// errEnded says the workflow ended while it ran (a Cancel).
var errEnded = errors.New("the workflow has already ended")

// Await implements orchestrator.Host: it ends the workflow, with
// everything held back, unless signals are pending or the next step is
// journaled. A suspended workflow's run ends here; a signal runs it
// again (Engine.Signal).
func (h *host) Await(suspended bool, ending *lifecyclev1.LifecycleEvent) (bool, error) {
	status := orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED
	if suspended {
		status = orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED
	}
	return h.await(status, "", ending, orchestrator.Wakes)
}

// AwaitRaise implements orchestrator.Host: Await, suspended, that only a
// limits change ends.
func (h *host) AwaitRaise(asking string, ending *lifecyclev1.LifecycleEvent) (bool, error) {
	return h.await(orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED, asking, ending, orchestrator.Raises)
}

// await ends the workflow in status, waiting for a raise of asking (""
// for none), unless the next step is journaled or a pending signal wakes
// it (nil wakes: any).
func (h *host) await(status orchestratorv1.WorkflowStatus, asking string, ending *lifecyclev1.LifecycleEvent, wakes func([]byte) bool) (bool, error) {
	isNew := h.next()
	var raw []byte
	if isNew {
		raw, _ = h.encode(ending)
	}
	var (
		more, ended bool
		pos         uint64
	)
	if err := h.commit(endUnlessMore(h.n+1, status, asking, h.withEnding(raw, isNew, &pos), wakes, &more, &ended)); err != nil {
		return false, err
	}
	if ended {
		return false, errEnded
	}
	if !more && isNew {
		ending.WorkflowSequence = pos
		h.send(ending)
	}
	return more, nil
}

// Stopped implements orchestrator.Host. A journal that cannot be
// written because its disk is full pauses the workflow rather than fail
// it: the fault heals, and the engine runs it again (see Engine.launch).
// A run whose workflow was not created stops there.
func (h *host) Stopped(err error) *orchestrator.Stop {
	if errors.Is(err, errNotCreated) {
		return &orchestrator.Stop{Pause: true}
	}
	var canceled *canceledError
	switch cause := context.Cause(h.ctx); {
	case errors.Is(cause, errShutdown):
		return &orchestrator.Stop{Pause: true}
	case errors.As(cause, &canceled):
		return &orchestrator.Stop{Reason: canceled.reason}
	}
	if errors.Is(err, errs.StorageFull) {
		h.stalled = err
		return &orchestrator.Stop{Pause: true}
	}
	return nil
}

// End implements orchestrator.Host, with everything held back. A Cancel
// records its own end.
func (h *host) End(status orchestratorv1.WorkflowStatus, f *orchestrator.Failure, ending *lifecyclev1.LifecycleEvent) bool {
	isNew := h.next()
	var raw []byte
	if isNew {
		raw, _ = h.encode(ending)
	}
	var (
		recorded bool
		pos      uint64
	)
	err := h.commit(func(w *wtx) error {
		recorded = false
		r, err := w.record()
		if err != nil {
			return err
		}
		if r.terminal() {
			return nil // nothing to record, but what is held back and staged is
		}
		if err := h.withEnding(raw, isNew, &pos)(w); err != nil {
			return err
		}
		r.Status = status
		r.Failure = &failure{Code: f.Code, Message: f.Message, Reason: f.Reason}
		w.dirty, recorded = true, true
		return nil
	})
	if errors.Is(err, errNotCreated) {
		return false
	}
	if err != nil {
		h.e.log.Error("could not record the workflow's end", "workflow_id", h.id, "err", err)
		if errors.Is(err, errs.StorageFull) {
			h.stalled = err // still RUNNING: ended again once it can be written
		}
		return false
	}
	if recorded && isNew {
		ending.WorkflowSequence = pos
		h.send(ending)
	}
	return recorded
}
