package orchestrator

import (
	"context"
	"fmt"

	"github.com/shopspring/decimal"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/money"
)

// A workflow's limits (its budget and its number of operator calls) can
// change while it runs: UpdateWorkflowLimits journals the change as a
// signal of type LimitsSignal, which the engines deliver with the
// workflow's next operator call like any signal. The change takes effect
// there (ApplyLimits), before the operator is called, so that the call's
// cost cap is the raised one; the workflow learns of it from the step's
// result (StepResult.Limits), recorded with the step, so a replay sees
// the same limits at the same point.
//
// With --on-limit=ask (Spec.AskLimits), a workflow that reaches a limit
// does not fail: before its next operator call it suspends with a limit
// request (Workflow.limit_request) until a change arrives. A raise
// resumes it; a refusal ends it as reaching the limit would have. Signals
// of other kinds (a tool decision, a message) do not end the wait: they
// are delivered with the call the raise lets through.

// LimitsSignal is the signal type of an UpdateWorkflowLimits change.
const LimitsSignal = "limits"

// Limit names, as a StepCall's Asking and the events show them.
const (
	LimitBudget   = "budget"
	LimitMaxSteps = "max_steps"
)

// Limits is a change of a workflow's limits, delivered with a step.
type Limits struct {
	// Budget is the new workflow budget in total; not Valid: unchanged.
	Budget decimal.NullDecimal
	// MaxSteps is the new limit of operator calls; 0: unchanged.
	MaxSteps uint64
	// Rejected: the raise the workflow waited for was refused.
	Rejected bool
	// Reason given with the last change.
	Reason string
	// Seqs are the signals the change came in.
	Seqs []uint64
}

// limitsPayload is the signal of an UpdateWorkflowLimits request.
func limitsPayload(req *orchestratorv1.UpdateWorkflowLimitsRequest) (*typesv1.SignalPayload, error) {
	fields := map[string]*structpb.Value{}
	if b := req.GetBudget(); b != nil {
		d, err := money.Parse(b)
		if err != nil {
			return nil, fmt.Errorf("budget: %v: %w", err, errs.InvalidArgument)
		}
		if !d.IsPositive() {
			return nil, fmt.Errorf("budget: %s USD is not a budget; give a positive amount: %w", d, errs.InvalidArgument)
		}
		fields["budget"] = structpb.NewStringValue(d.String())
	}
	if n := req.GetMaxSteps(); n > 0 {
		fields["max_steps"] = structpb.NewNumberValue(float64(n))
	}
	switch {
	case req.GetReject() && len(fields) > 0:
		return nil, fmt.Errorf("reject refuses the raise a workflow waits for; it cannot also set budget or max_steps: %w", errs.InvalidArgument)
	case req.GetReject():
		fields["reject"] = structpb.NewBoolValue(true)
	case len(fields) == 0:
		return nil, fmt.Errorf("nothing to change: give budget, max_steps or reject: %w", errs.InvalidArgument)
	}
	if r := req.GetReason(); r != "" {
		fields["reason"] = structpb.NewStringValue(r)
	}
	return &typesv1.SignalPayload{SignalType: LimitsSignal, Data: structpb.NewStructValue(&structpb.Struct{Fields: fields})}, nil
}

// LimitsOf folds the limits changes among signals, in order (a later
// value replaces an earlier one); nil when there are none.
func LimitsOf(signals []Signal) *Limits {
	var l *Limits
	for _, s := range signals {
		p := &typesv1.SignalPayload{}
		if proto.Unmarshal(s.Payload, p) != nil || p.GetSignalType() != LimitsSignal {
			continue
		}
		if l == nil {
			l = &Limits{}
		}
		l.Seqs = append(l.Seqs, s.Seq)
		f := p.GetData().GetStructValue().GetFields()
		if v := f["budget"].GetStringValue(); v != "" {
			if d, err := decimal.NewFromString(v); err == nil && d.IsPositive() {
				l.Budget = decimal.NewNullDecimal(d)
				l.Rejected = false
			}
		}
		if n := f["max_steps"].GetNumberValue(); n >= 1 {
			l.MaxSteps = uint64(n)
			l.Rejected = false
		}
		if f["reject"].GetBoolValue() {
			l.Rejected = true
		}
		l.Reason = f["reason"].GetStringValue()
	}
	return l
}

// isLimits says whether a signal is a limits change (delivered to the
// workflow, not to the operator).
func isLimits(p *typesv1.SignalPayload) bool { return p.GetSignalType() == LimitsSignal }

// Wakes says whether a signal (a SignalPayload, binary) lets a workflow
// that awaits (Host.Await) go on: any but a limits change.
func Wakes(payload []byte) bool { return SignalType(payload) != LimitsSignal }

// Raises says whether a signal lets a workflow that waits for a raise
// (Host.AwaitRaise) go on: a limits change only.
func Raises(payload []byte) bool { return SignalType(payload) == LimitsSignal }

// ApplyLimits applies the limits changes among the signals delivered with
// c to c (its Budget, Remaining and MaxSteps) and returns them (nil:
// none). It fails the call, before its operator is called, when c is
// over a limit still: a workflow that waited for a raise (c.Asking) and
// got a refusal or none. Engines call it with the signals they deliver,
// and again with the same signals on replay.
func ApplyLimits(c *StepCall, signals []Signal) (*Limits, error) {
	l := LimitsOf(signals)
	if l != nil && !l.Rejected {
		if l.Budget.Valid {
			c.Budget = l.Budget
			c.Remaining = decimal.NewNullDecimal(l.Budget.Decimal.Sub(c.Spent))
		}
		if l.MaxSteps > 0 {
			c.MaxSteps = l.MaxSteps
		}
	}
	if c.Asking == "" {
		return l, nil
	}
	why := "no raise arrived: another signal resumed it first"
	switch {
	case l == nil:
	case l.Rejected && l.Reason != "":
		why = "the raise was refused: " + l.Reason
	case l.Rejected:
		why = "the raise was refused"
	default:
		why = "the raise was not enough"
	}
	switch {
	case c.Asking == LimitBudget && (!c.Remaining.Valid || c.Remaining.Decimal.IsPositive()):
	case c.Asking == LimitBudget:
		return nil, fmt.Errorf("the workflow budget of %s USD is spent (%s USD) and %s: %w", c.Budget.Decimal, c.Spent, why, errs.BudgetExhausted)
	case c.N <= c.MaxSteps:
	default:
		return nil, fmt.Errorf("the workflow reached its limit of %d operator calls and %s: %w", c.MaxSteps, why, errs.FailedPrecondition)
	}
	return l, nil
}

// limitRequest is the event data of a workflow waiting for a raise.
func (w *workflow) limitRequest(kind, agent string) *structpb.Value {
	fields := []field{str("kind", kind), str("agent_id", agent), str("spent", w.spent.String()), num("steps", w.steps), num("max_steps", w.maxSteps)}
	if w.limit.Valid {
		fields = append(fields, str("budget", w.limit.Decimal.String()))
	}
	return object(fields...)
}

// UpdateWorkflowLimits implements OrchestratorService.UpdateWorkflowLimits.
func (s *Server) UpdateWorkflowLimits(ctx context.Context, req *orchestratorv1.UpdateWorkflowLimitsRequest) (*orchestratorv1.UpdateWorkflowLimitsResponse, error) {
	payload, err := limitsPayload(req)
	if err != nil {
		return nil, err
	}
	id := req.GetWorkflowId()
	wf, err := s.e.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if Terminal(wf.Status) {
		return nil, fmt.Errorf("workflow %q has ended (%s); its limits can no longer change: %w", id, StatusName(wf.Status), errs.FailedPrecondition)
	}
	if req.GetReject() && limitRequestOf(wf) == nil && req.GetIdempotencyKey() == "" {
		return nil, fmt.Errorf("workflow %q is %s and waits for no raise; nothing to reject: %w", id, StatusName(wf.Status), errs.FailedPrecondition)
	}
	raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(payload)
	if err != nil {
		return nil, err
	}
	seq, dup, err := s.e.Signal(ctx, id, raw, req.GetIdempotencyKey())
	if err != nil {
		return nil, err
	}
	return &orchestratorv1.UpdateWorkflowLimitsResponse{Sequence: seq, Duplicate: dup}, nil
}

// limitRequestOf is the raise a suspended workflow waits for: suspended
// although its last operator call asked for nothing (tool approvals
// suspend an operator, a limit suspends the workflow between calls).
func limitRequestOf(wf *Workflow) *orchestratorv1.LimitRequest {
	if wf.Status != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED || wf.Asking == "" {
		return nil
	}
	r := &orchestratorv1.LimitRequest{Spent: money.FromDecimal(wf.Spent), Steps: uint64(wf.Steps), MaxSteps: wf.MaxSteps, AgentId: wf.CurrentAgent}
	if wf.Budget.Valid {
		r.Budget = money.FromDecimal(wf.Budget.Decimal)
	}
	r.Kind = orchestratorv1.LimitKind_LIMIT_KIND_MAX_STEPS
	if wf.Asking == LimitBudget {
		r.Kind = orchestratorv1.LimitKind_LIMIT_KIND_BUDGET
	}
	return r
}

// limitPrompt says what a workflow waiting for a raise waits for, and how
// to give it.
func limitPrompt(id string, r *orchestratorv1.LimitRequest) string {
	if r.GetKind() == orchestratorv1.LimitKind_LIMIT_KIND_BUDGET {
		spent, _ := money.Parse(r.GetSpent())
		budget, _ := money.Parse(r.GetBudget())
		return fmt.Sprintf("workflow %s spent %s USD of its %s USD budget and waits for a raise (UpdateWorkflowLimits with a budget, or reject)", id, spent, budget)
	}
	return fmt.Sprintf("workflow %s made %d of its %d operator calls and waits for a raise (UpdateWorkflowLimits with max_steps, or reject)", id, r.GetSteps(), r.GetMaxSteps())
}
