package orchestrator_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/middleware/dispatch"
	"github.com/secbear/neuron/pkg/money"
	"github.com/secbear/neuron/services/orchestrator"
)

// An operator that stays unreachable past the horizon fails the call
// with a PeerDownError naming it: UNAVAILABLE, not retried per the
// agent's policy, and only after the horizon (the call waited for it).
func TestCallerPeerDownHorizon(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // nothing listens there now
	c := orchestrator.NewGRPCCaller(grpcclient.Config{Dev: true}, grpcclient.Config{Dev: true})
	defer c.Close()
	c.PeerDownHorizon = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err = c.Call(ctx, &orchestrator.Agent{ID: "a", Operator: addr}, &operatorv1.OperatorInput{})
	var down *orchestrator.PeerDownError
	if !errors.As(err, &down) || down.Addr != addr || down.Kind != "operator" {
		t.Fatalf("Call to a dead operator: %v; want a PeerDownError naming it", err)
	}
	if errs.Code(err) != codes.Unavailable || orchestrator.Retryable(err) || !strings.Contains(err.Error(), "--peer-down-horizon") {
		t.Fatalf("%v: want UNAVAILABLE, not retryable, naming the flag", err)
	}
	if waited := time.Since(start); waited < c.PeerDownHorizon {
		t.Fatalf("failed after %v, before the horizon of %v", waited, c.PeerDownHorizon)
	}
}

// streamOperator is an OperatorService and EnvironmentService whose
// streams send three progress events and then the output Execute and Run
// answer (the input's text, with a cost). noStream answers the streams
// UNIMPLEMENTED, as an older or third-party peer; noOutput ends them
// without the output; hold makes them wait, after the first event, for
// the call to end, and report it on ended.
type streamOperator struct {
	operatorv1.UnimplementedOperatorServiceServer
	environmentv1.UnimplementedEnvironmentServiceServer
	noStream, noOutput, hold bool
	ended                    chan error

	mu              sync.Mutex
	attempts, unary int // stream calls (refused ones too), Execute and Run calls
	inputs          []*operatorv1.OperatorInput
	specs           []*environmentv1.EnvironmentSpec
}

func (o *streamOperator) output(in *operatorv1.OperatorInput) *operatorv1.OperatorOutput {
	o.mu.Lock()
	o.inputs = append(o.inputs, proto.Clone(in).(*operatorv1.OperatorInput))
	o.mu.Unlock()
	return &operatorv1.OperatorOutput{
		Message:    content.Text("echo: " + content.TextOf(in.GetMessage())),
		ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_COMPLETE},
		Metadata:   &operatorv1.OperatorMetadata{Cost: money.FromDecimal(decimal.RequireFromString("0.03")), TurnsUsed: 2},
	}
}

// events are the progress events streamed for an input's text.
func events(text string) []*operatorv1.ExecuteStreamResponse {
	return []*operatorv1.ExecuteStreamResponse{
		{Event: &operatorv1.ExecuteStreamResponse_TextDelta{TextDelta: &operatorv1.TextDelta{Turn: 1, Text: "thinking about " + text}}},
		{Event: &operatorv1.ExecuteStreamResponse_ToolCallStarted{ToolCallStarted: &operatorv1.ToolCallStarted{Turn: 1, ToolUseId: "t1", Name: "search"}}},
		{Event: &operatorv1.ExecuteStreamResponse_TextDelta{TextDelta: &operatorv1.TextDelta{Turn: 2, Text: "done"}}},
	}
}

func (o *streamOperator) Execute(_ context.Context, r *operatorv1.ExecuteRequest) (*operatorv1.ExecuteResponse, error) {
	o.mu.Lock()
	o.unary++
	o.mu.Unlock()
	return &operatorv1.ExecuteResponse{Output: o.output(r.GetInput())}, nil
}

func (o *streamOperator) Run(_ context.Context, r *environmentv1.RunRequest) (*environmentv1.RunResponse, error) {
	o.mu.Lock()
	o.unary++
	o.specs = append(o.specs, r.GetSpec())
	o.mu.Unlock()
	return &environmentv1.RunResponse{Output: o.output(r.GetInput()), Backend: "fake"}, nil
}

// stream sends in's events through progress, then its output through
// result, per the operator's settings.
func (o *streamOperator) stream(ctx context.Context, in *operatorv1.OperatorInput,
	progress func(*operatorv1.ExecuteStreamResponse) error, result func(*operatorv1.OperatorOutput) error) error {
	o.mu.Lock()
	o.attempts++
	o.mu.Unlock()
	if o.noStream {
		return status.Error(codes.Unimplemented, "unknown method")
	}
	out := o.output(in)
	for i, ev := range events(content.TextOf(in.GetMessage())) {
		if err := progress(ev); err != nil {
			return err
		}
		if i == 0 && o.hold {
			<-ctx.Done()
			o.ended <- ctx.Err()
			return ctx.Err()
		}
	}
	if o.noOutput {
		return nil
	}
	return result(out)
}

func (o *streamOperator) ExecuteStream(r *operatorv1.ExecuteStreamRequest, s operatorv1.OperatorService_ExecuteStreamServer) error {
	return o.stream(s.Context(), r.GetInput(), s.Send, func(out *operatorv1.OperatorOutput) error {
		return s.Send(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_Output{Output: out}})
	})
}

func (o *streamOperator) RunStream(r *environmentv1.RunStreamRequest, s environmentv1.EnvironmentService_RunStreamServer) error {
	o.mu.Lock()
	o.specs = append(o.specs, r.GetSpec())
	o.mu.Unlock()
	return o.stream(s.Context(), r.GetInput(), func(ev *operatorv1.ExecuteStreamResponse) error {
		return s.Send(&environmentv1.RunStreamResponse{Kind: &environmentv1.RunStreamResponse_Progress{Progress: ev}})
	}, func(out *operatorv1.OperatorOutput) error {
		return s.Send(&environmentv1.RunStreamResponse{Kind: &environmentv1.RunStreamResponse_Result{Result: &environmentv1.RunResponse{Output: out, Backend: "fake"}}})
	})
}

func (o *streamOperator) counts() (attempts, unary int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.attempts, o.unary
}

func (o *streamOperator) lastInput() *operatorv1.OperatorInput {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.inputs) == 0 {
		return nil
	}
	return o.inputs[len(o.inputs)-1]
}

// serveOperator serves o, as both services, behind the standard chain.
func serveOperator(t *testing.T, o *streamOperator) string {
	t.Helper()
	return harness.ServeFake(t, "fake", func(s *grpcserver.Server) {
		operatorv1.RegisterOperatorServiceServer(s, o)
		environmentv1.RegisterEnvironmentServiceServer(s, o)
	})
}

// route is an agent at addr: its operator, or an environment service.
type route struct {
	name string
	env  bool
}

var routes = []route{{"operator", false}, {"environment", true}}

func (r route) agent(addr string) *orchestrator.Agent {
	if r.env {
		return &orchestrator.Agent{ID: "a", Environment: addr, Spec: &environmentv1.EnvironmentSpec{
			Network: &environmentv1.NetworkPolicy{DefaultAction: environmentv1.NetworkAction_NETWORK_ACTION_DENY},
		}}
	}
	return &orchestrator.Agent{ID: "a", Operator: addr}
}

func input(text string) *operatorv1.OperatorInput {
	return &operatorv1.OperatorInput{Message: content.Text(text), Dispatch: &operatorv1.DispatchContext{AgentId: "a", DispatchId: "d1"}}
}

// collect returns a context whose progress is appended to *got.
func collect(ctx context.Context, got *[]*operatorv1.ExecuteStreamResponse) context.Context {
	return orchestrator.WithProgress(ctx, func(ev *operatorv1.ExecuteStreamResponse) { *got = append(*got, ev) })
}

func newCaller(t *testing.T, chain ...grpc.UnaryClientInterceptor) *orchestrator.GRPCCaller {
	c := orchestrator.NewGRPCCaller(grpcclient.Config{Dev: true}, grpcclient.Config{Dev: true}, chain...)
	t.Cleanup(c.Close)
	return c
}

func wantEvents(t *testing.T, got []*operatorv1.ExecuteStreamResponse, text string) {
	t.Helper()
	want := events(text)
	if len(got) != len(want) {
		t.Fatalf("%d progress events, want %d: %v", len(got), len(want), got)
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("event %d: %v, want %v", i, got[i], want[i])
		}
	}
}

// TestCallerStreams: a call streams (ExecuteStream, or RunStream with the
// agent's spec), gives each progress event to the context's ProgressFunc
// in order, and returns the output Execute (Run) answers. Without a
// ProgressFunc the progress is dropped.
func TestCallerStreams(t *testing.T) {
	for _, r := range routes {
		t.Run(r.name, func(t *testing.T) {
			o := &streamOperator{}
			addr := serveOperator(t, o)
			c := newCaller(t)
			ctx := context.Background()
			var got []*operatorv1.ExecuteStreamResponse
			out, err := c.Call(collect(ctx, &got), r.agent(addr), input("hi"))
			if err != nil {
				t.Fatal(err)
			}
			wantEvents(t, got, "hi")
			if attempts, unary := o.counts(); attempts != 1 || unary != 0 {
				t.Fatalf("%d streams and %d unary calls, want 1 and 0", attempts, unary)
			}
			cc := harness.Dial(t, addr)
			var want *operatorv1.OperatorOutput
			if r.env {
				resp, err := environmentv1.NewEnvironmentServiceClient(cc).Run(ctx, &environmentv1.RunRequest{Input: input("hi"), Spec: r.agent(addr).Spec})
				if err != nil {
					t.Fatal(err)
				}
				want = resp.GetOutput()
				o.mu.Lock()
				if len(o.specs) != 2 || !proto.Equal(o.specs[0], r.agent(addr).Spec) {
					t.Errorf("the stream got spec %v, want the agent's", o.specs)
				}
				o.mu.Unlock()
			} else {
				resp, err := operatorv1.NewOperatorServiceClient(cc).Execute(ctx, &operatorv1.ExecuteRequest{Input: input("hi")})
				if err != nil {
					t.Fatal(err)
				}
				want = resp.GetOutput()
			}
			if !proto.Equal(out, want) {
				t.Errorf("streamed output %v, the unary call's %v", out, want)
			}
			if out, err := c.Call(ctx, r.agent(addr), input("again")); err != nil || content.TextOf(out.GetMessage()) != "echo: again" {
				t.Fatalf("without a ProgressFunc: %v, %v", out, err)
			}
		})
	}
}

// TestCallerStreamFallback: a service that answers UNIMPLEMENTED to the
// stream is called unary, and the stream is not tried again on that
// connection.
func TestCallerStreamFallback(t *testing.T) {
	for _, r := range routes {
		t.Run(r.name, func(t *testing.T) {
			o := &streamOperator{noStream: true}
			addr := serveOperator(t, o)
			c := newCaller(t)
			for i := range 3 {
				var got []*operatorv1.ExecuteStreamResponse
				out, err := c.Call(collect(context.Background(), &got), r.agent(addr), input("hi"))
				if err != nil || content.TextOf(out.GetMessage()) != "echo: hi" || len(got) != 0 {
					t.Fatalf("call %d: %v, output %v, progress %v", i, err, out, got)
				}
			}
			if attempts, unary := o.counts(); attempts != 1 || unary != 3 {
				t.Errorf("%d streams tried and %d unary calls, want 1 and 3", attempts, unary)
			}
		})
	}
}

// TestCallerStreamWithoutOutput: a stream that ends without the output
// fails INTERNAL naming the service.
func TestCallerStreamWithoutOutput(t *testing.T) {
	for _, r := range routes {
		t.Run(r.name, func(t *testing.T) {
			addr := serveOperator(t, &streamOperator{noOutput: true})
			_, err := newCaller(t).Call(context.Background(), r.agent(addr), input("hi"))
			if errs.Code(err) != codes.Internal || !strings.Contains(err.Error(), r.name+" service at "+addr) || !strings.Contains(err.Error(), "without") {
				t.Fatalf("got %v; want INTERNAL naming the %s service at %s", err, r.name, addr)
			}
		})
	}
}

// TestCallerStreamCancel: cancelling a call while it streams cancels the
// operator's context and fails the call CANCELED.
func TestCallerStreamCancel(t *testing.T) {
	for _, r := range routes {
		t.Run(r.name, func(t *testing.T) {
			o := &streamOperator{hold: true, ended: make(chan error, 1)}
			addr := serveOperator(t, o)
			// The timeout only ends a test whose caller never cancels.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var got int
			ctx = orchestrator.WithProgress(ctx, func(*operatorv1.ExecuteStreamResponse) {
				got++
				cancel() // mid-stream: the operator has sent its first event and waits
			})
			_, err := newCaller(t).Call(ctx, r.agent(addr), input("hi"))
			if errs.Code(err) != codes.Canceled || got != 1 {
				t.Fatalf("got %v after %d events; want CANCELED after 1", err, got)
			}
			select {
			case err := <-o.ended:
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("the operator's context ended with %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the operator's context was not cancelled")
			}
		})
	}
}

// TestCallerStreamBoundary: the caller's chain applies to a streamed call
// as to a unary one: the budget lowers the max_cost the operator gets and
// refuses a call when nothing is left; an interceptor that replaces the
// output does so on the stream's final output; progress passes unchanged.
func TestCallerStreamBoundary(t *testing.T) {
	redact := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if err := invoker(ctx, method, req, reply, cc, opts...); err != nil {
			return err
		}
		if out, ok := dispatch.Output(reply); ok && out != nil {
			out = proto.Clone(out).(*operatorv1.OperatorOutput)
			out.Message = content.Text("[redacted]")
			dispatch.SetOutput(reply, out)
		}
		return nil
	}
	budget := func(s string) context.Context {
		return dispatch.WithBudget(context.Background(), decimal.NullDecimal{Decimal: decimal.RequireFromString(s), Valid: true})
	}
	for _, r := range routes {
		for _, noStream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/unary %v", r.name, noStream), func(t *testing.T) {
				o := &streamOperator{noStream: noStream}
				addr := serveOperator(t, o)
				c := newCaller(t, dispatch.AuditInterceptor(nil), dispatch.BudgetInterceptor(), redact)
				in := input("hi")
				in.Config = &operatorv1.OperatorConfig{MaxCost: money.FromDecimal(decimal.RequireFromString("5"))}
				var got []*operatorv1.ExecuteStreamResponse
				out, err := c.Call(collect(budget("0.25"), &got), r.agent(addr), in)
				if err != nil {
					t.Fatal(err)
				}
				if content.TextOf(out.GetMessage()) != "[redacted]" {
					t.Errorf("output %q, want the interceptor's replacement", content.TextOf(out.GetMessage()))
				}
				if !noStream {
					wantEvents(t, got, "hi")
				}
				if mc := o.lastInput().GetConfig().GetMaxCost().GetAmount(); mc != "0.25" {
					t.Errorf("the operator got max_cost %q, want what is left, 0.25", mc)
				}
				if in.GetConfig().GetMaxCost().GetAmount() != "5" {
					t.Error("the caller's input was changed")
				}
				attempts, unary := o.counts()
				_, err = c.Call(budget("0"), r.agent(addr), input("hi"))
				if errs.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "budget is spent") {
					t.Fatalf("nothing left: %v; want RESOURCE_EXHAUSTED", err)
				}
				if a, u := o.counts(); a != attempts || u != unary {
					t.Error("called with nothing left")
				}
			})
		}
	}
}

// TestCallerWaitsForStreamingPeer: a streamed call to a service that is
// down waits for it to come back (within the horizon) and is made then.
func TestCallerWaitsForStreamingPeer(t *testing.T) {
	addr := closedAddr(t)
	c := newCaller(t)
	c.PeerDownHorizon = time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type result struct {
		out *operatorv1.OperatorOutput
		err error
	}
	var got []*operatorv1.ExecuteStreamResponse
	done := make(chan result, 1)
	go func() {
		out, err := c.Call(collect(ctx, &got), &orchestrator.Agent{ID: "a", Operator: addr}, input("hi"))
		done <- result{out, err}
	}()
	// Let the call find the service down before it starts.
	time.Sleep(200 * time.Millisecond)
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("the address was taken meanwhile: %v", err)
	}
	s := grpc.NewServer()
	operatorv1.RegisterOperatorServiceServer(s, &streamOperator{})
	go func() { _ = s.Serve(lis) }()
	defer s.Stop()
	r := <-done
	if r.err != nil || content.TextOf(r.out.GetMessage()) != "echo: hi" {
		t.Fatalf("got %v, %v; want the output once the operator is back", r.out, r.err)
	}
	wantEvents(t, got, "hi")
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}
