package orchestrator

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/shopspring/decimal"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/money"
)

// The dispatch boundary is the orchestrator's gRPC client to agents: every
// operator call (Execute, or an environment's Run) goes through a chain of
// client interceptors. The orchestrator installs BudgetInterceptor and
// AuditInterceptor there, and a remote MiddlewareService when configured.

const (
	methodExecute = "/layer0.operator.v1.OperatorService/Execute"
	methodRun     = "/layer0.environment.v1.EnvironmentService/Run"
)

// GRPCCaller calls agents over gRPC: an operator service's Execute, or an
// environment service's Run with the agent's EnvironmentSpec. It keeps one
// connection per address.
type GRPCCaller struct {
	operator, environment grpcclient.Config
	chain                 []grpc.UnaryClientInterceptor

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// NewGRPCCaller returns a caller that dials operators with operatorCfg and
// environments with envCfg (their Target is taken from each agent) and
// runs chain, outermost first, around every call.
func NewGRPCCaller(operatorCfg, envCfg grpcclient.Config, chain ...grpc.UnaryClientInterceptor) *GRPCCaller {
	return &GRPCCaller{operator: operatorCfg, environment: envCfg, chain: chain, conns: map[string]*grpc.ClientConn{}}
}

func (c *GRPCCaller) conn(cfg grpcclient.Config, kind, addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := kind + "|" + addr
	if cc := c.conns[key]; cc != nil {
		return cc, nil
	}
	cfg.Target = addr
	cfg.MaxRetries = -1 // the engine retries per agent policy
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Minute // an agent run is long; the caller's deadline usually applies first
	}
	cc, err := grpcclient.Dial(cfg, grpc.WithChainUnaryInterceptor(c.chain...))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %v: %w", kind, addr, err, errs.FailedPrecondition)
	}
	c.conns[key] = cc
	return cc, nil
}

// Call implements Caller.
func (c *GRPCCaller) Call(ctx context.Context, agent *Agent, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
	if agent.Environment != "" {
		cc, err := c.conn(c.environment, "environment", agent.Environment)
		if err != nil {
			return nil, err
		}
		spec := agent.Spec
		if spec == nil {
			spec = &environmentv1.EnvironmentSpec{}
		}
		resp, err := environmentv1.NewEnvironmentServiceClient(cc).Run(ctx, &environmentv1.RunRequest{Input: in, Spec: spec})
		if err != nil {
			return nil, errs.FromGRPC(err)
		}
		return resp.GetOutput(), nil
	}
	cc, err := c.conn(c.operator, "operator", agent.Operator)
	if err != nil {
		return nil, err
	}
	resp, err := operatorv1.NewOperatorServiceClient(cc).Execute(ctx, &operatorv1.ExecuteRequest{Input: in})
	if err != nil {
		return nil, errs.FromGRPC(err)
	}
	if resp.GetOutput() == nil {
		return nil, fmt.Errorf("operator %s returned no output: %w", agent.Operator, errs.Internal)
	}
	return resp.GetOutput(), nil
}

// Close closes every connection.
func (c *GRPCCaller) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, cc := range c.conns {
		_ = cc.Close()
		delete(c.conns, k)
	}
}

// dispatchInput returns the OperatorInput of an agent call, or nil for
// any other method.
func dispatchInput(method string, req any) *operatorv1.OperatorInput {
	switch method {
	case methodExecute:
		if r, ok := req.(*operatorv1.ExecuteRequest); ok {
			return r.GetInput()
		}
	case methodRun:
		if r, ok := req.(*environmentv1.RunRequest); ok {
			return r.GetInput()
		}
	}
	return nil
}

func dispatchOutput(reply any) *operatorv1.OperatorOutput {
	switch r := reply.(type) {
	case *operatorv1.ExecuteResponse:
		return r.GetOutput()
	case *environmentv1.RunResponse:
		return r.GetOutput()
	}
	return nil
}

type budgetKey struct{}

// WithBudget tells BudgetInterceptor what is left of the workflow budget.
func WithBudget(ctx context.Context, remaining decimal.NullDecimal) context.Context {
	if !remaining.Valid {
		return ctx
	}
	return context.WithValue(ctx, budgetKey{}, remaining.Decimal)
}

// BudgetInterceptor enforces the workflow budget at the dispatch boundary:
// a call with nothing left is refused with RESOURCE_EXHAUSTED
// (BUDGET_EXHAUSTED), and the invocation's max_cost is lowered to what is
// left so that one operator call cannot overspend the workflow.
func BudgetInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		in := dispatchInput(method, req)
		left, ok := ctx.Value(budgetKey{}).(decimal.Decimal)
		if in == nil || !ok {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		if !left.IsPositive() {
			return errs.ToStatus(fmt.Errorf("the workflow budget is spent; agent %q was not dispatched: %w",
				in.GetDispatch().GetAgentId(), errs.BudgetExhausted)).Err()
		}
		cur, err := money.Parse(in.GetConfig().GetMaxCost())
		if in.GetConfig().GetMaxCost() == nil || err != nil || cur.GreaterThan(left) {
			req = proto.Clone(req.(proto.Message))
			in = dispatchInput(method, req)
			if in.Config == nil {
				in.Config = &operatorv1.OperatorConfig{}
			}
			in.Config.MaxCost = money.FromDecimal(left)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// AuditInterceptor writes one audit record per agent dispatch: workflow,
// dispatch, agent, depth, outcome, exit, cost and duration. Message
// content is never logged.
func AuditInterceptor(log *slog.Logger) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		in := dispatchInput(method, req)
		if in == nil {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		start := time.Now()
		err := invoker(ctx, method, req, reply, cc, opts...)
		d := in.GetDispatch()
		attrs := []any{
			"audit", "dispatch", "workflow_id", d.GetWorkflowId(), "dispatch_id", d.GetDispatchId(),
			"agent", d.GetAgentId(), "depth", d.GetDepth(), "parent", d.GetParentDispatchId(),
			"target", cc.Target(), "code", errs.Code(err).String(), "duration_ms", time.Since(start).Milliseconds(),
		}
		if out := dispatchOutput(reply); err == nil && out != nil {
			attrs = append(attrs, "exit", out.GetExitReason().GetKind().String(),
				"cost", out.GetMetadata().GetCost().GetAmount(), "effects", len(out.GetEffects()))
		}
		log.InfoContext(ctx, "dispatch", attrs...)
		return err
	}
}
