package dispatch

import (
	"context"
	"strings"
	"testing"

	"github.com/shopspring/decimal"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
)

const (
	execute = "/layer0.operator.v1.OperatorService/Execute"
	run     = "/layer0.environment.v1.EnvironmentService/Run"
)

func usd(s string) *typesv1.Money { return &typesv1.Money{Amount: s} }

func left(s string) decimal.NullDecimal {
	return decimal.NullDecimal{Decimal: decimal.RequireFromString(s), Valid: true}
}

// executeReq is an Execute request of agent-7 with maxCost (nil: none).
func executeReq(maxCost *typesv1.Money) *operatorv1.ExecuteRequest {
	in := &operatorv1.OperatorInput{Dispatch: &operatorv1.DispatchContext{AgentId: "agent-7"}}
	if maxCost != nil {
		in.Config = &operatorv1.OperatorConfig{MaxCost: maxCost}
	}
	return &operatorv1.ExecuteRequest{Input: in}
}

// invoked is a fake invoker that records the request it was given.
type invoked struct {
	calls int
	req   any
}

func (i *invoked) invoke(_ context.Context, _ string, req, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
	i.calls++
	i.req = req
	return nil
}

// sentMaxCost is the max_cost of the input the invoker was given.
func (i *invoked) sentMaxCost(t *testing.T, method string) string {
	t.Helper()
	in, ok := Input(method, i.req)
	if !ok {
		t.Fatalf("the invoker got %T", i.req)
	}
	return in.GetConfig().GetMaxCost().GetAmount()
}

func TestBudgetInterceptor(t *testing.T) {
	tests := []struct {
		name    string
		method  string
		req     proto.Message
		budget  decimal.NullDecimal // not Valid: no budget in the context
		code    codes.Code
		maxCost string // the max_cost the agent gets
		same    bool   // the caller's request itself is sent
	}{
		{"no budget: unchanged", execute, executeReq(usd("5")), decimal.NullDecimal{}, codes.OK, "5", true},
		{"no max_cost: what is left", execute, executeReq(nil), left("0.25"), codes.OK, "0.25", false},
		{"larger max_cost: lowered", execute, executeReq(usd("5")), left("0.25"), codes.OK, "0.25", false},
		{"smaller max_cost: kept", execute, executeReq(usd("0.1")), left("0.25"), codes.OK, "0.1", true},
		{"malformed max_cost: what is left", execute, executeReq(usd("1e3")), left("0.25"), codes.OK, "0.25", false},
		{"environment Run: lowered", run, &environmentv1.RunRequest{Input: executeReq(usd("5")).GetInput()}, left("0.25"), codes.OK, "0.25", false},
		{"nothing left: refused", execute, executeReq(nil), left("0"), codes.ResourceExhausted, "", false},
		{"overspent: refused", run, &environmentv1.RunRequest{Input: executeReq(nil).GetInput()}, left("-0.5"), codes.ResourceExhausted, "", false},
		{"not a dispatch: passes", "/layer0.operator.v1.OperatorService/Other", executeReq(nil), left("0"), codes.OK, "", true},
		{"no input: passes", execute, &operatorv1.ExecuteRequest{}, left("0"), codes.OK, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			orig := proto.Clone(tt.req)
			var inv invoked
			err := BudgetInterceptor()(WithBudget(context.Background(), tt.budget), tt.method, tt.req, nil, nil, inv.invoke)
			if got := status.Code(err); got != tt.code {
				t.Fatalf("code %v (%v), want %v", got, err, tt.code)
			}
			if !proto.Equal(tt.req, orig) {
				t.Fatal("the caller's request was changed")
			}
			if tt.code != codes.OK {
				if inv.calls != 0 {
					t.Fatal("dispatched with nothing left")
				}
				if r := errs.Reason(errs.FromGRPC(err)); r != errs.ReasonBudgetExhausted {
					t.Errorf("reason %q, want %q", r, errs.ReasonBudgetExhausted)
				}
				if msg := status.Convert(err).Message(); !strings.HasPrefix(msg, `the workflow budget is spent; agent "agent-7" was not dispatched`) {
					t.Errorf("message %q", msg)
				}
				return
			}
			if inv.calls != 1 {
				t.Fatalf("%d calls, want 1", inv.calls)
			}
			if same := inv.req == any(tt.req); same != tt.same {
				t.Errorf("the caller's request sent as is: %v, want %v", same, tt.same)
			}
			if in, ok := Input(tt.method, inv.req); ok && in != nil {
				if got := inv.sentMaxCost(t, tt.method); got != tt.maxCost {
					t.Errorf("max_cost %q, want %q", got, tt.maxCost)
				}
			}
		})
	}
}

func TestWithBudget(t *testing.T) {
	ctx := context.Background()
	if WithBudget(ctx, decimal.NullDecimal{}) != ctx {
		t.Error("no budget changed the context")
	}
	if _, ok := WithBudget(ctx, left("1")).Value(budgetKey{}).(decimal.Decimal); !ok {
		t.Error("the budget is not in the context")
	}
}
