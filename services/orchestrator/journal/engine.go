package journal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shopspring/decimal"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/lifecycle"
	"github.com/secbear/neuron/services/orchestrator"
)

// Engine runs workflows in this process, durably: it journals every step,
// effect and signal in a Journal and, after a restart, runs every
// unfinished workflow again from the top, replaying what is journaled. It
// implements orchestrator.Engine.
type Engine struct {
	j    *Journal
	deps orchestrator.Deps
	opts orchestrator.Options
	log  *slog.Logger
	// sleep waits between retries; tests replace it.
	sleep func(ctx context.Context, d time.Duration) error

	base context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup
	// work hands a workflow's run to an idle runner (runOn).
	work chan func()

	mu   sync.Mutex
	runs map[string]*run
	// waits says what running workflows wait for (Workflow.Waiting);
	// nwaits is its size, read without mu on every journal write.
	waits  map[string]*orchestrator.Wait
	nwaits atomic.Int32
}

// run is a workflow executing in this process.
type run struct {
	cancel context.CancelCauseFunc
	done   chan struct{}
	// again asks the goroutine to run the workflow once more before it
	// exits: a signal resumed it while the previous run was ending.
	again bool
	// stalled is the journal write that paused the run (a full disk),
	// until the run goes again; stall is closed when it is set, to wake
	// Wait.
	stalled error
	stall   chan struct{}
	// creation, when the run's first write creates the workflow.
	creation *creation
	// deferred, when that write waits for the end of the first operator
	// call (an unnamed Dispatch: see deferral).
	deferred *deferral
}

// Stalled runs go again after stallBackoff, doubling to stallBackoffMax.
const (
	stallBackoff    = 250 * time.Millisecond
	stallBackoffMax = 5 * time.Second
)

// errShutdown is the cause that pauses workflows when the engine closes.
var errShutdown = errors.New("the orchestrator is shutting down; the workflow resumes when it restarts")

// canceledError is the cause of a Cancel.
type canceledError struct{ reason string }

func (e *canceledError) Error() string { return e.reason }

// New returns an engine over the journal. Call Resume to restart the
// journal's unfinished workflows, and Close to stop.
func New(j *Journal, deps orchestrator.Deps, opts orchestrator.Options) *Engine {
	opts = opts.WithDefaults()
	base, stop := context.WithCancel(context.Background())
	return &Engine{j: j, deps: deps, opts: opts, log: opts.Log, sleep: orchestrator.Sleep,
		base: base, stop: stop, runs: map[string]*run{}, waits: map[string]*orchestrator.Wait{}, work: make(chan func())}
}

// give hands a lifecycle event over to the bus (which keeps it, so the
// caller must not touch it again); without a bus it is dropped.
func (e *Engine) give(ev *lifecyclev1.LifecycleEvent) {
	if e.deps.Bus != nil {
		e.deps.Bus.PublishOwned(ev)
	}
}

// observable is an orchestrator event as the log keeps it.
func (e *Engine) observable(workflowID, agentID, eventType string, data map[string]any) *lifecyclev1.LifecycleEvent {
	ev := lifecycle.Observable(lifecyclev1.EventSource_EVENT_SOURCE_ORCHESTRATOR, eventType, workflowID, agentID, data)
	ev.Time = timestamppb.Now()
	return ev
}

// Events implements orchestrator.Engine: the workflow's log ends once
// the workflow has ended and no longer runs here.
func (e *Engine) Events(_ context.Context, id string, after uint64) ([]*lifecyclev1.LifecycleEvent, bool, error) {
	e.reveal(id)
	evs, ended, err := e.j.Events(id, after)
	if err != nil {
		return nil, false, err
	}
	if ended {
		e.mu.Lock()
		_, running := e.runs[id]
		e.mu.Unlock()
		ended = !running
	}
	return evs, ended, nil
}

var _ orchestrator.RunEnds = (*Engine)(nil)

// RunEnd implements orchestrator.RunEnds: the channel is closed once the
// workflow's run here has left the run table (so Events then says ended,
// when it has).
func (e *Engine) RunEnd(_ context.Context, id string) <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	if r := e.runs[id]; r != nil {
		return r.done
	}
	return nil
}

// Resume restarts every workflow the journal has as RUNNING.
func (e *Engine) Resume() (int, error) {
	recs, err := e.j.Unfinished()
	if err != nil {
		return 0, err
	}
	for _, r := range recs {
		e.log.Info("resuming workflow", "workflow_id", r.ID, "steps", r.Steps, "agent", r.CurrentAgent)
		e.launch(r)
	}
	return len(recs), nil
}

// Close stops every workflow in flight, leaving it RUNNING in the journal
// so that the next start resumes it, and waits for them.
func (e *Engine) Close() {
	e.mu.Lock()
	for _, r := range e.runs {
		r.cancel(errShutdown)
	}
	e.mu.Unlock()
	e.stop()
	e.wg.Wait()
}

// Start implements orchestrator.Engine.
func (e *Engine) Start(ctx context.Context, req *orchestrator.StartRequest) (string, bool, error) {
	agent, err := e.deps.Registry.Lookup(req.AgentID)
	if err != nil {
		return "", false, err
	}
	// The workflow's span ids, journaled: its steps run under it, across
	// restarts (orchestrator.EndWorkflowSpan reports it at the end).
	trace := orchestrator.WorkflowTrace(ctx)
	spec, err := orchestrator.NewSpec(req, agent, e.opts, trace)
	if err != nil {
		return "", false, fmt.Errorf("input: %v: %w", err, errs.InvalidArgument)
	}
	now := time.Now()
	rec := &record{
		ID: spec.ID, Status: orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING,
		RootAgent: agent.ID, CurrentAgent: agent.ID, Budget: spec.Budget, Created: now, Updated: now,
		Fingerprint: req.Fingerprint(), Input: spec.Input, Detached: req.Detached, Trace: trace,
		MaxDepth: spec.MaxDepth, MaxSteps: spec.MaxSteps, WarnFraction: spec.WarnFraction.String(),
		RootRevision: agent.Revision, AskLimits: spec.AskLimits,
	}
	if dl, ok := ctx.Deadline(); ok && !req.Detached {
		rec.Deadline = dl
	}
	existing, created, err := e.create(rec, req.Unnamed && !req.Detached)
	if err != nil {
		return "", false, err
	}
	if !created {
		if existing.Fingerprint != rec.Fingerprint {
			return "", true, fmt.Errorf("workflow %q already exists with a different request (agent %q); use a new workflow_id: %w",
				existing.ID, existing.RootAgent, errs.AlreadyExists)
		}
		return existing.ID, true, nil
	}
	return rec.ID, false, nil
}

// creation is a workflow Start made in memory only: its run creates it
// in the journal with its first write (its first step's intent, or its
// end), and Start waits for that write.
type creation struct {
	rec  *record
	done chan struct{}
	// The write's outcome: created (both nil), the workflow existing
	// already (nothing written), or the write failed.
	existing *record
	err      error
}

// record is the workflow to create; nil for none.
func (c *creation) record() *record {
	if c == nil {
		return nil
	}
	return c.rec
}

func (c *creation) resolve(existing *record, err error) {
	c.existing, c.err = existing, err
	close(c.done)
}

// create creates rec's workflow and runs it, returning what
// Journal.Create would (once the creation is durable). The record is not
// written on its own: the run writes it with its first write, so that a
// Dispatch commits once before its operator call. When the id runs here
// already, or the engine is closing, the record is written on its own
// (Journal.Create) as before.
//
// With deferred (a Dispatch that named no workflow), create returns at
// once and the run's first write waits for the end of its first
// operator call (see deferral); Wait reports a creation that failed.
func (e *Engine) create(rec *record, deferred bool) (existing *record, created bool, err error) {
	e.mu.Lock()
	if r := e.runs[rec.ID]; r != nil || e.base.Err() != nil {
		e.mu.Unlock()
		if r != nil {
			r.reveal() // the run creating this id has written it, or failed to
		}
		if existing, created, err = e.j.Create(rec); created {
			e.launch(rec)
		}
		return existing, created, err
	}
	c := &creation{rec: rec, done: make(chan struct{})}
	var d *deferral
	if deferred {
		d = &deferral{c: c, held: make(chan struct{})}
	}
	e.start(rec, c, d)
	e.mu.Unlock()
	if deferred {
		return nil, true, nil
	}
	<-c.done
	if c.existing != nil {
		return c.existing, false, nil
	}
	return nil, c.err == nil, c.err
}

// deferral is the first write of a workflow that a Dispatch naming no
// workflow started, held back over its first operator call: the
// workflow's creation and its first step's intent are committed with
// the step's result (or whatever the run next commits), so a one-step
// Dispatch commits once. Nobody was promised the workflow before the
// Dispatch answers (the caller learns its id from the answer), so a
// crash during that call loses a workflow nobody knows of: the caller
// sees UNAVAILABLE and may dispatch again, and the journal has no
// RUNNING workflow to resume. (The operator called may have acted: an
// operator call is at-least-once across crashes in any case.)
//
// Whoever names the workflow meanwhile (it is listed, or the operator
// passes on its id) finds it as it would have without the deferral:
// reveal commits the held write first, from that goroutine, while the
// run is in its operator call.
type deferral struct {
	c *creation
	// held is closed when the run holds its first write back and calls
	// the operator; h is the run's host, whose commit reveal may make.
	held chan struct{}
	h    *host
	// mu orders reveal's commit and the run taking its writes back after
	// the call; state says which came first.
	mu    sync.Mutex
	state deferState
}

type deferState int

const (
	deferNone     deferState = iota // the run has not held its first write back
	deferHeld                       // held back over the operator call
	deferTaken                      // the call ended: the run commits it
	deferRevealed                   // reveal committed it
)

// hold says that h holds its first write back and calls the operator.
func (d *deferral) hold(h *host) {
	d.mu.Lock()
	d.h, d.state = h, deferHeld
	d.mu.Unlock()
	close(d.held)
}

// take ends the hold once the operator call returns: from here on the
// run's next commit makes the write, unless reveal already has. It says
// whether the write is still held (not revealed).
func (d *deferral) take() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state == deferHeld {
		d.state = deferTaken
	}
	return d.state == deferTaken
}

// reveal returns once the workflow is created in the journal (or its
// creation failed), committing the held write when the run is in its
// first operator call.
func (d *deferral) reveal() {
	select {
	case <-d.held:
	case <-d.c.done:
		return
	}
	d.mu.Lock()
	if d.state == deferHeld {
		d.state = deferRevealed
		_ = d.h.commit() // tells d.c how it went
	}
	d.mu.Unlock()
	<-d.c.done
}

// reveal waits for the run's creation of its workflow, if it creates
// it: done once the workflow is journaled or will never be.
func (r *run) reveal() {
	switch {
	case r.deferred != nil:
		r.deferred.reveal()
	case r.creation != nil:
		<-r.creation.done
	}
}

// reveal makes workflow id durable if it runs here deferred (see
// deferral), so that whoever names it finds it in the journal.
func (e *Engine) reveal(id string) {
	e.mu.Lock()
	r := e.runs[id]
	e.mu.Unlock()
	if r != nil && r.deferred != nil {
		r.deferred.reveal()
	}
}

// revealAll makes every workflow running here deferred durable (see
// deferral), for a listing.
func (e *Engine) revealAll() {
	var ds []*deferral
	e.mu.Lock()
	for _, r := range e.runs {
		if r.deferred != nil {
			ds = append(ds, r.deferred)
		}
	}
	e.mu.Unlock()
	var wg sync.WaitGroup
	for _, d := range ds {
		wg.Go(d.reveal) // concurrently: the group commit writes them together
	}
	wg.Wait()
}

// spec is the workflow input of rec; records written before the settings
// were frozen at start take the engine's.
func (e *Engine) spec(rec *record) *orchestrator.Spec {
	s := &orchestrator.Spec{ID: rec.ID, RootAgent: rec.RootAgent, Detached: rec.Detached, Input: rec.Input, Budget: rec.Budget, Trace: rec.Trace,
		MaxDepth: rec.MaxDepth, MaxSteps: rec.MaxSteps, WarnFraction: e.opts.WarnFraction, AskLimits: rec.AskLimits}
	if s.MaxDepth == 0 {
		s.MaxDepth = e.opts.MaxDepth
	}
	if s.MaxSteps == 0 {
		s.MaxSteps = e.opts.MaxSteps
	}
	if f, err := decimal.NewFromString(rec.WarnFraction); err == nil && f.IsPositive() {
		s.WarnFraction = f
	}
	return s
}

// launch runs rec's workflow unless it already runs here.
func (e *Engine) launch(rec *record) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if r, ok := e.runs[rec.ID]; ok {
		r.again = true
		return
	}
	if e.base.Err() != nil {
		return
	}
	e.start(rec, nil, nil)
}

// start runs rec's workflow in a goroutine of its own, its first run
// creating it when c is set (once its first operator call ends, when d
// is set too). The caller holds e.mu and has checked that it does not
// run here yet and that the engine is not closing.
func (e *Engine) start(rec *record, c *creation, d *deferral) {
	ctx, cancel := context.WithCancelCause(e.base)
	ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier(rec.Trace))
	r := &run{cancel: cancel, done: make(chan struct{}), stall: make(chan struct{}), creation: c, deferred: d}
	e.runs[rec.ID] = r
	e.wg.Add(1)
	e.runOn(func() {
		defer e.wg.Done()
		defer close(r.done)
		defer cancel(nil)
		backoff := stallBackoff
		for {
			stalled := e.execute(ctx, rec.ID, c, d)
			c, d = nil, nil
			if stalled != nil && ctx.Err() == nil {
				// The journal could not be written (a full disk): the
				// workflow stays RUNNING, and goes again, from what is
				// journaled, until the write goes through.
				e.stalled(r, rec.ID, stalled)
				if e.sleep(ctx, backoff) == nil {
					backoff = min(2*backoff, stallBackoffMax)
					e.mu.Lock()
					r.stalled = nil
					e.mu.Unlock()
					continue
				}
			}
			e.mu.Lock()
			if r.again && ctx.Err() == nil {
				r.again = false
				e.mu.Unlock()
				continue
			}
			delete(e.runs, rec.ID)
			if _, ok := e.waits[rec.ID]; ok {
				delete(e.waits, rec.ID)
				e.nwaits.Add(-1)
			}
			e.mu.Unlock()
			if end, err := e.j.Get(rec.ID); err == nil && end.terminal() {
				orchestrator.EndWorkflowSpan(end.Trace, end.ID, end.RootAgent, end.Status, end.Created, end.Updated)
			}
			return
		}
	})
}

// runOn runs fn on an idle runner, or a new one. A runner is a goroutine
// that runs workflows one after another, and waits up to runnerIdle for
// the next: a run goes deep (the workflow, gRPC, protobuf), and the
// stack of a new goroutine would grow again for every workflow. Idle
// runners exit when the engine closes.
func (e *Engine) runOn(fn func()) {
	select {
	case e.work <- fn:
	default:
		go e.runner(fn)
	}
}

// runnerIdle is how long a runner waits for the next workflow.
const runnerIdle = 10 * time.Second

func (e *Engine) runner(fn func()) {
	idle := time.NewTimer(runnerIdle)
	defer idle.Stop()
	for {
		fn()
		idle.Reset(runnerIdle)
		select {
		case fn = <-e.work:
		case <-idle.C:
			return
		case <-e.base.Done():
			return
		}
	}
}

// stalled records that r's run paused because the journal could not be
// written, and wakes whoever waits for the workflow.
func (e *Engine) stalled(r *run, id string, err error) {
	e.log.Error("the journal cannot be written; the workflow stays RUNNING and goes on once it can", "workflow_id", id, "err", err)
	e.waiting(id, "the journal cannot be written: "+err.Error())
	e.mu.Lock()
	r.stalled = err
	close(r.stall)
	r.stall = make(chan struct{})
	e.mu.Unlock()
}

// waiting records what workflow id waits for (one more attempt).
func (e *Engine) waiting(id, reason string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	w := e.waits[id]
	if w == nil {
		w = &orchestrator.Wait{Since: time.Now()}
		e.waits[id] = w
		e.nwaits.Add(1)
	}
	w.Reason = reason
	w.Attempts++
}

// progress says workflow id made progress: it no longer waits.
func (e *Engine) progress(id string) {
	if e.nwaits.Load() == 0 {
		return
	}
	e.mu.Lock()
	if _, ok := e.waits[id]; ok {
		delete(e.waits, id)
		e.nwaits.Add(-1)
	}
	e.mu.Unlock()
}

// execute runs workflow id until it ends, suspends or is stopped. It
// returns the journal write that stopped it when the journal could not
// be written (a full disk), leaving the workflow RUNNING.
//
// With c set, the workflow exists in memory only: the run creates it
// with its first write and tells c how that went; with d set too, that
// write waits for the end of the first operator call (see deferral).
func (e *Engine) execute(ctx context.Context, id string, c *creation, d *deferral) (stalled error) {
	var h *host
	rec := c.record()
	if rec != nil {
		h = newHost(e, ctx, rec, 0, map[string]*lookupRecord{})
		h.creating, h.created, h.deferred = rec, c.resolve, d
	} else {
		var (
			logged  uint64
			lookups map[string]*lookupRecord
			err     error
		)
		rec, logged, lookups, err = e.j.runState(id)
		if err != nil {
			e.log.Error("workflow vanished from the journal", "workflow_id", id, "err", err)
			return nil
		}
		if rec.Status != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING {
			return nil
		}
		h = newHost(e, ctx, rec, logged, lookups)
	}
	defer h.close()
	exit := orchestrator.Run(h, e.spec(rec))
	if h.creating != nil && h.notCreated == nil {
		// Stopped before its first write: the workflow is created
		// RUNNING, for a later run.
		_ = h.commit()
	}
	if h.notCreated != nil {
		return nil // never created: nothing to run again
	}
	if exit.Status == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING && h.stalled == nil {
		// Paused for a shutdown: keep what the run had held back.
		if err := h.sync(); err != nil {
			e.log.Warn("could not journal what a paused workflow did last; a later run does it again", "workflow_id", id, "err", err)
		}
	}
	switch {
	case h.stalled != nil:
		return h.stalled
	case exit.Status == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING:
		e.log.Info("workflow paused for shutdown", "workflow_id", id, "steps", h.n)
	case exit.Failure != nil:
		e.log.Warn("workflow ended", "workflow_id", id, "status", orchestrator.StatusName(exit.Status),
			"code", exit.Failure.Code, "reason", exit.Failure.Reason, "error", exit.Failure.Message)
	}
	return nil
}

// Wait implements orchestrator.Engine. A workflow whose journal cannot
// be written (a full disk) is not waited for: the caller learns at once,
// while the workflow stays RUNNING and goes on by itself.
func (e *Engine) Wait(ctx context.Context, id string) (*orchestrator.Workflow, error) {
	for {
		e.mu.Lock()
		r := e.runs[id]
		var stall chan struct{}
		var stalled error
		if r != nil {
			stall, stalled = r.stall, r.stalled
		}
		e.mu.Unlock()
		if stalled != nil {
			return nil, fmt.Errorf("workflow %q is RUNNING but cannot be journaled, so it waits and goes on by itself once it can (follow it with GetWorkflow): %w", id, stalled)
		}
		if r == nil {
			rec, steps, outcomes, err := e.j.final(id)
			if err != nil {
				return nil, err
			}
			if rec.Status != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING {
				return e.withEffects(rec, steps, outcomes)
			}
			// RUNNING but not running here: a resume is about to launch
			// it, or the engine is closing.
			if e.base.Err() != nil {
				return nil, fmt.Errorf("%v: %w", errShutdown, errs.Unavailable)
			}
			if err := orchestrator.Sleep(ctx, 10*time.Millisecond); err != nil {
				return nil, err
			}
			continue
		}
		select {
		case <-r.done:
			if d := r.deferred; d != nil {
				// Started by an unnamed Dispatch: Start did not wait for
				// the workflow's creation, so its failure is told here.
				switch c := d.c; {
				case c.err != nil:
					return nil, c.err
				case c.existing != nil:
					return nil, fmt.Errorf("the workflow id %q generated for this Dispatch is taken; dispatch again: %w", id, errs.Unavailable)
				}
			}
		case <-stall:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// Cancel implements orchestrator.Engine.
func (e *Engine) Cancel(_ context.Context, id, reason string) (*orchestrator.Workflow, error) {
	e.reveal(id)
	var ev *lifecyclev1.LifecycleEvent
	rec, err := e.j.Update(id, func(r *record) error {
		if r.terminal() {
			return errNoChange
		}
		r.Status = orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED
		r.Failure = &failure{Code: int32(errs.Code(errs.Canceled)), Message: reason}
		return nil
	}, func(w *wtx) error {
		ev = nil
		r, err := w.record()
		if err != nil || r.terminal() {
			return err
		}
		ev = e.observable(id, r.CurrentAgent, "orchestrator.workflow.canceled", map[string]any{"reason": reason})
		return w.logEvent(ev)
	})
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	if r := e.runs[id]; r != nil {
		r.cancel(&canceledError{reason})
	}
	e.mu.Unlock()
	if ev != nil {
		e.give(ev)
	}
	return e.view(rec, false)
}

// Signal implements orchestrator.Engine.
func (e *Engine) Signal(_ context.Context, id string, payload []byte, key string) (uint64, bool, error) {
	e.reveal(id)
	var ev *lifecyclev1.LifecycleEvent
	seq, dup, resumed, err := e.j.AddSignal(id, payload, key, func(seq uint64) *lifecyclev1.LifecycleEvent {
		ev = e.observable(id, "", "orchestrator.signal.accepted", map[string]any{"sequence": seq, "signal_type": orchestrator.SignalType(payload)})
		return ev
	})
	if err != nil {
		return 0, false, err
	}
	if !dup {
		e.give(ev)
	}
	if resumed {
		rec, err := e.j.Get(id)
		if err != nil {
			return seq, dup, err
		}
		e.launch(rec)
	}
	return seq, dup, nil
}

// Get implements orchestrator.Engine.
func (e *Engine) Get(_ context.Context, id string) (*orchestrator.Workflow, error) {
	e.reveal(id)
	rec, err := e.j.Get(id)
	if err != nil {
		return nil, err
	}
	return e.view(rec, false)
}

// List implements orchestrator.Engine: newest first.
func (e *Engine) List(_ context.Context, status orchestratorv1.WorkflowStatus, size int, token string) ([]*orchestrator.Workflow, string, error) {
	e.revealAll()
	recs, next, err := e.j.List(status, size, token)
	if err != nil {
		return nil, "", err
	}
	out := make([]*orchestrator.Workflow, 0, len(recs))
	for _, r := range recs {
		wf, err := e.view(r, false)
		if err != nil {
			return nil, "", err
		}
		out = append(out, wf)
	}
	return out, next, nil
}

// Steps implements orchestrator.Engine.
func (e *Engine) Steps(_ context.Context, id string) ([]orchestrator.StepView, error) {
	e.reveal(id)
	steps, err := e.j.Steps(id)
	if err != nil {
		return nil, err
	}
	list := make([]orchestrator.StepView, 0, len(steps))
	for i, st := range steps {
		in := &operatorv1.OperatorInput{}
		_ = proto.Unmarshal(st.Input, in)
		v := orchestrator.StepView{N: uint64(i + 1), Dispatch: in.GetDispatch().GetDispatchId(), Agent: st.Agent,
			Depth: in.GetDispatch().GetDepth(), Trigger: in.GetTrigger().String(), Started: st.Started, State: "running", Signals: st.Signals}
		switch {
		case st.Error != nil:
			v.State, v.Error = "failed", st.Error.Message
		case st.Output != nil:
			o := &operatorv1.OperatorOutput{}
			_ = proto.Unmarshal(st.Output, o)
			v.State, v.Exit, v.Cost, v.Effects = "done", o.GetExitReason().GetKind().String(), orchestrator.OutputCost(o).String(), len(o.GetEffects())
		}
		list = append(list, v)
	}
	return list, nil
}

// Signals implements orchestrator.Engine.
func (e *Engine) Signals(_ context.Context, id string) ([]orchestrator.SignalView, error) {
	e.reveal(id)
	sigs, err := e.j.Signals(id)
	if err != nil {
		return nil, err
	}
	list := make([]orchestrator.SignalView, 0, len(sigs))
	for _, s := range sigs {
		list = append(list, orchestrator.SignalView{Seq: s.Seq, Payload: s.Payload, Step: s.Step})
	}
	return list, nil
}

// view is a record as the service shows it; with effects, the outcome
// of every effect of every step, in order.
func (e *Engine) view(r *record, effects bool) (*orchestrator.Workflow, error) {
	if !effects {
		return e.viewOf(r)
	}
	steps, err := e.j.Steps(r.ID)
	if err != nil {
		return nil, err
	}
	outcomes, err := e.j.Effects(r.ID)
	if err != nil {
		return nil, err
	}
	return e.withEffects(r, steps, outcomes)
}

// viewOf is a record as the service shows it, without the effects.
func (e *Engine) viewOf(r *record) (*orchestrator.Workflow, error) {
	wf := &orchestrator.Workflow{
		ID: r.ID, Status: r.Status, RootAgent: r.RootAgent, CurrentAgent: r.CurrentAgent, Steps: r.Steps,
		Spent: r.Spent, Budget: r.Budget, Created: r.Created, Updated: r.Updated, Pending: r.Pending,
		MaxSteps: r.MaxSteps,
	}
	if r.Status == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED {
		wf.Asking = r.Asking
	}
	if r.Limit.Valid {
		wf.Budget = r.Limit
	}
	if r.LimitSteps > 0 {
		wf.MaxSteps = r.LimitSteps
	}
	if wf.MaxSteps == 0 {
		wf.MaxSteps = e.opts.MaxSteps
	}
	if r.Failure != nil {
		wf.Failure = &orchestrator.Failure{Code: r.Failure.Code, Message: r.Failure.Message, Reason: r.Failure.Reason}
	}
	if e.nwaits.Load() > 0 {
		e.mu.Lock()
		if w := e.waits[r.ID]; w != nil {
			c := *w
			wf.Waiting = &c
		}
		e.mu.Unlock()
	}
	if r.LastOutput != nil {
		wf.LastOutput = &operatorv1.OperatorOutput{}
		if err := proto.Unmarshal(r.LastOutput, wf.LastOutput); err != nil {
			return nil, fmt.Errorf("journaled output is corrupt: %v: %w", err, errs.Internal)
		}
	}
	return wf, nil
}

// withEffects is viewOf(r) with the outcome of every effect of every
// step, in order, from the workflow's steps and recorded outcomes.
func (e *Engine) withEffects(r *record, steps []*stepRecord, outcomes map[string]*effectRecord) (*orchestrator.Workflow, error) {
	wf, err := e.viewOf(r)
	if err != nil {
		return nil, err
	}
	for i, st := range steps {
		if st.Output == nil || !hasEffects(st.Output) {
			continue
		}
		out := wf.LastOutput
		if !bytes.Equal(st.Output, r.LastOutput) {
			out = &operatorv1.OperatorOutput{}
			if err := proto.Unmarshal(st.Output, out); err != nil {
				return nil, fmt.Errorf("journaled output is corrupt: %v: %w", err, errs.Internal)
			}
		}
		id := orchestrator.DispatchID(r.ID, uint64(i+1))
		for j, eff := range out.GetEffects() {
			key := orchestrator.EffectKey(id, j, eff)
			o := &orchestratorv1.EffectOutcome{IdempotencyKey: key, Detail: orchestrator.NotExecuted}
			if r := outcomes[key]; r != nil {
				o.Applied, o.Detail = r.Applied, r.Detail
			}
			wf.Effects = append(wf.Effects, o)
		}
	}
	return wf, nil
}

// outputEffects is OperatorOutput.effects' field number.
var outputEffects = protowire.Number((&operatorv1.OperatorOutput{}).ProtoReflect().Descriptor().Fields().ByName("effects").Number())

// hasEffects says whether raw, a binary OperatorOutput, may declare
// effects (true when it cannot be parsed: decoding it says why).
func hasEffects(raw []byte) bool {
	for len(raw) > 0 {
		n, typ, l := protowire.ConsumeTag(raw)
		if l < 0 {
			return true
		}
		if n == outputEffects {
			return true
		}
		raw = raw[l:]
		if l = protowire.ConsumeFieldValue(n, typ, raw); l < 0 {
			return true
		}
		raw = raw[l:]
	}
	return false
}
