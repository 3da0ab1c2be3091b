package remote

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	middlewarev1 "github.com/secbear/neuron/gen/layer0/middleware/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/middleware/dispatch"
)

const dispatchBoundary = middlewarev1.Boundary_BOUNDARY_DISPATCH

// DispatchClientInterceptor intercepts the orchestrator's calls to agents
// (the dispatch boundary, pkg/middleware/dispatch):
// OperatorService.Execute and EnvironmentService.Run (the input is the
// request's input, the output the reply's output), and the same calls
// streamed by a dispatch.Streamer, which the interceptor sees as unary:
// its after phase gets the stream's final output and its verdict applies
// to it before the caller gets it. Other methods pass through, and so
// does ExecuteStream called on a connection directly.
//
// Before the call, a HALT fails it without making it (PERMISSION_DENIED
// naming the agent, the middleware and its reason) and a MODIFY sends the
// replacement input instead (the caller's request is not changed). After
// a successful call, a HALT fails it with PERMISSION_DENIED and a MODIFY
// replaces the reply's output. Errors of the interceptor's own are status
// errors (errs.ToStatus); the agent's errors pass through unchanged.
func (m *Middleware) DispatchClientInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		in, ok := dispatch.Input(method, req)
		if !ok || !m.wantsAny(dispatchBoundary) {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		agent := in.GetDispatch().GetAgentId()
		if m.wants(dispatchBoundary, before) {
			newIn, err := m.dispatchBefore(ctx, agent, in)
			if err != nil {
				return errs.ToStatus(err).Err()
			}
			if newIn != in {
				in = newIn
				req = withMessage(req.(proto.Message), "input", in)
			}
		}
		if err := invoker(ctx, method, req, reply, cc, opts...); err != nil {
			return err
		}
		if !m.wants(dispatchBoundary, after) {
			return nil
		}
		if err := m.dispatchAfter(ctx, agent, in, reply); err != nil {
			return errs.ToStatus(err).Err()
		}
		return nil
	}
}

// dispatchBefore returns the input to send: in, or the middleware's
// replacement.
func (m *Middleware) dispatchBefore(ctx context.Context, agent string, in *operatorv1.OperatorInput) (*operatorv1.OperatorInput, error) {
	at := point{dispatchBoundary, before}
	resp, out, err := consult(ctx, m, at, func(ctx context.Context) (*middlewarev1.InterceptDispatchResponse, error) {
		return m.client.InterceptDispatch(ctx, &middlewarev1.InterceptDispatchRequest{Phase: before, AgentId: agent, Input: in})
	})
	switch {
	case err != nil:
		return nil, err
	case out == halt:
		return nil, fmt.Errorf("dispatch of agent %q halted by middleware %q: %s: %w",
			agent, m.name, orNone(resp.GetVerdict().GetReason()), errs.PermissionDenied)
	case out == modify && resp.GetInput() == nil:
		return in, m.failed(ctx, at, "MODIFY without a replacement input", nil)
	case out == modify:
		m.modified(ctx, at, resp)
		return resp.GetInput(), nil
	}
	return in, nil
}

// dispatchAfter consults the middleware on a reply and applies its
// verdict to it.
func (m *Middleware) dispatchAfter(ctx context.Context, agent string, in *operatorv1.OperatorInput, reply any) error {
	at := point{dispatchBoundary, after}
	output, _ := dispatch.Output(reply)
	resp, out, err := consult(ctx, m, at, func(ctx context.Context) (*middlewarev1.InterceptDispatchResponse, error) {
		return m.client.InterceptDispatch(ctx, &middlewarev1.InterceptDispatchRequest{Phase: after, AgentId: agent, Input: in, Output: output})
	})
	switch {
	case err != nil:
		return err
	case out == halt:
		return fmt.Errorf("the result of agent %q was withheld by middleware %q: %s: %w",
			agent, m.name, orNone(resp.GetVerdict().GetReason()), errs.PermissionDenied)
	case out == modify && resp.GetOutput() == nil:
		return m.failed(ctx, at, "MODIFY without a replacement output", nil)
	case out == modify:
		m.modified(ctx, at, resp)
		dispatch.SetOutput(reply, resp.GetOutput())
	}
	return nil
}
