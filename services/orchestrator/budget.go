package orchestrator

import (
	"github.com/shopspring/decimal"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	"github.com/secbear/neuron/pkg/money"
)

// BudgetState is what a BudgetPolicy decides on, after each operator call
// of a workflow that has a budget.
type BudgetState struct {
	WorkflowID string
	AgentID    string
	// Model is the agent's current model (after downgrades); empty when
	// the operator's default is used.
	Model string
	// DowngradeModel is the agent's configured cheaper model, if any.
	DowngradeModel string
	Spent, Limit   decimal.Decimal
	WarnFraction   decimal.Decimal
	// Ask: the workflow may wait for a raise (Spec.AskLimits), so a policy
	// may ask for one (REQUEST_INCREASE) rather than halt.
	Ask bool
}

// BudgetPolicy decides what a workflow does as its budget is spent:
// continue, downgrade the agent's model, or halt. It must be a pure
// function of its input: a resumed workflow replays the decisions.
type BudgetPolicy interface {
	Decide(BudgetState) *lifecyclev1.BudgetDecision
}

// ThresholdPolicy is the default policy: once the budget is spent, ask
// for as much again when the workflow may wait for a raise, and halt
// otherwise; past the warning fraction, switch an agent that has a
// downgrade_model to it; otherwise continue.
type ThresholdPolicy struct{}

// Decide implements BudgetPolicy.
func (ThresholdPolicy) Decide(s BudgetState) *lifecyclev1.BudgetDecision {
	switch {
	case s.Spent.GreaterThanOrEqual(s.Limit) && s.Ask:
		return &lifecyclev1.BudgetDecision{Kind: lifecyclev1.BudgetDecisionKind_BUDGET_DECISION_KIND_REQUEST_INCREASE, Amount: money.FromDecimal(s.Limit)}
	case s.Spent.GreaterThanOrEqual(s.Limit):
		return &lifecyclev1.BudgetDecision{Kind: lifecyclev1.BudgetDecisionKind_BUDGET_DECISION_KIND_HALT_WORKFLOW}
	case s.DowngradeModel != "" && s.Model != s.DowngradeModel && s.Spent.GreaterThanOrEqual(s.Limit.Mul(s.WarnFraction)):
		return &lifecyclev1.BudgetDecision{
			Kind:      lifecyclev1.BudgetDecisionKind_BUDGET_DECISION_KIND_DOWNGRADE_MODEL,
			FromModel: s.Model, ToModel: s.DowngradeModel,
		}
	}
	return &lifecyclev1.BudgetDecision{Kind: lifecyclev1.BudgetDecisionKind_BUDGET_DECISION_KIND_CONTINUE}
}
