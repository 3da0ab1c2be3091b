// Package temporal runs the orchestrator's workflows on Temporal: one
// Temporal workflow per Dispatch or StartWorkflow running the shared
// workflow (orchestrator.Run) through a Temporal orchestrator.Host,
// operator calls and effects as activities, signals as Temporal signals,
// queries as Temporal queries and CancelWorkflow as Temporal
// cancellation. Every orchestrator process runs a worker; any of them may
// run any workflow, and a workflow survives any of them dying.
package temporal

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/shopspring/decimal"
	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"google.golang.org/protobuf/proto"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/lifecycle"
	"github.com/secbear/neuron/services/orchestrator"
)

// Names registered with Temporal, error types and memo keys. They are
// stored in histories and visibility records: changing one breaks
// running workflows.
const (
	// WorkflowName is the Temporal workflow type of every orchestrator
	// workflow.
	WorkflowName   = twName
	twName         = "neuron.workflow"
	twCallActivity = "neuron.call"
	twEffActivity  = "neuron.effect"
	twSignal       = "neuron.signal"
	twCancelSignal = "neuron.cancel"
	twQueryResult  = "neuron.result"
	twQuerySigKey  = "neuron.signal_key"
	twQueryEvents  = "neuron.events"
	// errTypeOperator marks an operator failure that retrying cannot fix.
	errTypeOperator = "neuron.operator_failed"
	// errTypeRetryable marks one the agent's retry policy may fix; the
	// workflow retries it (Temporal does not, so that only operator
	// failures count against the agent's attempts).
	errTypeRetryable = "neuron.operator_retryable"
	// errTypeState marks a State failure of the call activity (reading or
	// keeping outputs); Temporal retries it for as long as the call may
	// run.
	errTypeState = "neuron.state_unavailable"
	// errTypeWorkflow is a workflow that failed; its details are a failure.
	errTypeWorkflow = "neuron.workflow_failed"
	// memo keys, read by List and Get without asking a worker.
	memoFingerprint = "fingerprint"
	memoRootAgent   = "root_agent"
	memoStatus      = "status"
	memoAgent       = "current_agent"
	memoSteps       = "steps"
	memoSpent       = "spent"
	memoBudget      = "budget"
	memoFailCode    = "failure_code"
	memoFailMessage = "failure_message"
	memoFailReason  = "failure_reason"
)

// stickyTimeout is how long a workflow task or query waits for the
// worker that last ran the workflow before any worker may take it.
const stickyTimeout = 2 * time.Second

// A Wait looks for a suspension (visible in the memo) first after
// suspendPoll, then less and less often, up to suspendPollMax; a
// completion arrives at once.
const (
	suspendPoll    = 100 * time.Millisecond
	suspendPollMax = 2 * time.Second
)

// cancelWait bounds how long Cancel waits to report the cancelled
// workflow.
const cancelWait = 5 * time.Second

// Defaults of Options.
const (
	DefaultTaskQueue        = "neuron"
	DefaultHeartbeatTimeout = 30 * time.Second
)

// Options configure the Temporal engine. Zero values take the defaults.
type Options struct {
	// TaskQueue the workers poll and workflows start on.
	TaskQueue string
	// HeartbeatTimeout is how soon a worker that died mid-call is noticed
	// and the call tried again elsewhere.
	HeartbeatTimeout time.Duration
	// Engine options apply as in every engine; CallTimeout bounds one
	// operator call attempt.
	Engine orchestrator.Options
}

// Engine is the Temporal orchestrator.Engine.
type Engine struct {
	c    client.Client
	deps orchestrator.Deps
	opts Options
	log  *slog.Logger
	w    worker.Worker
}

var (
	_ orchestrator.Engine  = (*Engine)(nil)
	_ orchestrator.RunEnds = (*Engine)(nil)
)

// New returns the Temporal engine over a connected client (nil for an
// engine that only replays histories). deps.State keeps operator outputs
// and receives memory effects; deps.Bus (optional) receives lifecycle
// events. Call StartWorker to run workflows in this process.
func New(c client.Client, deps orchestrator.Deps, opts Options) *Engine {
	if opts.TaskQueue == "" {
		opts.TaskQueue = DefaultTaskQueue
	}
	if opts.HeartbeatTimeout <= 0 {
		opts.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	opts.Engine = opts.Engine.WithDefaults()
	return &Engine{c: c, deps: deps, opts: opts, log: opts.Engine.Log}
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

// RegisterWorkflow registers the workflow (replaying needs only it).
func (e *Engine) RegisterWorkflow(r WorkflowRegistry) {
	r.RegisterWorkflowWithOptions(e.workflow, workflow.RegisterOptions{Name: twName})
}

// RegisterActivities registers the operator-call and effect activities.
func (e *Engine) RegisterActivities(r ActivityRegistry) {
	r.RegisterActivityWithOptions(e.callActivity, activity.RegisterOptions{Name: twCallActivity})
	r.RegisterActivityWithOptions(e.effectActivity, activity.RegisterOptions{Name: twEffActivity})
}

// StartWorker runs a worker on the task queue until Stop. (It is not
// named Start: that is orchestrator.Engine's method starting a workflow.)
func (e *Engine) StartWorker() error {
	// A short sticky timeout: after a worker dies, its workflows' tasks
	// and queries go to another worker this soon.
	e.w = worker.New(e.c, e.opts.TaskQueue, worker.Options{StickyScheduleToStartTimeout: stickyTimeout})
	e.RegisterWorkflow(e.w)
	e.RegisterActivities(e.w)
	if err := e.w.Start(); err != nil {
		return fmt.Errorf("starting the Temporal worker on task queue %q: %w", e.opts.TaskQueue, err)
	}
	return nil
}

// Stop stops the worker; workflows and activities in flight go on on
// another worker (or on this process's next start).
func (e *Engine) Stop() {
	if e.w != nil {
		e.w.Stop()
	}
}

// Close implements orchestrator.Engine: it stops the worker.
func (e *Engine) Close() { e.Stop() }

func (e *Engine) publish(ev *lifecyclev1.LifecycleEvent) {
	if e.deps.Bus != nil {
		e.deps.Bus.Publish(ev)
	}
}

// event publishes an orchestrator event.
func (e *Engine) event(workflowID, agentID, eventType string, data map[string]any) {
	e.publish(lifecycle.Observable(lifecyclev1.EventSource_EVENT_SOURCE_ORCHESTRATOR, eventType, workflowID, agentID, data))
}

// Start implements orchestrator.Engine.
func (e *Engine) Start(ctx context.Context, req *orchestrator.StartRequest) (string, bool, error) {
	agent, err := e.deps.Registry.Lookup(req.AgentID)
	if err != nil {
		return "", false, err
	}
	// The workflow's own span: its ids chosen now, carried in the
	// workflow's input (every step runs under it), reported once when
	// the workflow ends (host.End, never while replaying).
	trace := orchestrator.WorkflowTrace(ctx)
	spec, err := orchestrator.NewSpec(req, agent, e.opts.Engine, trace)
	if err != nil {
		return "", false, fmt.Errorf("input: %v: %w", err, errs.InvalidArgument)
	}
	args := twInput{RootAgent: spec.RootAgent, Detached: req.Detached, Input: spec.Input, Trace: spec.Trace,
		MaxDepth: spec.MaxDepth, MaxSteps: spec.MaxSteps, WarnFraction: spec.WarnFraction.String(), RootRevision: agent.Revision,
		AskLimits: spec.AskLimits}
	if spec.Budget.Valid {
		args.Budget = spec.Budget.Decimal.String()
	}
	if dl, ok := ctx.Deadline(); ok && !req.Detached {
		args.Deadline = dl
	}
	fp := req.Fingerprint()
	opts := client.StartWorkflowOptions{
		ID: req.WorkflowID, TaskQueue: e.opts.TaskQueue,
		WorkflowIDReusePolicy:                    enumspb.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
		WorkflowIDConflictPolicy:                 enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL,
		WorkflowExecutionErrorWhenAlreadyStarted: true,
		Memo: map[string]any{memoFingerprint: fp, memoRootAgent: agent.ID, memoBudget: args.Budget,
			memoStatus: statusName(orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING), memoAgent: agent.ID},
	}
	_, err = e.c.ExecuteWorkflow(context.WithoutCancel(ctx), opts, twName, args)
	var started *serviceerror.WorkflowExecutionAlreadyStarted
	if errors.As(err, &started) {
		d, err := e.c.DescribeWorkflowExecution(ctx, req.WorkflowID, "")
		if err != nil {
			return "", false, temporalErr(err, req.WorkflowID)
		}
		memo := memoOf(d.GetWorkflowExecutionInfo().GetMemo())
		if memo[memoFingerprint] != fp {
			return "", true, fmt.Errorf("workflow %q already exists with a different request (agent %q); use a new workflow_id: %w",
				req.WorkflowID, memo[memoRootAgent], errs.AlreadyExists)
		}
		return req.WorkflowID, true, nil
	}
	if err != nil {
		return "", false, temporalErr(err, req.WorkflowID)
	}
	return req.WorkflowID, false, nil
}

// memoOf decodes a workflow memo's string and number fields.
func memoOf(m *commonpb.Memo) map[string]any {
	out := map[string]any{}
	dc := converter.GetDefaultDataConverter()
	for k, p := range m.GetFields() {
		var v any
		if dc.FromPayload(p, &v) == nil {
			out[k] = v
		}
	}
	return out
}

// Wait implements orchestrator.Engine: it returns once the workflow has
// ended or its memo says it is SUSPENDED.
func (e *Engine) Wait(ctx context.Context, id string) (*orchestrator.Workflow, error) {
	done := make(chan error, 1)
	var res twResult
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { done <- e.c.GetWorkflow(wctx, id, "").Get(wctx, &res) }()
	poll := suspendPoll
	tick := time.NewTimer(poll)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err != nil {
				if ctx.Err() != nil || orchestrator.DeadlineNear(ctx) && isTemporalDeadline(err) {
					<-ctx.Done()
					return nil, context.Cause(ctx)
				}
				return ended(id, err)
			}
			return e.workflowOf(ctx, id, &res, true)
		case <-tick.C:
			poll = min(2*poll, suspendPollMax)
			tick.Reset(poll)
			d, err := e.c.DescribeWorkflowExecution(ctx, id, "")
			if err != nil {
				continue
			}
			info := d.GetWorkflowExecutionInfo()
			if info.GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING &&
				memoOf(info.GetMemo())[memoStatus] == statusName(orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED) {
				res, err := e.result(ctx, id)
				if err != nil {
					return nil, err
				}
				return e.workflowOf(ctx, id, res, true)
			}
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// isTemporalDeadline says whether the Temporal client gave up on the
// caller's deadline, which it may report a moment before ctx does.
func isTemporalDeadline(err error) bool {
	var d *serviceerror.DeadlineExceeded
	return errors.As(err, &d) || errors.Is(err, context.DeadlineExceeded)
}

// ended is the workflow a Temporal workflow that ended with err shows:
// FAILED or CANCELED with the failure it ended with. Errors that are not
// a workflow's end (the workflow does not exist, Temporal is away) are
// returned as errors.
func ended(id string, err error) (*orchestrator.Workflow, error) {
	var (
		app        *temporal.ApplicationError
		canceled   *temporal.CanceledError
		terminated *temporal.TerminatedError
		timeout    *temporal.TimeoutError
	)
	wf := &orchestrator.Workflow{ID: id, Status: orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED}
	switch {
	case errors.As(err, &app) && app.Type() == errTypeWorkflow:
		var f failure
		if app.Details(&f) != nil {
			f = failure{Code: int32(errs.Code(errs.Internal)), Message: app.Message()}
		}
		wf.Failure = f.port()
	case errors.As(err, &canceled), errors.As(err, &terminated), errors.As(err, &timeout):
		wf.Failure = orchestrator.FailureOf(workflowErr(err, id))
		if canceled != nil {
			wf.Status = orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED
		}
	default:
		return nil, workflowErr(err, id)
	}
	return wf, nil
}

// workflowErr converts a failed workflow's error to the status it ended
// with.
func workflowErr(err error, id string) error {
	var app *temporal.ApplicationError
	if errors.As(err, &app) && app.Type() == errTypeWorkflow {
		var f failure
		if app.Details(&f) == nil {
			return f.err()
		}
	}
	var canceled *temporal.CanceledError
	if errors.As(err, &canceled) {
		reason := "cancelled"
		var r string
		if canceled.HasDetails() && canceled.Details(&r) == nil && r != "" {
			reason = r
		}
		return fmt.Errorf("workflow %q was cancelled: %s: %w", id, reason, errs.Canceled)
	}
	var terminated *temporal.TerminatedError
	if errors.As(err, &terminated) {
		return fmt.Errorf("workflow %q was terminated through Temporal: %w", id, errs.FailedPrecondition)
	}
	var timeout *temporal.TimeoutError
	if errors.As(err, &timeout) {
		return fmt.Errorf("workflow %q timed out in Temporal: %w", id, errs.DeadlineExceeded)
	}
	return temporalErr(err, id)
}

// result asks a workflow for its view of itself.
func (e *Engine) result(ctx context.Context, id string) (*twResult, error) {
	v, err := e.query(ctx, id, twQueryResult)
	if err != nil {
		return nil, err
	}
	var res twResult
	if err := v.Get(&res); err != nil {
		return nil, fmt.Errorf("the view of workflow %q: %v: %w", id, err, errs.Internal)
	}
	return &res, nil
}

// workflowOf is the workflow as its own view shows it, with its last
// output read from State and, with effects, the outcome of every effect
// of every step in step order.
func (e *Engine) workflowOf(ctx context.Context, id string, res *twResult, effects bool) (*orchestrator.Workflow, error) {
	wf := &orchestrator.Workflow{ID: id, Status: statusOf(res.Status), RootAgent: res.RootAgent, CurrentAgent: res.CurrentAgent,
		Steps: res.Steps, Budget: budgetOf(res.Budget), Failure: res.Failure.port(), Pending: res.Pending, MaxSteps: res.MaxSteps}
	if wf.Status == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED {
		wf.Asking = res.Asking
	}
	wf.Spent, _ = decimal.NewFromString(res.Spent)
	if res.LastStep != 0 {
		out, err := mustOutput(ctx, e.deps.State, id, res.LastStep)
		if err != nil {
			return nil, err
		}
		wf.LastOutput = out
	}
	if !effects {
		return wf, nil
	}
	for _, st := range res.StepList {
		for _, key := range st.Effects {
			o := &orchestratorv1.EffectOutcome{IdempotencyKey: key, Detail: orchestrator.NotExecuted}
			if r, ok := res.Outcomes[key]; ok {
				o.Applied, o.Detail = r.Applied, r.Detail
			}
			wf.Effects = append(wf.Effects, o)
		}
	}
	return wf, nil
}

// statusName is a status as the workflow's view and memo store it.
func statusName(s orchestratorv1.WorkflowStatus) string { return orchestrator.StatusName(s) }

// statusOf parses a stored status name; unknown names are RUNNING.
func statusOf(name string) orchestratorv1.WorkflowStatus {
	if v, ok := orchestratorv1.WorkflowStatus_value["WORKFLOW_STATUS_"+name]; ok {
		return orchestratorv1.WorkflowStatus(v)
	}
	return orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING
}

func budgetOf(s string) decimal.NullDecimal {
	if s == "" {
		return decimal.NullDecimal{}
	}
	d, err := decimal.NewFromString(s)
	if err != nil {
		return decimal.NullDecimal{}
	}
	return decimal.NewNullDecimal(d)
}

// Signal implements orchestrator.Engine.
func (e *Engine) Signal(ctx context.Context, id string, payload []byte, key string) (uint64, bool, error) {
	seq, dup, err := e.signal(ctx, id, payload, key)
	if err != nil {
		return 0, false, err
	}
	if !dup {
		e.event(id, "", "orchestrator.signal.accepted", map[string]any{"sequence": seq, "signal_type": orchestrator.SignalType(payload)})
	}
	return seq, dup, nil
}

// signal sends a signal to a workflow, keyed so that a repeat is a
// duplicate, and returns its sequence in that workflow.
func (e *Engine) signal(ctx context.Context, id string, payload []byte, key string) (uint64, bool, error) {
	if key == "" {
		key = "auto/" + randomHex(12)
	} else if seq, err := e.signalSeq(ctx, id, key); err != nil || seq != 0 {
		return seq, err == nil, err
	}
	if err := e.c.SignalWorkflow(ctx, id, "", twSignal, twSignalIn{Key: key, Payload: payload}); err != nil {
		return 0, false, temporalErr(err, id)
	}
	seq, err := e.signalSeq(ctx, id, key)
	if err == nil && seq == 0 {
		err = fmt.Errorf("workflow %q did not record signal %q: %w", id, key, errs.Internal)
	}
	return seq, false, err
}

// signalSeq asks a workflow for the sequence of the signal with key; 0
// when it has none.
func (e *Engine) signalSeq(ctx context.Context, id, key string) (uint64, error) {
	v, err := e.query(ctx, id, twQuerySigKey, key)
	if err != nil {
		return 0, err
	}
	var seq uint64
	if err := v.Get(&seq); err != nil {
		return 0, fmt.Errorf("signal sequence of workflow %q: %v: %w", id, err, errs.Internal)
	}
	return seq, nil
}

// Get implements orchestrator.Engine.
func (e *Engine) Get(ctx context.Context, id string) (*orchestrator.Workflow, error) {
	_, wf, err := e.view(ctx, id)
	return wf, err
}

// view is a workflow as the service shows it: its own view, corrected
// by Temporal's status when it ended outside the workflow's code.
func (e *Engine) view(ctx context.Context, id string) (*twResult, *orchestrator.Workflow, error) {
	d, err := e.c.DescribeWorkflowExecution(ctx, id, "")
	if err != nil {
		return nil, nil, temporalErr(err, id)
	}
	info := d.GetWorkflowExecutionInfo()
	res, err := e.result(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	wf, err := e.workflowOf(ctx, id, res, false)
	if err != nil {
		return nil, nil, err
	}
	memo := memoOf(info.GetMemo())
	listed := listedOf(id, info.GetStatus(), memo, info.GetStartTime().AsTime(), info.GetCloseTime().AsTime())
	wf.Status = statusFrom(info.GetStatus(), res.Status)
	wf.RootAgent, wf.Budget, wf.Created, wf.Updated = listed.RootAgent, listed.Budget, listed.Created, listed.Updated
	if wf.Failure == nil && orchestrator.Terminal(wf.Status) && wf.Status != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED {
		wf.Failure = listed.Failure
		if wf.Failure == nil {
			wf.Failure = &orchestrator.Failure{Code: int32(errs.Code(errs.FailedPrecondition)), Message: "ended in Temporal as " + info.GetStatus().String()}
		}
	}
	return res, wf, nil
}

// statusFrom is the workflow's status: its own while Temporal runs it,
// Temporal's once it ended.
func statusFrom(s enumspb.WorkflowExecutionStatus, own string) orchestratorv1.WorkflowStatus {
	switch s {
	case enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED:
		return orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED
	case enumspb.WORKFLOW_EXECUTION_STATUS_CANCELED:
		return orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED
	case enumspb.WORKFLOW_EXECUTION_STATUS_FAILED, enumspb.WORKFLOW_EXECUTION_STATUS_TERMINATED, enumspb.WORKFLOW_EXECUTION_STATUS_TIMED_OUT:
		return orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED
	}
	if own == statusName(orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED) {
		return orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED
	}
	return orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING
}

// listedOf is a workflow as Temporal's visibility store shows it: its
// memo (as of its last step) and Temporal's status and times.
func listedOf(id string, s enumspb.WorkflowExecutionStatus, memo map[string]any, created, closed time.Time) *orchestrator.Workflow {
	str := func(k string) string { v, _ := memo[k].(string); return v }
	wf := &orchestrator.Workflow{ID: id, RootAgent: str(memoRootAgent), CurrentAgent: str(memoAgent), Created: created, Updated: created,
		Status: statusFrom(s, str(memoStatus)), Budget: budgetOf(str(memoBudget))}
	if !closed.IsZero() && closed.Unix() > 0 {
		wf.Updated = closed
	}
	if n, ok := memo[memoSteps].(float64); ok {
		wf.Steps = uint32(n)
	}
	wf.Spent, _ = decimal.NewFromString(str(memoSpent))
	if code, ok := memo[memoFailCode].(float64); ok && wf.Status == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED {
		wf.Failure = &orchestrator.Failure{Code: int32(code), Message: str(memoFailMessage), Reason: str(memoFailReason)}
	}
	return wf
}

// Steps implements orchestrator.Engine.
func (e *Engine) Steps(ctx context.Context, id string) ([]orchestrator.StepView, error) {
	res, err := e.result(ctx, id)
	if err != nil {
		return nil, err
	}
	list := make([]orchestrator.StepView, 0, len(res.StepList))
	for _, st := range res.StepList {
		list = append(list, orchestrator.StepView{N: st.N, Dispatch: st.Dispatch, Agent: st.Agent, Depth: st.Depth, Trigger: st.Trigger,
			Started: st.Started, State: st.State, Error: st.Error, Exit: st.Exit, Cost: st.Cost, Effects: len(st.Effects), Signals: st.Signals})
	}
	return list, nil
}

// Signals implements orchestrator.Engine.
func (e *Engine) Signals(ctx context.Context, id string) ([]orchestrator.SignalView, error) {
	res, err := e.result(ctx, id)
	if err != nil {
		return nil, err
	}
	list := make([]orchestrator.SignalView, 0, len(res.Signals))
	for _, s := range res.Signals {
		list = append(list, orchestrator.SignalView{Seq: s.Seq, Payload: s.Payload, Step: s.Step})
	}
	return list, nil
}

// Events implements orchestrator.Engine from the event log the workflow
// keeps (query neuron.events): the same on every worker, since the
// workflow rebuilds it as it replays. The log has ended once Temporal
// closed the workflow and every event was returned.
func (e *Engine) Events(ctx context.Context, id string, after uint64) ([]*lifecyclev1.LifecycleEvent, bool, error) {
	// Describe first: a workflow closed by then has its whole log in the
	// answer to the query.
	d, err := e.c.DescribeWorkflowExecution(ctx, id, "")
	if err != nil {
		return nil, false, temporalErr(err, id)
	}
	closed := d.GetWorkflowExecutionInfo().GetStatus() != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING
	v, err := e.query(ctx, id, twQueryEvents, after)
	if err != nil {
		return nil, false, err
	}
	var raw [][]byte
	if err := v.Get(&raw); err != nil {
		return nil, false, fmt.Errorf("the event log of workflow %q: %v: %w", id, err, errs.Internal)
	}
	evs := make([]*lifecyclev1.LifecycleEvent, 0, len(raw))
	for _, b := range raw {
		ev := &lifecyclev1.LifecycleEvent{}
		if err := proto.Unmarshal(b, ev); err != nil {
			return nil, false, fmt.Errorf("the event log of workflow %q: %v: %w", id, err, errs.Internal)
		}
		evs = append(evs, ev)
	}
	return evs, closed && len(evs) < maxEventsPage, nil
}

// RunEnd implements orchestrator.RunEnds: the channel is closed once
// Temporal has closed the workflow (a long poll of its result, ended
// with ctx). A poll that fails while the workflow still runs leaves it
// open: the watcher's own looks find the end then.
func (e *Engine) RunEnd(ctx context.Context, id string) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		err := e.c.GetWorkflow(ctx, id, "").Get(ctx, nil)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			d, derr := e.c.DescribeWorkflowExecution(ctx, id, "")
			if derr != nil || d.GetWorkflowExecutionInfo().GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
				return
			}
		}
		close(done)
	}()
	return done
}

// cancel asks Temporal to cancel a workflow, telling it why first.
func (e *Engine) cancel(ctx context.Context, id, reason string) error {
	if err := e.c.SignalWorkflow(ctx, id, "", twCancelSignal, reason); err != nil {
		return temporalErr(err, id)
	}
	if err := e.c.CancelWorkflow(ctx, id, ""); err != nil {
		return temporalErr(err, id)
	}
	return nil
}

// Cancel implements orchestrator.Engine. It reports the workflow once it
// has stopped, if that is soon; otherwise as CANCELED already, which
// Temporal makes it.
func (e *Engine) Cancel(ctx context.Context, id, reason string) (*orchestrator.Workflow, error) {
	d, err := e.c.DescribeWorkflowExecution(ctx, id, "")
	if err != nil {
		return nil, temporalErr(err, id)
	}
	if d.GetWorkflowExecutionInfo().GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
		if err := e.cancel(ctx, id, reason); err != nil && !errors.Is(err, errs.FailedPrecondition) {
			return nil, err
		}
		wctx, stop := context.WithTimeout(ctx, cancelWait)
		_ = e.c.GetWorkflow(wctx, id, "").Get(wctx, nil)
		stop()
	}
	_, wf, err := e.view(ctx, id)
	if err != nil {
		return nil, err
	}
	if !orchestrator.Terminal(wf.Status) {
		// The worker has not acted on it yet; Temporal will.
		wf.Status = orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED
		wf.Failure = &orchestrator.Failure{Code: int32(errs.Code(errs.Canceled)), Message: reason}
	}
	return wf, nil
}

// errBadToken is a page token Temporal does not take.
var errBadToken = fmt.Errorf("page_token is not one this orchestrator issued for this status filter (or it expired); start again without one: %w", errs.InvalidArgument)

// List implements orchestrator.Engine from Temporal's visibility store:
// in its order, with each workflow's memo (status, agent, steps, spent
// as of its last step; the failure of a failed one). RUNNING and
// SUSPENDED are both Temporal's Running, told apart by the memo, so
// their pages may hold fewer than size workflows.
func (e *Engine) List(ctx context.Context, want orchestratorv1.WorkflowStatus, size int, pageToken string) ([]*orchestrator.Workflow, string, error) {
	// A page token is the status it lists, then Temporal's token.
	var token []byte
	if pageToken != "" {
		raw, err := base64.RawURLEncoding.DecodeString(pageToken)
		// Only the token as issued: the decoder skips line breaks.
		if err != nil || base64.RawURLEncoding.EncodeToString(raw) != pageToken || len(raw) < 2 || orchestratorv1.WorkflowStatus(raw[0]) != want {
			return nil, "", errBadToken
		}
		token = raw[1:]
	}
	q := fmt.Sprintf("WorkflowType = '%s'", twName)
	switch want {
	case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_UNSPECIFIED:
	case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED:
		q += " AND ExecutionStatus = 'Running'"
	case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED:
		q += " AND ExecutionStatus = 'Completed'"
	case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED:
		q += " AND ExecutionStatus = 'Canceled'"
	case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED:
		q += " AND ExecutionStatus IN ('Failed', 'Terminated', 'TimedOut')"
	default:
		return nil, "", fmt.Errorf("status %v is not a workflow status: %w", want, errs.InvalidArgument)
	}
	resp, err := e.c.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{PageSize: int32(size), NextPageToken: token, Query: q})
	if err != nil {
		var invalid *serviceerror.InvalidArgument
		var internal *serviceerror.Internal
		if token != nil && (errors.As(err, &invalid) || errors.As(err, &internal)) {
			return nil, "", errBadToken
		}
		return nil, "", temporalErr(err, "")
	}
	var next string
	if len(resp.GetNextPageToken()) > 0 {
		next = base64.RawURLEncoding.EncodeToString(append([]byte{byte(want)}, resp.GetNextPageToken()...))
	}
	var out []*orchestrator.Workflow
	for _, x := range resp.GetExecutions() {
		wf := listedOf(x.GetExecution().GetWorkflowId(), x.GetStatus(), memoOf(x.GetMemo()), x.GetStartTime().AsTime(), x.GetCloseTime().AsTime())
		if want != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_UNSPECIFIED && wf.Status != want {
			continue
		}
		out = append(out, wf)
	}
	return out, next, nil
}

// queryAttempts bounds how often a query that timed out is asked again.
const queryAttempts = 4

// query asks a workflow a query. Temporal sends a query to the worker
// that last ran the workflow and, after that worker stopped, waits out
// the sticky timeout before another worker answers (replaying the
// workflow first): on a loaded machine the SDK's own deadline can pass
// in between. A query changes nothing, so one that timed out is asked
// again while the caller's context allows. One that still did not
// answer is UNAVAILABLE, which callers retry.
func (e *Engine) query(ctx context.Context, id, name string, args ...any) (converter.EncodedValue, error) {
	// Keep a fifth of the caller's time (at most a second) to answer
	// UNAVAILABLE, which the caller retries, rather than let its deadline
	// pass in a query that is still waiting for a worker.
	qctx := ctx
	if dl, ok := ctx.Deadline(); ok {
		margin := min(time.Until(dl)/5, time.Second)
		var cancel context.CancelFunc
		qctx, cancel = context.WithDeadline(ctx, dl.Add(-margin))
		defer cancel()
	}
	var err error
	for attempt := 0; attempt < queryAttempts; attempt++ {
		var v converter.EncodedValue
		v, err = e.c.QueryWorkflow(qctx, id, "", name, args...)
		if err == nil {
			return v, nil
		}
		err = temporalErr(err, id)
		if ctx.Err() != nil {
			return nil, err
		}
		if qctx.Err() != nil || !errors.Is(err, errs.DeadlineExceeded) {
			break
		}
	}
	if qctx.Err() == nil && !errors.Is(err, errs.DeadlineExceeded) {
		return nil, err
	}
	return nil, fmt.Errorf("workflow %q did not answer in time (its worker may have just stopped; another takes over within seconds): %w", id, errs.Unavailable)
}

// temporalErr maps a Temporal client error to the errs kinds.
func temporalErr(err error, id string) error {
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
			return fmt.Errorf("workflow %q has ended; signals go to running workflows: %w", id, errs.FailedPrecondition)
		}
		return fmt.Errorf("workflow %q does not exist: %w", id, errs.NotFound)
	case errors.As(err, &started):
		return fmt.Errorf("workflow %q already exists: %w", id, errs.AlreadyExists)
	case errors.As(err, &deadline), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%v: %w", err, errs.DeadlineExceeded)
	case errors.As(err, &canceled):
		return fmt.Errorf("%v: %w", err, errs.Canceled)
	case errors.As(err, &unavail):
		return fmt.Errorf("the Temporal service is unavailable: %v: %w", err, errs.Unavailable)
	case errors.As(err, &qfail):
		return fmt.Errorf("querying workflow %q: %v: %w", id, err, errs.Internal)
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("%v: %w", err, errs.Canceled)
	}
	return errs.FromGRPC(err)
}
