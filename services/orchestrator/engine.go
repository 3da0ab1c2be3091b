package orchestrator

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/shopspring/decimal"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/protobuf/proto"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/lifecycle"
)

// Defaults of Options.
const (
	DefaultMaxDepth     = 8
	DefaultMaxSteps     = 256
	DefaultWorkers      = 16
	DefaultWarnFraction = "0.8"
)

// Options configure an Engine. Zero values take the defaults.
type Options struct {
	// MaxDepth bounds delegation depth (the root is 0).
	MaxDepth uint32
	// MaxSteps bounds the operator calls of one workflow.
	MaxSteps uint64
	// Workers is DispatchMany's default concurrency.
	Workers int
	// WarnFraction of a workflow budget triggers a BudgetWarning.
	WarnFraction decimal.Decimal
	// Policy decides what happens as a budget is spent.
	Policy BudgetPolicy
	// Handlers execute custom effects by effect_type.
	Handlers map[string]EffectHandler
	// Log receives the engine's logs.
	Log *slog.Logger
	// Sleep waits between retries; tests replace it.
	Sleep func(ctx context.Context, d time.Duration) error
}

// Caller runs one operator invocation of an agent.
type Caller interface {
	Call(ctx context.Context, agent *Agent, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error)
}

// Engine runs durable workflows: it journals every step, executes
// effects exactly once and resumes unfinished workflows after a restart.
type Engine struct {
	j      *Journal
	reg    *Registry
	caller Caller
	state  statev1.StateServiceClient
	bus    *lifecycle.Bus
	opts   Options
	log    *slog.Logger

	base context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu   sync.Mutex
	runs map[string]*run
}

// run is a workflow executing in this process.
type run struct {
	cancel context.CancelCauseFunc
	done   chan struct{}
	// again asks the goroutine to run the workflow once more before it
	// exits: a signal resumed it while the previous run was ending.
	again bool
}

// Cancellation causes, which decide the status a stopped workflow gets.
var (
	errShutdown   = errors.New("the orchestrator is shutting down; the workflow resumes when it restarts")
	errCallerLeft = errors.New("the Dispatch caller went away")
)

// canceledError is the cause of a CancelWorkflow.
type canceledError struct{ reason string }

func (e *canceledError) Error() string { return e.reason }

// NewEngine returns an engine over the journal. state receives memory
// effects; bus receives lifecycle events. Call Resume to restart the
// journal's unfinished workflows, and Close to stop.
func NewEngine(j *Journal, reg *Registry, caller Caller, state statev1.StateServiceClient, bus *lifecycle.Bus, opts Options) *Engine {
	if opts.MaxDepth == 0 {
		opts.MaxDepth = DefaultMaxDepth
	}
	if opts.MaxSteps == 0 {
		opts.MaxSteps = DefaultMaxSteps
	}
	if opts.Workers <= 0 {
		opts.Workers = DefaultWorkers
	}
	if opts.WarnFraction.IsZero() {
		opts.WarnFraction = decimal.RequireFromString(DefaultWarnFraction)
	}
	if opts.Policy == nil {
		opts.Policy = ThresholdPolicy{}
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Sleep == nil {
		opts.Sleep = sleepCtx
	}
	base, stop := context.WithCancel(context.Background())
	return &Engine{j: j, reg: reg, caller: caller, state: state, bus: bus, opts: opts, log: opts.Log,
		base: base, stop: stop, runs: map[string]*run{}}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
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

// startRequest is a Dispatch or StartWorkflow.
type startRequest struct {
	WorkflowID string
	AgentID    string
	Input      *operatorv1.OperatorInput
	Budget     decimal.NullDecimal
	Detached   bool
}

// fingerprint identifies the request, so a retry is told from a
// different request reusing a workflow id.
func (s *startRequest) fingerprint() string {
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(s.Input)
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%v\x00", s.AgentID, s.Budget.Decimal.String(), s.Budget.Valid)
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

// newWorkflowID returns a time-ordered random id.
func newWorkflowID() string {
	var b [10]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("wf-%x-%s", time.Now().UnixMilli(), hex.EncodeToString(b[:]))
}

// Start creates a workflow and runs it in the background. When the id
// exists and the request is the same, it returns the existing record and
// existed=true; a different request gets ALREADY_EXISTS.
func (e *Engine) Start(ctx context.Context, req startRequest) (rec *record, existed bool, err error) {
	agent, err := e.reg.Lookup(req.AgentID)
	if err != nil {
		return nil, false, err
	}
	if req.WorkflowID == "" {
		req.WorkflowID = newWorkflowID()
	}
	budget := req.Budget
	if !budget.Valid {
		budget = agent.Defaults.Budget
	}
	input, err := proto.Marshal(req.Input)
	if err != nil {
		return nil, false, fmt.Errorf("input: %v: %w", err, errs.InvalidArgument)
	}
	now := time.Now()
	rec = &record{
		ID: req.WorkflowID, Status: orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING,
		RootAgent: agent.ID, CurrentAgent: agent.ID, Budget: budget, Created: now, Updated: now,
		Fingerprint: req.fingerprint(), Input: input, Detached: req.Detached,
		Trace: map[string]string{},
	}
	if dl, ok := ctx.Deadline(); ok && !req.Detached {
		rec.Deadline = dl
	}
	propagation.TraceContext{}.Inject(ctx, propagation.MapCarrier(rec.Trace))
	existing, created, err := e.j.Create(rec)
	if err != nil {
		return nil, false, err
	}
	if !created {
		if existing.Fingerprint != rec.Fingerprint {
			return nil, true, fmt.Errorf("workflow %q already exists with a different request (agent %q); use a new workflow_id: %w",
				existing.ID, existing.RootAgent, errs.AlreadyExists)
		}
		return existing, true, nil
	}
	e.event(rec.ID, agent.ID, "orchestrator.workflow.started", map[string]any{"agent_id": agent.ID, "detached": req.Detached})
	e.launch(rec)
	return rec, false, nil
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
	ctx, cancel := context.WithCancelCause(e.base)
	ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier(rec.Trace))
	var stopDeadline context.CancelFunc = func() {}
	if !rec.Deadline.IsZero() {
		ctx, stopDeadline = context.WithDeadline(ctx, rec.Deadline)
	}
	r := &run{cancel: cancel, done: make(chan struct{})}
	e.runs[rec.ID] = r
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		defer close(r.done)
		defer stopDeadline()
		defer cancel(nil)
		for {
			e.execute(ctx, rec.ID)
			e.mu.Lock()
			if r.again && ctx.Err() == nil {
				r.again = false
				e.mu.Unlock()
				continue
			}
			delete(e.runs, rec.ID)
			e.mu.Unlock()
			return
		}
	}()
}

// Wait returns the workflow's record once it is no longer RUNNING here,
// or ctx's error.
func (e *Engine) Wait(ctx context.Context, id string) (*record, error) {
	for {
		e.mu.Lock()
		r := e.runs[id]
		e.mu.Unlock()
		if r == nil {
			rec, err := e.j.Get(id)
			if err != nil || rec.Status != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING {
				return rec, err
			}
			// RUNNING but not running here: a resume is about to launch
			// it, or the engine is closing.
			if e.base.Err() != nil {
				return nil, fmt.Errorf("%v: %w", errShutdown, errs.Unavailable)
			}
			if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
				return nil, err
			}
			continue
		}
		select {
		case <-r.done:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// abandon stops a workflow whose Dispatch caller cancelled; it ends
// CANCELED.
func (e *Engine) abandon(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if r := e.runs[id]; r != nil {
		r.cancel(errCallerLeft)
	}
}

// Cancel stops a workflow and its in-flight operator call. A workflow
// that has ended is returned unchanged.
func (e *Engine) Cancel(id, reason string) (*record, error) {
	if reason == "" {
		reason = "cancelled by a caller"
	}
	rec, err := e.j.Update(id, func(r *record) error {
		if r.terminal() {
			return errNoChange
		}
		r.Status = orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED
		r.Failure = &failure{Code: int32(errs.Code(errs.Canceled)), Message: reason}
		return nil
	})
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	if r := e.runs[id]; r != nil {
		r.cancel(&canceledError{reason})
	}
	e.mu.Unlock()
	if rec.Status == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED && rec.Failure != nil && rec.Failure.Message == reason {
		e.event(id, rec.CurrentAgent, "orchestrator.workflow.canceled", map[string]any{"reason": reason})
	}
	return rec, nil
}

// Signal journals a signal for a workflow; it is delivered to the
// workflow's next operator call.
func (e *Engine) Signal(id string, payload []byte, key string) (uint64, bool, error) {
	seq, dup, resumed, err := e.j.AddSignal(id, payload, key)
	if err != nil {
		return 0, false, err
	}
	if !dup {
		e.event(id, "", "orchestrator.signal.accepted", map[string]any{"sequence": seq})
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
