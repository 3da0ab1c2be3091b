package remote

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	middlewarev1 "github.com/secbear/neuron/gen/layer0/middleware/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/middleware/exec"
)

const execBoundary = middlewarev1.Boundary_BOUNDARY_EXEC

// ExecServerInterceptors intercept invocations on the server that runs
// them (the exec boundary, pkg/middleware/exec): OperatorService.Execute
// and EnvironmentService.Run (unary) and OperatorService.ExecuteStream
// (stream: the request before the handler, the final output message
// after). Other methods pass through.
//
// A HALT before does not run the invocation: the call returns a normal
// response whose output exits EXIT_KIND_MIDDLEWARE_HALT with the reason
// (for the stream, that output as the only message). A MODIFY before runs
// it with the replacement input. After a successful invocation, a MODIFY
// replaces the output and a HALT replaces it with a MIDDLEWARE_HALT output
// that keeps only the original's metadata (what was consumed).
func (m *Middleware) ExecServerInterceptors() (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	return m.execUnary, m.execStream
}

func (m *Middleware) execUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	in, ok := exec.Input(info.FullMethod, req)
	if !ok || !m.wantsAny(execBoundary) {
		return handler(ctx, req)
	}
	if m.wants(execBoundary, before) {
		newIn, halted, err := m.execBefore(ctx, in)
		if err != nil {
			return nil, err
		}
		if halted != nil {
			return exec.HaltResponse(req, halted), nil
		}
		if newIn != in {
			in = newIn
			req = withMessage(req.(proto.Message), "input", in)
		}
	}
	resp, err := handler(ctx, req)
	if err != nil || !m.wants(execBoundary, after) {
		return resp, err
	}
	if out, ok := exec.Output(resp); ok {
		if out, err = m.execAfter(ctx, in, out); err != nil {
			return nil, err
		}
		exec.SetOutput(resp, out)
	}
	return resp, nil
}

func (m *Middleware) execStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if info.FullMethod != exec.StreamMethod || !m.wantsAny(execBoundary) {
		return handler(srv, ss)
	}
	req := &operatorv1.ExecuteStreamRequest{}
	if err := ss.RecvMsg(req); err != nil {
		return err
	}
	in := req.GetInput()
	if m.wants(execBoundary, before) {
		newIn, halted, err := m.execBefore(ss.Context(), in)
		if err != nil {
			return err
		}
		if halted != nil {
			return ss.SendMsg(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_Output{Output: halted}})
		}
		if newIn != in {
			in = newIn
			req = withMessage(req, "input", in).(*operatorv1.ExecuteStreamRequest)
		}
	}
	return handler(srv, &execStream{ServerStream: ss, m: m, req: req, in: in})
}

// execStream hands the handler the (possibly replaced) request already
// received, and intercepts the final output on its way out.
type execStream struct {
	grpc.ServerStream
	m   *Middleware
	req *operatorv1.ExecuteStreamRequest // nil once handed over
	in  *operatorv1.OperatorInput
}

func (s *execStream) RecvMsg(msg any) error {
	if s.req == nil {
		return s.ServerStream.RecvMsg(msg)
	}
	dst, ok := msg.(*operatorv1.ExecuteStreamRequest)
	if !ok {
		return fmt.Errorf("ExecuteStream handler received into %T: %w", msg, errs.Internal)
	}
	proto.Reset(dst)
	proto.Merge(dst, s.req)
	s.req = nil
	return nil
}

func (s *execStream) SendMsg(msg any) error {
	if r, ok := msg.(*operatorv1.ExecuteStreamResponse); ok && r.GetOutput() != nil && s.m.wants(execBoundary, after) {
		out, err := s.m.execAfter(s.Context(), s.in, r.GetOutput())
		if err != nil {
			return err
		}
		if out != r.GetOutput() {
			msg = &operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_Output{Output: out}}
		}
	}
	return s.ServerStream.SendMsg(msg)
}

// execBefore returns the input to run (in, or the middleware's
// replacement), or the output to answer with when the middleware halted.
func (m *Middleware) execBefore(ctx context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorInput, *operatorv1.OperatorOutput, error) {
	at := point{execBoundary, before}
	resp, out, err := consult(ctx, m, at, func(ctx context.Context) (*middlewarev1.InterceptExecResponse, error) {
		return m.client.InterceptExec(ctx, &middlewarev1.InterceptExecRequest{Phase: before, Input: in})
	})
	switch {
	case err != nil:
		return nil, nil, err
	case out == halt:
		return nil, exec.HaltOutput(m.name, resp.GetVerdict().GetReason(), nil), nil
	case out == modify && resp.GetInput() == nil:
		return in, nil, m.failed(ctx, at, "MODIFY without a replacement input", nil)
	case out == modify:
		m.modified(ctx, at, resp)
		return resp.GetInput(), nil, nil
	}
	return in, nil, nil
}

// execAfter returns the output to answer with: output, the middleware's
// replacement, or a MIDDLEWARE_HALT output.
func (m *Middleware) execAfter(ctx context.Context, in *operatorv1.OperatorInput, output *operatorv1.OperatorOutput) (*operatorv1.OperatorOutput, error) {
	at := point{execBoundary, after}
	resp, out, err := consult(ctx, m, at, func(ctx context.Context) (*middlewarev1.InterceptExecResponse, error) {
		return m.client.InterceptExec(ctx, &middlewarev1.InterceptExecRequest{Phase: after, Input: in, Output: output})
	})
	switch {
	case err != nil:
		return nil, err
	case out == halt:
		return exec.HaltOutput(m.name, resp.GetVerdict().GetReason(), output.GetMetadata()), nil
	case out == modify && resp.GetOutput() == nil:
		return output, m.failed(ctx, at, "MODIFY without a replacement output", nil)
	case out == modify:
		m.modified(ctx, at, resp)
		return resp.GetOutput(), nil
	}
	return output, nil
}
