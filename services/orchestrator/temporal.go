package orchestrator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/shopspring/decimal"
	"go.opentelemetry.io/otel/propagation"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/lifecycle"
)

// stickyTimeout is how long a workflow task or query waits for the
// worker that last ran the workflow before any worker may take it.
const stickyTimeout = 2 * time.Second

// Defaults of TemporalOptions.
const (
	DefaultTaskQueue        = "neuron"
	DefaultCallTimeout      = time.Hour
	DefaultHeartbeatTimeout = 30 * time.Second
)

// TemporalOptions configure the Temporal backend. Zero values take the
// defaults.
type TemporalOptions struct {
	// TaskQueue the workers poll and workflows start on.
	TaskQueue string
	// CallTimeout bounds one operator call attempt.
	CallTimeout time.Duration
	// HeartbeatTimeout is how soon a worker that died mid-call is noticed
	// and the call tried again elsewhere.
	HeartbeatTimeout time.Duration
	// Engine options: MaxDepth, MaxSteps, Workers, WarnFraction, Policy,
	// Handlers and Log apply as in the bbolt engine.
	Engine Options
}

// Temporal runs the orchestrator's workflows on Temporal: one Temporal
// workflow per Dispatch or StartWorkflow, operator calls and effects as
// activities, signals as Temporal signals, queries as Temporal queries
// and CancelWorkflow as Temporal cancellation. Every orchestrator
// process runs a worker; any of them may run any workflow.
type Temporal struct {
	c      client.Client
	reg    *Registry
	caller Caller
	state  statev1.StateServiceClient
	bus    *lifecycle.Bus
	opts   TemporalOptions
	policy BudgetPolicy
	log    *slog.Logger
	w      worker.Worker
}

// NewTemporal returns the Temporal backend over a connected client. state
// keeps operator outputs and receives memory effects; bus receives
// lifecycle events. Call Start to run its worker.
func NewTemporal(c client.Client, reg *Registry, caller Caller, state statev1.StateServiceClient, bus *lifecycle.Bus, opts TemporalOptions) *Temporal {
	if opts.TaskQueue == "" {
		opts.TaskQueue = DefaultTaskQueue
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = DefaultCallTimeout
	}
	if opts.HeartbeatTimeout <= 0 {
		opts.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	e := &opts.Engine
	if e.MaxDepth == 0 {
		e.MaxDepth = DefaultMaxDepth
	}
	if e.MaxSteps == 0 {
		e.MaxSteps = DefaultMaxSteps
	}
	if e.Workers <= 0 {
		e.Workers = DefaultWorkers
	}
	if e.WarnFraction.IsZero() {
		e.WarnFraction = decimal.RequireFromString(DefaultWarnFraction)
	}
	if e.Policy == nil {
		e.Policy = ThresholdPolicy{}
	}
	if e.Log == nil {
		e.Log = slog.New(slog.DiscardHandler)
	}
	return &Temporal{c: c, reg: reg, caller: caller, state: state, bus: bus, opts: opts, policy: e.Policy, log: e.Log}
}

// WorkflowRegistry is where the workflow is registered: a worker, the
// SDK's test environment or a replayer.
type WorkflowRegistry interface {
	RegisterWorkflowWithOptions(w any, options workflow.RegisterOptions)
}

// ActivityRegistry is where the activities are registered: a worker or
// the SDK's test environment.
type ActivityRegistry interface {
	RegisterActivityWithOptions(a any, options activity.RegisterOptions)
}

// RegisterWorkflow registers the workflow (replay tests need only it).
func (t *Temporal) RegisterWorkflow(r WorkflowRegistry) {
	r.RegisterWorkflowWithOptions(t.workflow, workflow.RegisterOptions{Name: twName})
}

// RegisterActivities registers the operator-call and effect activities.
func (t *Temporal) RegisterActivities(r ActivityRegistry) {
	r.RegisterActivityWithOptions(t.callActivity, activity.RegisterOptions{Name: twCallActivity})
	r.RegisterActivityWithOptions(t.effectActivity, activity.RegisterOptions{Name: twEffActivity})
}

// WorkflowName is the Temporal workflow type of every orchestrator
// workflow.
const WorkflowName = twName

// Start runs a worker on the task queue until Stop.
func (t *Temporal) Start() error {
	// A short sticky timeout: after a worker dies, its workflows' tasks
	// and queries go to another worker this soon.
	t.w = worker.New(t.c, t.opts.TaskQueue, worker.Options{StickyScheduleToStartTimeout: stickyTimeout})
	t.RegisterWorkflow(t.w)
	t.RegisterActivities(t.w)
	if err := t.w.Start(); err != nil {
		return fmt.Errorf("starting the Temporal worker on task queue %q: %w", t.opts.TaskQueue, err)
	}
	return nil
}

// Stop stops the worker; activities in flight are retried by another.
func (t *Temporal) Stop() {
	if t.w != nil {
		t.w.Stop()
	}
}

// outputScope is where a workflow's operator outputs are kept.
func outputScope(workflowID string) *typesv1.Scope {
	return &typesv1.Scope{Kind: &typesv1.Scope_Workflow{Workflow: &typesv1.WorkflowScope{WorkflowId: workflowID}}}
}

// outputKey is the State key of step n's output.
func outputKey(n uint64) string { return "orchestrator/output/" + strconv.FormatUint(n, 10) }

// loadOutput reads step n's output from State; nil when it is not there.
func loadOutput(ctx context.Context, state statev1.StateServiceClient, workflowID string, n uint64) (*operatorv1.OperatorOutput, error) {
	resp, err := state.Read(ctx, &statev1.ReadRequest{Scope: outputScope(workflowID), Key: outputKey(n)})
	if errors.Is(errs.FromGRPC(err), errs.NotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the output of step %d of workflow %q from the State service: %w", n, workflowID, errs.FromGRPC(err))
	}
	b, err := protojson.Marshal(resp.GetValue())
	if err != nil {
		return nil, err
	}
	out := &operatorv1.OperatorOutput{}
	if err := protojson.Unmarshal(b, out); err != nil {
		return nil, fmt.Errorf("the stored output of step %d of workflow %q is not an OperatorOutput: %v: %w", n, workflowID, err, errs.Internal)
	}
	return out, nil
}

// mustOutput is loadOutput for an output the workflow knows exists.
func mustOutput(ctx context.Context, state statev1.StateServiceClient, workflowID string, n uint64) (*operatorv1.OperatorOutput, error) {
	out, err := loadOutput(ctx, state, workflowID, n)
	if err == nil && out == nil {
		err = fmt.Errorf("the output of step %d of workflow %q is missing from the State service (was its scope deleted?): %w", n, workflowID, errs.FailedPrecondition)
	}
	return out, err
}

// storeOutput writes step n's output to State, idempotently.
func storeOutput(ctx context.Context, state statev1.StateServiceClient, workflowID string, n uint64, out *operatorv1.OperatorOutput) error {
	b, err := protojson.Marshal(out)
	if err != nil {
		return err
	}
	v := &structpb.Value{}
	if err := protojson.Unmarshal(b, v); err != nil {
		return err
	}
	_, err = state.Write(ctx, &statev1.WriteRequest{Scope: outputScope(workflowID), Key: outputKey(n), Value: v,
		IdempotencyKey: stateKey(workflowID, outputKey(n))})
	if err != nil {
		return fmt.Errorf("keeping the output of step %d in the State service: %w", n, errs.FromGRPC(err))
	}
	return nil
}

// activityErr converts an activity's failure for Temporal: retryable
// ones (transient State or operator failures) are retried by the
// activity's policy; the rest end it, carrying the status.
func activityErr(err error, retry bool) error {
	st := errs.ToStatus(err)
	f := &failure{Code: int32(st.Code()), Message: st.Message(), Reason: errs.Reason(err)}
	if retry {
		return temporal.NewApplicationError(f.Message, errTypeRetryable, f)
	}
	return temporal.NewNonRetryableApplicationError(f.Message, errTypeOperator, nil, f)
}

// callActivity makes one operator call: it builds the input the workflow
// planned, calls the agent's operator or environment, and keeps the
// output in State. An output already kept (a worker died after the call)
// is not called for again.
func (t *Temporal) callActivity(ctx context.Context, a callArgs) (*callResult, error) {
	out, err := loadOutput(ctx, t.state, a.WorkflowID, a.N)
	if err != nil {
		t.log.Warn("reading a kept output; retrying", "workflow_id", a.WorkflowID, "step", a.N, "err", err)
		return nil, activityErr(err, true)
	}
	if out == nil {
		if out, err = t.call(ctx, a); err != nil {
			return nil, err
		}
	}
	res := &callResult{Exit: out.GetExitReason().GetKind().String(), ResumeToken: out.GetExitReason().GetSuspension().GetResumeToken(),
		Cost: outputCost(out).String()}
	id := dispatchID(a.WorkflowID, a.N)
	for i, eff := range out.GetEffects() {
		info := effectInfo{Kind: effectKind(eff), Key: effectKey(id, i, eff)}
		switch k := eff.GetKind().(type) {
		case *typesv1.Effect_Delegate:
			info.Agent = k.Delegate.GetAgentId()
			if s := k.Delegate.GetSessionId(); s != "" {
				info.Session = &s
			}
		case *typesv1.Effect_Handoff:
			info.Agent = k.Handoff.GetAgentId()
		}
		res.Effects = append(res.Effects, info)
	}
	return res, nil
}

// call builds the input, calls the operator and keeps its output.
func (t *Temporal) call(ctx context.Context, a callArgs) (*operatorv1.OperatorOutput, error) {
	agent, err := t.reg.Lookup(a.Agent)
	if err != nil {
		return nil, activityErr(err, false)
	}
	planned, err := t.plan(ctx, a)
	if err != nil {
		t.log.Warn("building an operator input", "workflow_id", a.WorkflowID, "step", a.N, "err", err)
		return nil, activityErr(err, errs.Code(err) == errs.Code(errs.Unavailable))
	}
	id := dispatchID(a.WorkflowID, a.N)
	sigs := make([]*signalRecord, len(a.Signals))
	for i := range a.Signals {
		sigs[i] = &a.Signals[i]
	}
	in, _ := prepareInput(agent, planned, a.Model, a.Downgraded, &operatorv1.DispatchContext{
		DispatchId: id, WorkflowId: a.WorkflowID, AgentId: a.Agent, ParentDispatchId: a.Parent,
		CausationId: a.Cause, CorrelationId: a.Corr, Depth: a.Depth, TraceContext: a.Trace,
	}, sigs)

	ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier(a.Trace))
	remaining := decimal.NullDecimal{}
	if a.Remaining != "" {
		if d, err := decimal.NewFromString(a.Remaining); err == nil {
			remaining = decimal.NewNullDecimal(d)
		}
	}
	stop := heartbeat(ctx, t.opts.HeartbeatTimeout)
	started := time.Now()
	out, err := t.caller.Call(withBudget(ctx, remaining), agent, in)
	stop()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		attempt := activity.GetInfo(ctx).Attempt
		t.log.Warn("operator call failed", "workflow_id", a.WorkflowID, "agent", a.Agent, "attempt", attempt, "err", err)
		if !retryable(err) {
			t.dispatchFailed(a, id, err)
			return nil, activityErr(err, false)
		}
		if int(attempt) >= max(agent.Retry.withDefaults().MaxAttempts, 1) {
			t.dispatchFailed(a, id, err)
			err = fmt.Errorf("after %d attempts: %w", attempt, err)
		}
		return nil, activityErr(err, true)
	}
	if err := storeOutput(ctx, t.state, a.WorkflowID, a.N, out); err != nil {
		t.log.Warn("keeping an output in State; retrying the call", "workflow_id", a.WorkflowID, "step", a.N, "err", err)
		return nil, activityErr(err, true)
	}
	t.publish(lifecycle.Observable(lifecyclev1.EventSource_EVENT_SOURCE_ORCHESTRATOR, "orchestrator.dispatch.completed", a.WorkflowID, a.Agent, map[string]any{
		"dispatch_id": id, "exit": out.GetExitReason().GetKind().String(), "cost": outputCost(out).String(),
		"duration_ms": time.Since(started).Milliseconds(), "effects": len(out.GetEffects()), "signals": signalSeqs(a.Signals),
	}))
	return out, nil
}

func signalSeqs(sigs []signalRecord) []uint64 {
	out := make([]uint64, len(sigs))
	for i, s := range sigs {
		out[i] = s.Seq
	}
	return out
}

func (t *Temporal) dispatchFailed(a callArgs, id string, err error) {
	st := errs.ToStatus(err)
	t.publish(lifecycle.Observable(lifecyclev1.EventSource_EVENT_SOURCE_ORCHESTRATOR, "orchestrator.dispatch.failed", a.WorkflowID, a.Agent, map[string]any{
		"dispatch_id": id, "code": int32(st.Code()), "message": st.Message(), "reason": errs.Reason(err),
	}))
}

func (t *Temporal) publish(ev *lifecyclev1.LifecycleEvent) {
	if t.bus != nil {
		t.bus.Publish(ev)
	}
}

// heartbeat records activity heartbeats until stopped, so that a worker
// that dies mid-call is noticed within the heartbeat timeout.
func heartbeat(ctx context.Context, timeout time.Duration) (stop func()) {
	done := make(chan struct{})
	go func() {
		tick := time.NewTicker(max(timeout/3, 10*time.Millisecond))
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
				activity.RecordHeartbeat(ctx)
			}
		}
	}()
	return func() { close(done) }
}

// plan builds the input the workflow planned, reading the outputs it
// refers to from State.
func (t *Temporal) plan(ctx context.Context, a callArgs) (*operatorv1.OperatorInput, error) {
	p := a.Plan
	switch p.Kind {
	case "input":
		in := &operatorv1.OperatorInput{}
		if err := proto.Unmarshal(p.Input, in); err != nil {
			return nil, fmt.Errorf("the planned input of step %d is corrupt: %v: %w", a.N, err, errs.Internal)
		}
		if in.Message == nil {
			in.Message = &typesv1.Content{}
		}
		return in, nil
	case "delegate":
		eff, err := t.effectOf(ctx, a.WorkflowID, p.Step, p.Effect)
		if err != nil {
			return nil, err
		}
		d := eff.GetDelegate()
		in := &operatorv1.OperatorInput{Message: d.GetMessage(), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_TASK, Metadata: d.GetMetadata()}
		if s := d.GetSessionId(); s != "" {
			in.SessionId = &s
		}
		if in.Message == nil {
			in.Message = &typesv1.Content{}
		}
		return in, nil
	case "results":
		results, err := t.results(ctx, a.WorkflowID, p.Results)
		if err != nil {
			return nil, err
		}
		return resultsInput(p.Session, results), nil
	case "handoff":
		eff, err := t.effectOf(ctx, a.WorkflowID, p.Step, p.Effect)
		if err != nil {
			return nil, err
		}
		results, err := t.results(ctx, a.WorkflowID, p.Results)
		if err != nil {
			return nil, err
		}
		h := eff.GetHandoff()
		return handoffInput(p.Session, &handoffTarget{target: h.GetAgentId(), from: p.From, state: h.GetState()}, results), nil
	}
	return nil, fmt.Errorf("unknown step plan %q (a workflow started by a newer orchestrator?): %w", p.Kind, errs.Internal)
}

// effectOf is effect i of step n's output.
func (t *Temporal) effectOf(ctx context.Context, workflowID string, n uint64, i int) (*typesv1.Effect, error) {
	out, err := mustOutput(ctx, t.state, workflowID, n)
	if err != nil {
		return nil, err
	}
	if i < 0 || i >= len(out.GetEffects()) {
		return nil, fmt.Errorf("step %d of workflow %q has no effect %d: %w", n, workflowID, i, errs.Internal)
	}
	return out.GetEffects()[i], nil
}

// results resolves delegation results, reading each child's answer.
func (t *Temporal) results(ctx context.Context, workflowID string, refs []delegationRef) ([]delegation, error) {
	out := make([]delegation, 0, len(refs))
	for _, r := range refs {
		d := delegation{agent: r.Agent, key: r.Key, ok: r.OK, exit: r.Exit, text: r.Detail}
		if r.OK {
			o, err := mustOutput(ctx, t.state, workflowID, r.Step)
			if err != nil {
				return nil, err
			}
			d.text = content.TextOf(o.GetMessage())
		}
		out = append(out, d)
	}
	return out, nil
}

// effectActivity executes one non-dispatching effect, reading it from
// the output kept in State. A transient State failure is retried by the
// activity's policy; the State service recognises a repeat by the
// effect's idempotency key.
func (t *Temporal) effectActivity(ctx context.Context, a effectArgs) (*effectOutcome, error) {
	eff, err := t.effectOf(ctx, a.WorkflowID, a.Step, a.Index)
	if err != nil {
		t.log.Warn("reading an effect; retrying", "workflow_id", a.WorkflowID, "step", a.Step, "err", err)
		return nil, activityErr(err, true)
	}
	env := effectEnv{state: t.state, handlers: t.opts.Engine.Handlers, signal: t.signal, publish: t.publish}
	stop := heartbeat(ctx, t.opts.HeartbeatTimeout)
	applied, detail, err := applyEffect(ctx, env, a.WorkflowID, a.Agent, a.Key, eff)
	stop()
	if err != nil {
		t.log.Warn("effect failed; retrying", "workflow_id", a.WorkflowID, "effect", effectKind(eff), "key", a.Key, "err", err)
		return nil, activityErr(err, true)
	}
	typ := "orchestrator.effect.applied"
	if !applied {
		typ = "orchestrator.effect.not_applied"
		t.log.Warn("effect not applied", "workflow_id", a.WorkflowID, "agent", a.Agent, "effect", effectKind(eff), "key", a.Key, "detail", detail)
	}
	t.publish(lifecycle.Observable(lifecyclev1.EventSource_EVENT_SOURCE_ORCHESTRATOR, typ, a.WorkflowID, a.Agent, map[string]any{
		"dispatch_id": dispatchID(a.WorkflowID, a.Step), "effect": effectKind(eff), "idempotency_key": a.Key, "detail": detail,
	}))
	return &effectOutcome{Key: a.Key, Applied: applied, Detail: detail}, nil
}

// signal sends a signal to a workflow, keyed so that a repeat is a
// duplicate, and returns its sequence in that workflow.
func (t *Temporal) signal(ctx context.Context, workflowID string, payload []byte, key string) (uint64, bool, error) {
	if key == "" {
		var b [12]byte
		_, _ = rand.Read(b[:])
		key = "auto/" + hex.EncodeToString(b[:])
	} else if seq, err := t.signalSeq(ctx, workflowID, key); err != nil || seq != 0 {
		return seq, err == nil, err
	}
	if err := t.c.SignalWorkflow(ctx, workflowID, "", twSignal, twSignalIn{Key: key, Payload: payload}); err != nil {
		return 0, false, temporalErr(err, workflowID)
	}
	seq, err := t.signalSeq(ctx, workflowID, key)
	if err == nil && seq == 0 {
		err = fmt.Errorf("workflow %q did not record signal %q: %w", workflowID, key, errs.Internal)
	}
	return seq, false, err
}

// signalSeq asks a workflow for the sequence of the signal with key; 0
// when it has none.
func (t *Temporal) signalSeq(ctx context.Context, workflowID, key string) (uint64, error) {
	v, err := t.c.QueryWorkflow(ctx, workflowID, "", twQuerySigKey, key)
	if err != nil {
		return 0, queryErr(ctx, err, workflowID)
	}
	var seq uint64
	if err := v.Get(&seq); err != nil {
		return 0, fmt.Errorf("signal sequence of workflow %q: %v: %w", workflowID, err, errs.Internal)
	}
	return seq, nil
}

// queryErr maps a failed query. A query the SDK gave up on before the
// caller's deadline is UNAVAILABLE, which callers retry: Temporal sends
// queries to the worker that last ran the workflow, and after that
// worker died they wait out the sticky timeout before another answers.
func queryErr(ctx context.Context, err error, workflowID string) error {
	err = temporalErr(err, workflowID)
	if ctx.Err() == nil && errors.Is(err, errs.DeadlineExceeded) {
		return fmt.Errorf("workflow %q did not answer in time (its worker may have just stopped; another takes over within seconds): %w", workflowID, errs.Unavailable)
	}
	return err
}

// temporalErr maps a Temporal client error to the errs kinds.
func temporalErr(err error, workflowID string) error {
	var (
		missing  *serviceerror.NotFound
		started  *serviceerror.WorkflowExecutionAlreadyStarted
		unavail  *serviceerror.Unavailable
		qfail    *serviceerror.QueryFailed
		deadline *serviceerror.DeadlineExceeded
		canceled *serviceerror.Canceled
	)
	switch {
	case errors.As(err, &missing):
		if strings.Contains(err.Error(), "already completed") {
			return fmt.Errorf("workflow %q has ended; signals go to running workflows: %w", workflowID, errs.FailedPrecondition)
		}
		return notFound(workflowID)
	case errors.As(err, &started):
		return fmt.Errorf("workflow %q already exists: %w", workflowID, errs.AlreadyExists)
	case errors.As(err, &deadline), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%v: %w", err, errs.DeadlineExceeded)
	case errors.As(err, &canceled):
		return fmt.Errorf("%v: %w", err, errs.Canceled)
	case errors.As(err, &unavail):
		return fmt.Errorf("the Temporal service is unavailable: %v: %w", err, errs.Unavailable)
	case errors.As(err, &qfail):
		return fmt.Errorf("querying workflow %q: %v: %w", workflowID, err, errs.Internal)
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("%v: %w", err, errs.Canceled)
	}
	return errs.FromGRPC(err)
}
