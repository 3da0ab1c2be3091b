package orchestrator

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/shopspring/decimal"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/lifecycle"
	"github.com/secbear/neuron/pkg/money"
)

// A workflow is plain Go code replayed against the journal: every operator
// call is step n (counted in execution order, which is deterministic),
// and a step whose result is journaled is not called again; every effect
// has a journaled outcome and is not executed again. After a restart the
// code runs from the top, fast-forwarding through what is journaled, and
// continues live from the first step without a result.

// runner is one execution of a workflow.
type runner struct {
	e      *Engine
	id     string
	rec    *record
	n      uint64 // steps begun
	spent  decimal.Decimal
	warned bool
	models map[string]string // downgraded models by agent
	corr   string
	// callCtx bounds operator calls (the Dispatch caller's deadline);
	// effects run under the workflow's own context.
	callCtx context.Context
}

// frame is one agent's place in the workflow.
type frame struct {
	agent  *Agent
	depth  uint32
	chain  []string // delegation ancestry, root first, this agent last
	parent string   // the dispatch that caused this one
	cause  string   // the effect that caused it
}

// agentError is an operator call that failed for good (after retries).
// A delegating parent is told about it; at the root it fails the workflow.
type agentError struct {
	agent string
	err   error
}

func (e *agentError) Error() string { return fmt.Sprintf("agent %q: %v", e.agent, e.err) }
func (e *agentError) Unwrap() error { return e.err }

// execute runs workflow id until it ends, suspends or its context ends.
func (e *Engine) execute(ctx context.Context, id string) {
	rec, err := e.j.Get(id)
	if err != nil {
		e.log.Error("workflow vanished from the journal", "workflow_id", id, "err", err)
		return
	}
	if rec.Status != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING {
		return
	}
	callCtx := ctx
	if !rec.Deadline.IsZero() {
		var cancel context.CancelFunc
		callCtx, cancel = context.WithDeadline(ctx, rec.Deadline)
		defer cancel()
	}
	w := &runner{e: e, id: id, rec: rec, models: map[string]string{}, callCtx: callCtx}
	root := &operatorv1.OperatorInput{}
	if err := proto.Unmarshal(rec.Input, root); err != nil {
		w.fail(ctx, fmt.Errorf("the journaled input is corrupt: %v: %w", err, errs.Internal))
		return
	}
	w.corr = root.GetDispatch().GetCorrelationId()
	if w.corr == "" {
		w.corr = id
	}
	agent, err := e.reg.Lookup(rec.RootAgent)
	if err != nil {
		w.fail(ctx, err)
		return
	}
	out, err := w.agent(ctx, frame{agent: agent, chain: []string{agent.ID}, cause: root.GetDispatch().GetCausationId()}, root, true)
	if err != nil {
		w.fail(ctx, err)
		return
	}
	rec, _ = e.j.Get(id)
	if rec != nil {
		kind := "orchestrator.workflow.completed"
		if rec.Status == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED {
			kind = "orchestrator.workflow.suspended"
		}
		e.event(id, rec.CurrentAgent, kind, map[string]any{
			"steps": rec.Steps, "spent": rec.Spent.String(), "exit": out.GetExitReason().GetKind().String(),
		})
	}
}

// fail ends the workflow for err, unless it was stopped on purpose.
func (w *runner) fail(ctx context.Context, err error) {
	cause := context.Cause(ctx)
	var cancelled *canceledError
	switch {
	case errors.Is(cause, errShutdown):
		w.e.log.Info("workflow paused for shutdown", "workflow_id", w.id, "steps", w.n)
		return
	case errors.As(cause, &cancelled):
		return // CancelWorkflow recorded it
	}
	f := toFailure(err)
	if errors.Is(cause, errCallerLeft) {
		f = &failure{Code: int32(errs.Code(errs.Canceled)), Message: "the Dispatch caller cancelled the call"}
	} else if errors.Is(err, context.DeadlineExceeded) || errs.Code(err) == errs.Code(errs.DeadlineExceeded) {
		f = &failure{Code: int32(errs.Code(errs.DeadlineExceeded)), Message: fmt.Sprintf("the Dispatch caller's deadline passed during step %d", w.n)}
	}
	status := orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED
	if f.Code == int32(errs.Code(errs.Canceled)) {
		status = orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED
	}
	rec, uerr := w.e.j.Update(w.id, func(r *record) error {
		if r.terminal() {
			return errNoChange
		}
		r.Status, r.Failure = status, f
		return nil
	})
	if uerr != nil {
		w.e.log.Error("could not record the workflow's failure", "workflow_id", w.id, "err", uerr)
		return
	}
	w.e.log.Warn("workflow failed", "workflow_id", w.id, "code", f.Code, "reason", f.Reason, "error", f.Message)
	w.e.event(w.id, rec.CurrentAgent, "orchestrator.workflow."+strings.ToLower(statusName(status)), map[string]any{
		"code": f.Code, "message": f.Message, "reason": f.Reason,
	})
}

func toFailure(err error) *failure {
	st := errs.ToStatus(err)
	return &failure{Code: int32(st.Code()), Message: st.Message(), Reason: errs.Reason(err)}
}

func (f *failure) err() error {
	st := &typesv1.Status{Code: f.Code, Message: f.Message, Reason: f.Reason}
	return errs.FromGRPC(statusErr(st))
}

// agent runs one agent to its end: its operator calls, their effects,
// re-invocations with delegation results and handoffs. root marks the
// workflow's top level, where signals keep the workflow going and the
// end is recorded.
func (w *runner) agent(ctx context.Context, f frame, in *operatorv1.OperatorInput, root bool) (*operatorv1.OperatorOutput, error) {
	session := in.SessionId
	for {
		out, dispatchID, halt, err := w.step(ctx, f, in)
		if err != nil {
			return nil, err
		}
		results, handoff, err := w.effects(ctx, f, dispatchID, out, halt)
		if err != nil {
			return nil, err
		}
		if halt != nil {
			return nil, halt
		}
		if handoff != nil {
			next, err := w.e.reg.Lookup(handoff.target)
			if err != nil {
				return nil, err // checked when the handoff was recorded; the registry changed since
			}
			chain := append(append([]string(nil), f.chain[:len(f.chain)-1]...), next.ID)
			f = frame{agent: next, depth: f.depth, chain: chain, parent: dispatchID, cause: handoff.key}
			in = handoffInput(session, handoff, results)
			continue
		}
		if len(results) > 0 {
			f.parent, f.cause = dispatchID, ""
			in = resultsInput(session, results)
			continue
		}
		if !root {
			return out, nil
		}
		suspended := out.GetExitReason().GetKind() == operatorv1.ExitKind_EXIT_KIND_SUSPENDED
		more, err := w.end(suspended)
		if err != nil || !more {
			return out, err
		}
		// Signals arrived: the current agent gets them.
		f.parent, f.cause = dispatchID, ""
		in = &operatorv1.OperatorInput{Trigger: operatorv1.TriggerType_TRIGGER_TYPE_SIGNAL, Message: &typesv1.Content{}, SessionId: session}
		if suspended {
			in.Resume = &operatorv1.Resume{ResumeToken: out.GetExitReason().GetSuspension().GetResumeToken()}
		}
	}
}

// end records the workflow's end (COMPLETED, or SUSPENDED waiting for a
// signal) unless signals are pending or the next step is journaled, in
// which case it returns more=true and the workflow goes on.
func (w *runner) end(suspended bool) (more bool, err error) {
	status := orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED
	if suspended {
		status = orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED
	}
	more, err = w.e.j.EndUnlessMore(w.id, w.n+1, status)
	if errors.Is(err, errAlreadyEnded) {
		return false, nil
	}
	return more, err
}

// dispatchID names step n of the workflow.
func dispatchID(workflowID string, n uint64) string {
	id := fmt.Sprintf("%s#%d", workflowID, n)
	if len(id) > 256 {
		sum := sha256.Sum256([]byte(workflowID))
		id = fmt.Sprintf("wf-%s#%d", hex.EncodeToString(sum[:16]), n)
	}
	return id
}

// step makes (or replays) the next operator call. halt is set when the
// budget policy ends the workflow after this call (its effects are still
// executed, except dispatches).
func (w *runner) step(ctx context.Context, f frame, planned *operatorv1.OperatorInput) (out *operatorv1.OperatorOutput, id string, halt error, err error) {
	w.n++
	n := w.n
	if n > w.e.opts.MaxSteps {
		return nil, "", nil, fmt.Errorf("the workflow reached its limit of %d operator calls (agents may be handing off or delegating in a loop): %w",
			w.e.opts.MaxSteps, errs.FailedPrecondition)
	}
	id = dispatchID(w.id, n)
	st, _, err := w.e.j.BeginStep(w.id, n, func(r *record, pending []*signalRecord) (*stepRecord, error) {
		in, seqs := w.prepare(f, planned, id, pending)
		b, err := proto.Marshal(in)
		if err != nil {
			return nil, err
		}
		return &stepRecord{Agent: f.agent.ID, Input: b, Signals: seqs, Started: time.Now()}, nil
	})
	if err != nil {
		return nil, id, nil, err
	}
	if st.Agent != f.agent.ID {
		return nil, id, nil, fmt.Errorf("journal mismatch at step %d: recorded agent %q, replay reached %q (was the agent registry changed under a running workflow?): %w",
			n, st.Agent, f.agent.ID, errs.Internal)
	}
	live := false // events go out for calls made now, not for replayed ones
	switch {
	case st.Error != nil:
		return nil, id, nil, &agentError{agent: f.agent.ID, err: st.Error.err()}
	case st.Output != nil:
		out = &operatorv1.OperatorOutput{}
		if err := proto.Unmarshal(st.Output, out); err != nil {
			return nil, id, nil, fmt.Errorf("journaled output of step %d is corrupt: %v: %w", n, err, errs.Internal)
		}
	default:
		in := &operatorv1.OperatorInput{}
		if err := proto.Unmarshal(st.Input, in); err != nil {
			return nil, id, nil, fmt.Errorf("journaled input of step %d is corrupt: %v: %w", n, err, errs.Internal)
		}
		started := time.Now()
		out, err = w.call(ctx, f.agent, in)
		if err != nil {
			if ctx.Err() != nil || w.callCtx.Err() != nil {
				return nil, id, nil, err // stopped, not failed: a resume calls again
			}
			st.Error = toFailure(err)
			if jerr := w.e.j.FinishStep(w.id, n, st, func(*record) {}); jerr != nil {
				return nil, id, nil, jerr
			}
			w.e.event(w.id, f.agent.ID, "orchestrator.dispatch.failed", map[string]any{
				"dispatch_id": id, "code": st.Error.Code, "message": st.Error.Message, "reason": st.Error.Reason,
			})
			return nil, id, nil, &agentError{agent: f.agent.ID, err: err}
		}
		if st.Output, err = proto.Marshal(out); err != nil {
			return nil, id, nil, err
		}
		cost := outputCost(out)
		err = w.e.j.FinishStep(w.id, n, st, func(r *record) {
			r.Steps++
			r.Spent = w.spent.Add(cost)
			r.LastOutput = st.Output
			r.CurrentAgent = f.agent.ID
		})
		if err != nil {
			return nil, id, nil, err
		}
		live = true
		w.e.event(w.id, f.agent.ID, "orchestrator.dispatch.completed", map[string]any{
			"dispatch_id": id, "exit": out.GetExitReason().GetKind().String(), "cost": cost.String(),
			"duration_ms": time.Since(started).Milliseconds(), "effects": len(out.GetEffects()), "signals": st.Signals,
		})
	}
	cost := outputCost(out)
	w.spent = w.spent.Add(cost)
	halt = w.budget(f, cost, live)
	return out, id, halt, nil
}

func outputCost(out *operatorv1.OperatorOutput) decimal.Decimal {
	c, err := money.Parse(out.GetMetadata().GetCost())
	if err != nil || c.IsNegative() {
		return decimal.Zero
	}
	return c
}

// prepare builds the input of a new step: the agent's defaults, the
// budget policy's model, the dispatch context and any pending signals.
func (w *runner) prepare(f frame, planned *operatorv1.OperatorInput, id string, pending []*signalRecord) (*operatorv1.OperatorInput, []uint64) {
	model, downgraded := w.models[f.agent.ID]
	return prepareInput(f.agent, planned, model, downgraded, &operatorv1.DispatchContext{
		DispatchId: id, WorkflowId: w.id, AgentId: f.agent.ID, ParentDispatchId: f.parent,
		CausationId: f.cause, CorrelationId: w.corr, Depth: f.depth, TraceContext: w.rec.Trace,
	}, pending)
}

// prepareInput applies the agent's defaults to planned, the model the
// budget policy chose (when downgraded), the dispatch context, and folds
// the pending signals in (trigger SIGNAL, a text block and a metadata
// entry per signal, the first one's data as a suspension's decision).
// It returns the input and the delivered signals' sequences.
func prepareInput(agent *Agent, planned *operatorv1.OperatorInput, model string, downgraded bool, dc *operatorv1.DispatchContext, pending []*signalRecord) (*operatorv1.OperatorInput, []uint64) {
	in := agent.Apply(planned)
	if downgraded {
		if in.Config == nil {
			in.Config = &operatorv1.OperatorConfig{}
		}
		in.Config.Model = &model
	}
	in.Dispatch = dc
	if len(pending) == 0 {
		return in, nil
	}
	if in.Message == nil {
		in.Message = &typesv1.Content{}
	}
	seqs := make([]uint64, 0, len(pending))
	list := make([]any, 0, len(pending))
	for _, s := range pending {
		p := &typesv1.SignalPayload{}
		_ = proto.Unmarshal(s.Payload, p)
		data, _ := protojson.Marshal(p.GetData())
		if p.GetData() == nil {
			data = []byte("null")
		}
		in.Message.Blocks = append(in.Message.Blocks, content.TextBlock(fmt.Sprintf("[signal %s #%d] %s", p.GetSignalType(), s.Seq, data)))
		var v any
		_ = json.Unmarshal(data, &v)
		list = append(list, map[string]any{"sequence": float64(s.Seq), "signal_type": p.GetSignalType(), "data": v})
		seqs = append(seqs, s.Seq)
		if in.Resume != nil && in.Resume.Decision == nil {
			in.Resume.Decision = p.GetData()
		}
	}
	in.Trigger = operatorv1.TriggerType_TRIGGER_TYPE_SIGNAL
	in.CustomTrigger = ""
	if in.Metadata == nil {
		in.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{}}
	}
	if v, err := structpb.NewValue(list); err == nil {
		in.Metadata.Fields["signals"] = v
	}
	return in, seqs
}

// call runs the operator, retrying retryable failures per the agent's
// policy.
func (w *runner) call(ctx context.Context, agent *Agent, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
	max := agent.Retry.MaxAttempts
	if max <= 0 {
		max = 3
	}
	for attempt := 1; ; attempt++ {
		cctx := withBudget(w.callCtx, w.remaining())
		out, err := w.e.caller.Call(cctx, agent, in)
		if err == nil {
			return out, nil
		}
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		if w.callCtx.Err() != nil {
			return nil, fmt.Errorf("%v: %w", w.callCtx.Err(), errs.DeadlineExceeded)
		}
		if !retryable(err) || attempt >= max {
			if attempt > 1 {
				err = fmt.Errorf("after %d attempts: %w", attempt, err)
			}
			return nil, err
		}
		d := agent.Retry.Backoff(attempt, rand.Float64)
		w.e.log.Warn("operator call failed; retrying", "workflow_id", w.id, "agent", agent.ID,
			"attempt", attempt, "backoff", d.String(), "err", err)
		if err := w.e.opts.Sleep(w.callCtx, d); err != nil {
			return nil, err
		}
	}
}

// retryable says whether a retry may fix an operator failure.
func retryable(err error) bool {
	if errs.Reason(err) == errs.ReasonRetryable {
		return true
	}
	switch errs.Code(err) {
	case codes.Unavailable, codes.Aborted:
		return true
	}
	return false
}

// remaining is the workflow budget left, invalid when there is none.
func (w *runner) remaining() decimal.NullDecimal {
	if !w.rec.Budget.Valid {
		return decimal.NullDecimal{}
	}
	return decimal.NewNullDecimal(w.rec.Budget.Decimal.Sub(w.spent))
}

// budget reports the call's cost, warns as the budget nears its end, and
// asks the policy what to do. live is false while replaying (events were
// sent the first time). It returns an error when the policy halts.
func (w *runner) budget(f frame, cost decimal.Decimal, live bool) error {
	if live {
		w.e.publish(lifecycle.Budget(w.id, f.agent.ID, &lifecyclev1.BudgetEvent{Kind: &lifecyclev1.BudgetEvent_CostIncurred{
			CostIncurred: &lifecyclev1.CostIncurred{AgentId: f.agent.ID, Cost: money.FromDecimal(cost), Cumulative: money.FromDecimal(w.spent)},
		}}))
	}
	if !w.rec.Budget.Valid {
		return nil
	}
	limit := w.rec.Budget.Decimal
	if !w.warned && w.spent.GreaterThanOrEqual(limit.Mul(w.e.opts.WarnFraction)) {
		w.warned = true
		if live {
			w.e.publish(lifecycle.Budget(w.id, f.agent.ID, &lifecyclev1.BudgetEvent{Kind: &lifecyclev1.BudgetEvent_BudgetWarning{
				BudgetWarning: &lifecyclev1.BudgetWarning{WorkflowId: w.id, Spent: money.FromDecimal(w.spent), Limit: money.FromDecimal(limit)},
			}}))
		}
	}
	model := f.agent.Defaults.Model
	if m, ok := w.models[f.agent.ID]; ok {
		model = m
	}
	d := w.e.opts.Policy.Decide(BudgetState{
		WorkflowID: w.id, AgentID: f.agent.ID, Model: model, DowngradeModel: f.agent.Defaults.DowngradeModel,
		Spent: w.spent, Limit: limit, WarnFraction: w.e.opts.WarnFraction,
	})
	kind := d.GetKind()
	if kind == lifecyclev1.BudgetDecisionKind_BUDGET_DECISION_KIND_UNSPECIFIED || kind == lifecyclev1.BudgetDecisionKind_BUDGET_DECISION_KIND_CONTINUE {
		return nil
	}
	if kind == lifecyclev1.BudgetDecisionKind_BUDGET_DECISION_KIND_DOWNGRADE_MODEL {
		if w.models[f.agent.ID] == d.GetToModel() || d.GetToModel() == "" {
			return nil // already downgraded: nothing new to announce
		}
		w.models[f.agent.ID] = d.GetToModel()
	}
	if live {
		w.e.publish(lifecycle.Budget(w.id, f.agent.ID, &lifecyclev1.BudgetEvent{Kind: &lifecyclev1.BudgetEvent_BudgetAction{
			BudgetAction: &lifecyclev1.BudgetAction{WorkflowId: w.id, Decision: d},
		}}))
	}
	switch kind {
	case lifecyclev1.BudgetDecisionKind_BUDGET_DECISION_KIND_HALT_WORKFLOW:
		return fmt.Errorf("the workflow budget of %s USD is spent (%s USD after %d operator calls): %w",
			limit.String(), w.spent.String(), w.n, errs.BudgetExhausted)
	case lifecyclev1.BudgetDecisionKind_BUDGET_DECISION_KIND_REQUEST_INCREASE:
		w.e.log.Warn("budget policy asks for more budget", "workflow_id", w.id, "amount", d.GetAmount().GetAmount())
	}
	return nil
}

// delegation is one Delegate effect's result, fed back to the delegator.
type delegation struct {
	agent, key string
	ok         bool
	text       string
	exit       string
}

// handoff is the Handoff effect followed.
type handoffTarget struct {
	target, from, key string
	state             *structpb.Value
}

func resultsInput(session *string, results []delegation) *operatorv1.OperatorInput {
	var b strings.Builder
	b.WriteString("Results of delegated tasks:\n")
	list := make([]any, 0, len(results))
	for i, r := range results {
		if r.ok {
			fmt.Fprintf(&b, "\n[%d] agent %s (%s):\n%s\n", i+1, r.agent, r.exit, r.text)
		} else {
			fmt.Fprintf(&b, "\n[%d] agent %s did not run: %s\n", i+1, r.agent, r.text)
		}
		list = append(list, map[string]any{"agent_id": r.agent, "effect_key": r.key, "ok": r.ok, "exit": r.exit, "text": r.text})
	}
	md, _ := structpb.NewStruct(map[string]any{"delegations": list})
	return &operatorv1.OperatorInput{
		Message: content.Text(b.String()), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_TASK,
		SessionId: session, Metadata: md,
	}
}

func handoffInput(session *string, h *handoffTarget, results []delegation) *operatorv1.OperatorInput {
	state, _ := protojson.Marshal(h.state)
	if h.state == nil {
		state = []byte("null")
	}
	text := fmt.Sprintf("Handoff from agent %s. You take over this workflow. State handed over:\n%s", h.from, state)
	in := &operatorv1.OperatorInput{Trigger: operatorv1.TriggerType_TRIGGER_TYPE_TASK, SessionId: session}
	md := map[string]any{"handoff_from": h.from}
	if len(results) > 0 {
		r := resultsInput(session, results)
		text += "\n\n" + content.TextOf(r.Message)
		md["delegations"] = r.Metadata.AsMap()["delegations"]
	}
	in.Message = content.Text(text)
	in.Metadata, _ = structpb.NewStruct(md)
	if h.state != nil {
		in.Metadata.Fields["handoff_state"] = h.state
	}
	return in
}
