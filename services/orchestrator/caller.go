package orchestrator

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/grpcclient"
)

// The dispatch boundary of the Middleware protocol is the orchestrator's
// gRPC client to agents: every operator call (Execute, or an environment's
// Run) goes through the chain of client interceptors GRPCCaller is given.
// serve.Run installs there the boundary's interceptors of
// pkg/middleware/dispatch (AuditInterceptor, BudgetInterceptor, which
// reads the budget the engines put in the call's context with
// dispatch.WithBudget), the embedder's, and a remote MiddlewareService
// when configured (pkg/middleware/remote).

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
