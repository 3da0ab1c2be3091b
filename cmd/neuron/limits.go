package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/shopspring/decimal"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	pkgmoney "github.com/secbear/neuron/pkg/money"
)

// limitFlags are the flags of `neuron workflows limits`.
type limitFlags struct {
	budget   string
	maxSteps uint64
	reject   bool
	reason   string
	key      string
}

func (f *limitFlags) bind(fs *flag.FlagSet) {
	fs.StringVar(&f.budget, "budget", "", "the workflow's new budget in USD, in total (not an increment), e.g. 2.50")
	fs.Uint64Var(&f.maxSteps, "max-steps", 0, "the workflow's new limit of operator calls, in total")
	fs.BoolVar(&f.reject, "reject", false, "refuse the raise the workflow waits for: it fails as reaching the limit would have failed it")
	fs.StringVar(&f.reason, "reason", "", "why, for the record (a refusal's failure cites it)")
	fs.StringVar(&f.key, "key", "", "idempotency key: a change repeated with the same key is recorded once")
}

// updateLimits is `neuron workflows limits ID`.
func (c *cli) updateLimits(ctx context.Context, client orchestratorv1.OrchestratorServiceClient, cn *conn, id string, f *limitFlags) error {
	const name = "workflows limits"
	req := &orchestratorv1.UpdateWorkflowLimitsRequest{WorkflowId: id, MaxSteps: f.maxSteps, Reject: f.reject, Reason: f.reason, IdempotencyKey: f.key}
	if f.budget != "" {
		d, err := decimal.NewFromString(f.budget)
		if err != nil || !d.IsPositive() {
			return usageErrorf(name, "--budget %q: want a positive amount of USD, e.g. 2.50", f.budget)
		}
		req.Budget = pkgmoney.FromDecimal(d)
	}
	if req.Budget == nil && f.maxSteps == 0 && !f.reject {
		return usageErrorf(name, "nothing to change: give --budget, --max-steps or --reject")
	}
	resp, err := client.UpdateWorkflowLimits(ctx, req)
	if err != nil {
		return cn.wrap(err)
	}
	if cn.json {
		printJSONLine(c.stdout, resp)
		return nil
	}
	what := "the refusal"
	if !f.reject {
		what = "the change"
	}
	dup := ""
	if resp.GetDuplicate() {
		dup = " (a duplicate of an earlier change with this key: nothing new was recorded)"
	}
	fmt.Fprintf(c.stdout, "workflow %s: %s is recorded as sequence %d%s; it takes effect at the workflow's next operator call\n", id, what, resp.GetSequence(), dup)
	return nil
}

// limitLine describes a workflow's wait for a raise in one line.
func limitLine(r *orchestratorv1.LimitRequest) string {
	if r.GetKind() == orchestratorv1.LimitKind_LIMIT_KIND_BUDGET {
		return fmt.Sprintf("budget spent: %s of %s", money(r.GetSpent()), money(r.GetBudget()))
	}
	return fmt.Sprintf("operator calls: %d of %d", r.GetSteps(), r.GetMaxSteps())
}

// limitHint is the command that raises the limit r reached.
func limitHint(id string, r *orchestratorv1.LimitRequest) string {
	if r.GetKind() == orchestratorv1.LimitKind_LIMIT_KIND_BUDGET {
		return fmt.Sprintf("neuron workflows limits %s --budget USD (or --reject)", id)
	}
	return fmt.Sprintf("neuron workflows limits %s --max-steps N (or --reject)", id)
}
