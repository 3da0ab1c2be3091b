package orchestrator

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/middleware/dispatch"
)

// The dispatch boundary of the Middleware protocol is the orchestrator's
// gRPC client to agents: every operator call (Execute, or an environment's
// Run) goes through the chain of client interceptors GRPCCaller is given.
// serve.Run installs there the boundary's interceptors of
// pkg/middleware/dispatch (AuditInterceptor, BudgetInterceptor, which
// reads the budget the engines put in the call's context with
// dispatch.WithBudget), the embedder's, and a remote MiddlewareService
// when configured (pkg/middleware/remote). The call is streamed
// (ExecuteStream, RunStream) through a dispatch.Streamer, the chain's
// innermost step: the interceptors see it as the unary Execute or Run,
// their request and the final output, and the progress goes to the
// call's ProgressFunc.

// GRPCCaller calls agents over gRPC: an operator service's ExecuteStream,
// or an environment service's RunStream with the agent's EnvironmentSpec,
// giving the progress to the call's ProgressFunc (WithProgress). A
// service that answers UNIMPLEMENTED to the stream (an older or
// third-party one) is called with Execute or Run instead, from then on.
// It keeps one connection per address.
type GRPCCaller struct {
	operator, environment grpcclient.Config
	boundary              grpc.UnaryClientInterceptor // the chain, as one
	// PeerDownHorizon is how long an operator or environment service may
	// stay unreachable (down, restarting, refusing connections) before a
	// call to it fails with a PeerDownError. Until then the call waits for
	// it to come back and is made again: a restart never uses up an
	// agent's retry attempts. Zero: DefaultPeerDownHorizon.
	PeerDownHorizon time.Duration

	mu    sync.Mutex
	peers map[string]*peer
}

// peer is the connection to one service, and what was learnt of it.
type peer struct {
	cc      *grpc.ClientConn
	stream  dispatch.Streamer
	timeout time.Duration // of a call that has no deadline
}

// NewGRPCCaller returns a caller that dials operators with operatorCfg and
// environments with envCfg (their Target is taken from each agent) and
// runs chain, outermost first, around every call, streamed or not.
func NewGRPCCaller(operatorCfg, envCfg grpcclient.Config, chain ...grpc.UnaryClientInterceptor) *GRPCCaller {
	return &GRPCCaller{operator: operatorCfg, environment: envCfg, boundary: dispatch.Chain(chain...), peers: map[string]*peer{}}
}

func (c *GRPCCaller) conn(cfg grpcclient.Config, kind, addr string) (*peer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := kind + "|" + addr
	if p := c.peers[key]; p != nil {
		return p, nil
	}
	cfg.Target = addr
	cfg.MaxRetries = -1 // the engine retries per agent policy
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Minute // an agent run is long; the caller's deadline usually applies first
	}
	// The chain is not installed on the connection: call runs it, around
	// the stream or, for a peer that does not stream, the unary call.
	cc, err := grpcclient.Dial(cfg)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %v: %w", kind, addr, err, errs.FailedPrecondition)
	}
	p := &peer{cc: cc, timeout: cfg.Timeout}
	c.peers[key] = p
	return p, nil
}

// DefaultPeerDownHorizon is GRPCCaller.PeerDownHorizon's default.
const DefaultPeerDownHorizon = 2 * time.Minute

// PeerDownError is an operator call that failed because the service it
// goes to stayed unreachable past the horizon. It is not retried per the
// agent's policy: the horizon already waited longer than those retries.
type PeerDownError struct {
	Kind, Addr string        // "operator" or "environment", and its address
	For        time.Duration // how long it was unreachable
	Err        error         // the last failure
}

func (e *PeerDownError) Error() string {
	return fmt.Sprintf("the %s service at %s stayed unreachable for %s (--peer-down-horizon); start it, or raise the horizon, and dispatch again: %v",
		e.Kind, e.Addr, e.For.Round(time.Millisecond), e.Err)
}

// Unwrap makes a PeerDownError UNAVAILABLE.
func (e *PeerDownError) Unwrap() error { return errs.Unavailable }

// unreachable says whether err is the peer being away (no connection, or
// a service shutting down) rather than an answer of the operator: an
// UNAVAILABLE that carries no reason. An operator's own retryable failure
// carries OPERATOR_RETRYABLE.
func unreachable(err error) bool {
	return errs.Code(err) == codes.Unavailable && errs.Reason(err) == ""
}

// Call implements Caller. A service that is unreachable is waited for,
// up to PeerDownHorizon since it was first found away and within ctx, and
// the call is made again once it is back; a call made again streams its
// progress again from the start (a stream cut by a service going away
// has already given some).
func (c *GRPCCaller) Call(ctx context.Context, agent *Agent, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
	horizon := c.PeerDownHorizon
	if horizon <= 0 {
		horizon = DefaultPeerDownHorizon
	}
	kind, addr := "operator", agent.Operator
	if agent.Environment != "" {
		kind, addr = "environment", agent.Environment
	}
	var down time.Time // when the service was first found unreachable
	pause := 50 * time.Millisecond
	for {
		cc, out, err := c.call(ctx, agent, in)
		if err == nil || !unreachable(err) || ctx.Err() != nil {
			return out, err
		}
		if down.IsZero() {
			down = time.Now()
		}
		// A pause, so that a service that accepts connections but is
		// stopping is not called in a tight loop; then its connection.
		wctx, cancel := context.WithDeadline(ctx, down.Add(horizon))
		werr := Sleep(wctx, pause)
		if werr == nil {
			werr = waitReady(wctx, cc)
		}
		cancel()
		pause = min(2*pause, time.Second)
		switch {
		case ctx.Err() != nil:
			return nil, err
		case werr != nil:
			return nil, &PeerDownError{Kind: kind, Addr: addr, For: time.Since(down), Err: err}
		}
	}
}

// Sleep waits d, or until ctx ends (then its cause).
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// waitReady waits until cc is connected, asking it to connect when idle.
func waitReady(ctx context.Context, cc *grpc.ClientConn) error {
	if cc == nil {
		return errs.Unavailable
	}
	for {
		st := cc.GetState()
		if st == connectivity.Ready {
			return nil
		}
		if st == connectivity.Idle {
			cc.Connect()
		}
		if !cc.WaitForStateChange(ctx, st) {
			return ctx.Err()
		}
	}
}

// call makes one call to the agent's service.
func (c *GRPCCaller) call(ctx context.Context, agent *Agent, in *operatorv1.OperatorInput) (*grpc.ClientConn, *operatorv1.OperatorOutput, error) {
	kind, addr, cfg := "operator", agent.Operator, c.operator
	method, req, reply := operatorv1.OperatorService_Execute_FullMethodName, any(&operatorv1.ExecuteRequest{Input: in}), any(&operatorv1.ExecuteResponse{})
	if agent.Environment != "" {
		spec := agent.Spec
		if spec == nil {
			spec = &environmentv1.EnvironmentSpec{}
		}
		kind, addr, cfg = "environment", agent.Environment, c.environment
		method, req, reply = environmentv1.EnvironmentService_Run_FullMethodName, &environmentv1.RunRequest{Input: in, Spec: spec}, &environmentv1.RunResponse{}
	}
	p, err := c.conn(cfg, kind, addr)
	if err != nil {
		return nil, nil, err
	}
	// The connection's default deadline covers its unary calls only; the
	// chain and the stream get the same.
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.timeout)
		defer cancel()
	}
	if err := c.boundary(ctx, method, req, reply, p.cc, p.stream.Invoker(dispatch.Progress(ProgressFrom(ctx)))); err != nil {
		return p.cc, nil, errs.FromGRPC(err)
	}
	out, _ := dispatch.Output(reply)
	if out == nil {
		return p.cc, nil, fmt.Errorf("%s %s returned no output: %w", kind, addr, errs.Internal)
	}
	return p.cc, out, nil
}

// Close closes every connection.
func (c *GRPCCaller) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, p := range c.peers {
		_ = p.cc.Close()
		delete(c.peers, k)
	}
}
