package dispatch

import (
	"context"
	"fmt"

	"github.com/shopspring/decimal"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/money"
)

type budgetKey struct{}

// WithBudget tells BudgetInterceptor what is left of the workflow budget
// for the dispatches made with the returned context. A remaining that is
// not Valid (the workflow has no budget) leaves ctx unchanged.
func WithBudget(ctx context.Context, remaining decimal.NullDecimal) context.Context {
	if !remaining.Valid {
		return ctx
	}
	return context.WithValue(ctx, budgetKey{}, remaining.Decimal)
}

// BudgetInterceptor enforces the workflow budget at the dispatch boundary:
// a call with nothing left is refused with RESOURCE_EXHAUSTED
// (BUDGET_EXHAUSTED), and the invocation's max_cost is lowered to what is
// left so that one operator call cannot overspend the workflow. The
// caller's request is not changed (a lowered max_cost goes in a copy).
// Calls without a budget (WithBudget) and calls that are not dispatches
// pass through.
func BudgetInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		in, ok := Input(method, req)
		left, budgeted := ctx.Value(budgetKey{}).(decimal.Decimal)
		if !ok || in == nil || !budgeted {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		if !left.IsPositive() {
			return errs.ToStatus(fmt.Errorf("the workflow budget is spent; agent %q was not dispatched: %w",
				in.GetDispatch().GetAgentId(), errs.BudgetExhausted)).Err()
		}
		cur, err := money.Parse(in.GetConfig().GetMaxCost())
		if in.GetConfig().GetMaxCost() == nil || err != nil || cur.GreaterThan(left) {
			req = proto.Clone(req.(proto.Message))
			in, _ = Input(method, req)
			if in.Config == nil {
				in.Config = &operatorv1.OperatorConfig{}
			}
			in.Config.MaxCost = money.FromDecimal(left)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}
