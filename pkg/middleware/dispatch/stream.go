package dispatch

import (
	"context"
	"errors"
	"io"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
)

// Chain returns interceptors as one, the first outermost, as
// grpc.WithChainUnaryInterceptor runs them; no interceptor: one that only
// invokes. It lets a caller run the boundary's chain with an invoker of
// its own (a Streamer's), so that one chain serves unary and streamed
// dispatches alike.
func Chain(interceptors ...grpc.UnaryClientInterceptor) grpc.UnaryClientInterceptor {
	ics := append([]grpc.UnaryClientInterceptor(nil), interceptors...)
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		next := invoker
		for i := len(ics) - 1; i >= 0; i-- {
			ic, inner := ics[i], next
			next = func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
				return ic(ctx, method, req, reply, cc, inner, opts...)
			}
		}
		return next(ctx, method, req, reply, cc, opts...)
	}
}

// Progress receives the progress events of one streamed dispatch, in
// order, on the goroutine that makes it: text deltas, tool calls, model
// calls, effects declared; never the output.
type Progress func(ev *operatorv1.ExecuteStreamResponse)

// Streamer makes dispatches as server streams: an Execute as
// OperatorService.ExecuteStream, a Run as EnvironmentService.RunStream.
// Its Invoker is the innermost step of the boundary's chain (Chain), so
// every interceptor sees a streamed dispatch exactly as a unary one: the
// method Execute or Run, an ExecuteRequest or RunRequest it may replace,
// and an ExecuteResponse or RunResponse that holds the final output once
// the stream has ended, which it may read, replace or withhold before the
// caller gets it. Progress events go to the caller as they arrive and are
// not seen by the interceptors.
//
// A peer that answers UNIMPLEMENTED to the streamed method before sending
// anything (an older or third-party operator or environment) is called
// with the unary method instead, within the same dispatch, and from then
// on: a Streamer remembers it. Use one Streamer per connection. The zero
// Streamer is ready to use and safe for concurrent use.
type Streamer struct {
	unaryExecute, unaryRun atomic.Bool // the peer does not stream that method
}

// errNotStreamed is a peer that does not implement the streamed method.
var errNotStreamed = errors.New("the streamed method is not implemented")

// Invoker returns a grpc.UnaryInvoker that makes a dispatch (Execute or
// Run, with its request and reply types) on cc as its stream, giving each
// progress event to progress (nil: dropped) and, when the stream ends
// with its output, setting reply as the unary call would have. A stream
// that ends without an output (an ExecuteStream without its output
// event, a RunStream without a result carrying one), or sends anything
// after it, fails INTERNAL naming the service. The stream's own status
// (an error of the peer, a cancellation, a deadline) is returned as is.
// Any other call is invoked unchanged.
func (s *Streamer) Invoker(progress Progress) grpc.UnaryInvoker {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
		var unary *atomic.Bool
		var stream func(context.Context) error
		switch r := req.(type) {
		case *operatorv1.ExecuteRequest:
			resp, ok := reply.(*operatorv1.ExecuteResponse)
			if method != operatorv1.OperatorService_Execute_FullMethodName || !ok {
				break
			}
			unary = &s.unaryExecute
			stream = func(ctx context.Context) error { return executeStream(ctx, cc, r, resp, progress, opts) }
		case *environmentv1.RunRequest:
			resp, ok := reply.(*environmentv1.RunResponse)
			if method != environmentv1.EnvironmentService_Run_FullMethodName || !ok {
				break
			}
			unary = &s.unaryRun
			stream = func(ctx context.Context) error { return runStream(ctx, cc, r, resp, progress, opts) }
		}
		if unary == nil || unary.Load() {
			return cc.Invoke(ctx, method, req, reply, opts...)
		}
		err := stream(ctx)
		if errors.Is(err, errNotStreamed) {
			unary.Store(true)
			return cc.Invoke(ctx, method, req, reply, opts...)
		}
		return err
	}
}

// executeStream makes req as ExecuteStream and sets reply's output.
func executeStream(ctx context.Context, cc *grpc.ClientConn, req *operatorv1.ExecuteRequest, reply *operatorv1.ExecuteResponse,
	progress Progress, opts []grpc.CallOption) error {
	ctx, cancel := context.WithCancel(ctx) // ends the stream on every return
	defer cancel()
	const method = "ExecuteStream"
	st, err := operatorv1.NewOperatorServiceClient(cc).ExecuteStream(ctx, &operatorv1.ExecuteStreamRequest{Input: req.GetInput()}, opts...)
	if err != nil {
		return notStreamed(err, false)
	}
	for received := false; ; received = true {
		ev, err := st.Recv()
		switch {
		case err == io.EOF:
			return noOutput(cc, "operator", method, "its output")
		case err != nil:
			return notStreamed(err, received)
		case ev.GetOutput() != nil:
			if err := ended(st, cc, "operator", method); err != nil {
				return err
			}
			reply.Output = ev.GetOutput()
			return nil
		case progress != nil:
			progress(ev)
		}
	}
}

// runStream makes req as RunStream and sets reply to its result.
func runStream(ctx context.Context, cc *grpc.ClientConn, req *environmentv1.RunRequest, reply *environmentv1.RunResponse,
	progress Progress, opts []grpc.CallOption) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	const method = "RunStream"
	st, err := environmentv1.NewEnvironmentServiceClient(cc).RunStream(ctx,
		&environmentv1.RunStreamRequest{Input: req.GetInput(), Spec: req.GetSpec()}, opts...)
	if err != nil {
		return notStreamed(err, false)
	}
	for received := false; ; received = true {
		msg, err := st.Recv()
		switch {
		case err == io.EOF:
			return noOutput(cc, "environment", method, "a result")
		case err != nil:
			return notStreamed(err, received)
		case msg.GetResult() != nil:
			if msg.GetResult().GetOutput() == nil {
				return noOutput(cc, "environment", method, "an output in its result")
			}
			if err := ended(st, cc, "environment", method); err != nil {
				return err
			}
			set(reply, msg.GetResult())
			return nil
		case progress != nil && msg.GetProgress() != nil && msg.GetProgress().GetOutput() == nil:
			progress(msg.GetProgress()) // an output among the progress is not progress: the result carries it
		}
	}
}

// notStreamed returns errNotStreamed for an UNIMPLEMENTED before any
// message (the peer lacks the streamed method), else err.
func notStreamed(err error, received bool) error {
	if !received && status.Code(err) == codes.Unimplemented {
		return errNotStreamed
	}
	return err
}

// ended waits for the end of a stream whose last message arrived: its
// status, or INTERNAL when it sends more.
func ended[T any](st grpc.ServerStreamingClient[T], cc *grpc.ClientConn, kind, method string) error {
	_, err := st.Recv()
	switch {
	case err == io.EOF:
		return nil
	case err != nil:
		return err
	}
	return status.Errorf(codes.Internal, "the %s service at %s sent more after the last message of %s", kind, cc.Target(), method)
}

// noOutput is the INTERNAL status of a stream that ended without what.
// (errs.ToStatus would hide the message of an INTERNAL: it is meant for
// a server's own failures, and this one is the peer's.)
func noOutput(cc *grpc.ClientConn, kind, method, what string) error {
	return status.Errorf(codes.Internal, "the %s service at %s ended %s without %s", kind, cc.Target(), method, what)
}

// set makes dst hold src's fields, sharing their values (no copy of the
// output).
func set(dst, src proto.Message) {
	proto.Reset(dst)
	d := dst.ProtoReflect()
	src.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		d.Set(fd, v)
		return true
	})
}
