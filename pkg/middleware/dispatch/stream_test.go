package dispatch_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/logging"
	"github.com/secbear/neuron/pkg/middleware/dispatch"
	"github.com/secbear/neuron/pkg/middleware/internal/boundarytest"
	"github.com/secbear/neuron/pkg/money"

	"github.com/shopspring/decimal"
)

const (
	execute = operatorv1.OperatorService_Execute_FullMethodName
	run     = environmentv1.EnvironmentService_Run_FullMethodName
)

// How a streamAgent streams.
const (
	streams     = iota // progress, then the output
	noStream           // UNIMPLEMENTED to the streams, as an older peer
	noOutput           // progress, then the end without an output
	moreAfter          // the output, then more progress
	failsLate          // progress, then UNIMPLEMENTED as its own answer
	emptyResult        // RunStream: a result without an output
)

// streamAgent is an operator and environment service. Each run records
// its input and answers its text with cost 0.01; the streams first send
// the progress events of progress(input text), in order.
type streamAgent struct {
	operatorv1.UnimplementedOperatorServiceServer
	environmentv1.UnimplementedEnvironmentServiceServer
	mode int

	mu              sync.Mutex
	inputs          []*operatorv1.OperatorInput
	streamed, unary int // runs by ExecuteStream or RunStream, by Execute or Run
	attempts        int // calls of ExecuteStream or RunStream, refused ones included
}

// progress is what a streamAgent streams before the output of text.
func progress(text string) []*operatorv1.ExecuteStreamResponse {
	return []*operatorv1.ExecuteStreamResponse{
		{Event: &operatorv1.ExecuteStreamResponse_TextDelta{TextDelta: &operatorv1.TextDelta{Turn: 1, Text: "1:" + text}}},
		{Event: &operatorv1.ExecuteStreamResponse_ToolCallStarted{ToolCallStarted: &operatorv1.ToolCallStarted{Turn: 1, Name: "search"}}},
		{Event: &operatorv1.ExecuteStreamResponse_TextDelta{TextDelta: &operatorv1.TextDelta{Turn: 2, Text: "2:" + text}}},
	}
}

func (a *streamAgent) run(in *operatorv1.OperatorInput, streamed bool) *operatorv1.OperatorOutput {
	a.mu.Lock()
	a.inputs = append(a.inputs, proto.Clone(in).(*operatorv1.OperatorInput))
	if streamed {
		a.streamed++
	} else {
		a.unary++
	}
	a.mu.Unlock()
	return &operatorv1.OperatorOutput{
		Message:    content.Text(content.TextOf(in.GetMessage())),
		ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_COMPLETE},
		Metadata:   &operatorv1.OperatorMetadata{Cost: money.FromDecimal(decimal.RequireFromString("0.01")), TurnsUsed: 2},
		Effects:    []*typesv1.Effect{{IdempotencyKey: "d/0", Kind: &typesv1.Effect_Log{Log: &typesv1.LogEffect{}}}},
	}
}

func (a *streamAgent) calls() (streamed, unary int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.streamed, a.unary
}

func (a *streamAgent) streamAttempts() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.attempts
}

func (a *streamAgent) lastInput() *operatorv1.OperatorInput {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.inputs) == 0 {
		return nil
	}
	return a.inputs[len(a.inputs)-1]
}

func (a *streamAgent) Execute(_ context.Context, r *operatorv1.ExecuteRequest) (*operatorv1.ExecuteResponse, error) {
	return &operatorv1.ExecuteResponse{Output: a.run(r.GetInput(), false)}, nil
}

func (a *streamAgent) Run(_ context.Context, r *environmentv1.RunRequest) (*environmentv1.RunResponse, error) {
	return &environmentv1.RunResponse{Output: a.run(r.GetInput(), false), Backend: "fake", Duration: durationpb.New(7)}, nil
}

// stream sends in's progress and output per the agent's mode, each
// through send (progress: true; the output: false).
func (a *streamAgent) stream(in *operatorv1.OperatorInput, send func(*operatorv1.ExecuteStreamResponse, *operatorv1.OperatorOutput) error) error {
	a.mu.Lock()
	a.attempts++
	a.mu.Unlock()
	if a.mode == noStream {
		return status.Error(codes.Unimplemented, "method not implemented")
	}
	out := a.run(in, true)
	evs := progress(content.TextOf(in.GetMessage()))
	if a.mode == moreAfter {
		if err := send(nil, out); err != nil {
			return err
		}
		return send(evs[0], nil)
	}
	for _, ev := range evs {
		if err := send(ev, nil); err != nil {
			return err
		}
	}
	switch a.mode {
	case noOutput:
		return nil
	case failsLate:
		return status.Error(codes.Unimplemented, "tool search is not implemented")
	case emptyResult:
		out = nil
	}
	return send(nil, out)
}

func (a *streamAgent) ExecuteStream(r *operatorv1.ExecuteStreamRequest, s operatorv1.OperatorService_ExecuteStreamServer) error {
	return a.stream(r.GetInput(), func(ev *operatorv1.ExecuteStreamResponse, out *operatorv1.OperatorOutput) error {
		if ev == nil {
			ev = &operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_Output{Output: out}}
		}
		return s.Send(ev)
	})
}

func (a *streamAgent) RunStream(r *environmentv1.RunStreamRequest, s environmentv1.EnvironmentService_RunStreamServer) error {
	return a.stream(r.GetInput(), func(ev *operatorv1.ExecuteStreamResponse, out *operatorv1.OperatorOutput) error {
		if ev != nil {
			return s.Send(&environmentv1.RunStreamResponse{Kind: &environmentv1.RunStreamResponse_Progress{Progress: ev}})
		}
		return s.Send(&environmentv1.RunStreamResponse{Kind: &environmentv1.RunStreamResponse_Result{
			Result: &environmentv1.RunResponse{Output: out, Backend: "fake", Duration: durationpb.New(7)},
		}})
	})
}

// serveStream serves a streamAgent in mode and returns it and a bare
// connection to it.
func serveStream(t *testing.T, mode int) (*streamAgent, *grpc.ClientConn) {
	t.Helper()
	a := &streamAgent{mode: mode}
	_, addr := boundarytest.Listen(t, func(s *grpc.Server) {
		operatorv1.RegisterOperatorServiceServer(s, a)
		environmentv1.RegisterEnvironmentServiceServer(s, a)
	})
	return a, boundarytest.Dial(t, addr)
}

// dispatchCall is one dispatch of text, by Execute or by Run.
type dispatchCall struct {
	method     string
	req, reply proto.Message
}

func newCall(method, text string, maxCost *typesv1.Money) dispatchCall {
	in := boundarytest.Input(text)
	if maxCost != nil {
		in.Config = &operatorv1.OperatorConfig{MaxCost: maxCost}
	}
	if method == run {
		return dispatchCall{run, &environmentv1.RunRequest{Input: in, Spec: &environmentv1.EnvironmentSpec{}}, &environmentv1.RunResponse{}}
	}
	return dispatchCall{execute, &operatorv1.ExecuteRequest{Input: in}, &operatorv1.ExecuteResponse{}}
}

// invoke makes c through chain around s's invoker and returns the
// progress events received.
func (c dispatchCall) invoke(ctx context.Context, chain grpc.UnaryClientInterceptor, s *dispatch.Streamer, cc *grpc.ClientConn) ([]*operatorv1.ExecuteStreamResponse, error) {
	var got []*operatorv1.ExecuteStreamResponse
	err := chain(ctx, c.method, c.req, c.reply, cc, s.Invoker(func(ev *operatorv1.ExecuteStreamResponse) { got = append(got, ev) }))
	return got, err
}

func (c dispatchCall) output() *operatorv1.OperatorOutput {
	out, _ := dispatch.Output(c.reply)
	return out
}

// short names a dispatch's method in test names.
func short(method string) string { return method[strings.LastIndex(method, "/")+1:] }

func wantProgress(t *testing.T, got []*operatorv1.ExecuteStreamResponse, text string) {
	t.Helper()
	want := progress(text)
	if len(got) != len(want) {
		t.Fatalf("%d progress events, want %d: %v", len(got), len(want), got)
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("event %d: %v, want %v", i, got[i], want[i])
		}
	}
}

// TestStreamer: a dispatch made as a stream delivers the progress in
// order and answers what the unary call answers; a peer without the
// streams is called unary, and only tried once.
func TestStreamer(t *testing.T) {
	ctx := context.Background()
	pass := dispatch.Chain()
	for _, method := range []string{execute, run} {
		t.Run(short(method)+"/progress in order, the unary call's output", func(t *testing.T) {
			a, cc := serveStream(t, streams)
			var s dispatch.Streamer
			c := newCall(method, "hello", nil)
			got, err := c.invoke(ctx, pass, &s, cc)
			if err != nil {
				t.Fatal(err)
			}
			wantProgress(t, got, "hello")
			unary := newCall(method, "hello", nil)
			if err := cc.Invoke(ctx, method, unary.req, unary.reply); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(c.reply, unary.reply) {
				t.Errorf("streamed answer %v, unary %v", c.reply, unary.reply)
			}
			if streamed, u := a.calls(); streamed != 1 || u != 1 {
				t.Errorf("%d streamed and %d unary calls, want 1 and 1", streamed, u)
			}
		})
		t.Run(short(method)+"/no stream: unary, remembered", func(t *testing.T) {
			a, cc := serveStream(t, noStream)
			var s dispatch.Streamer
			for i := range 3 {
				c := newCall(method, "hello", nil)
				got, err := c.invoke(ctx, pass, &s, cc)
				if err != nil || content.TextOf(c.output().GetMessage()) != "hello" || len(got) != 0 {
					t.Fatalf("call %d: %v, output %v, progress %v", i, err, c.output(), got)
				}
			}
			if streamed, u := a.calls(); streamed != 0 || u != 3 {
				t.Errorf("%d streamed and %d unary runs, want 0 and 3", streamed, u)
			}
			if n := a.streamAttempts(); n != 1 {
				t.Errorf("the stream was tried %d times, want once", n)
			}
			// A fresh Streamer (a new connection) tries the stream again.
			other := newCall(method, "hi", nil)
			if _, err := other.invoke(ctx, pass, &dispatch.Streamer{}, cc); err != nil {
				t.Fatal(err)
			}
			if n := a.streamAttempts(); n != 2 {
				t.Errorf("the stream was tried %d times, want twice", n)
			}
		})
		t.Run(short(method)+"/UNIMPLEMENTED after progress is the answer, not a fallback", func(t *testing.T) {
			a, cc := serveStream(t, failsLate)
			var s dispatch.Streamer
			got, err := newCall(method, "hello", nil).invoke(ctx, pass, &s, cc)
			boundarytest.WantStatus(t, err, codes.Unimplemented, "tool search")
			wantProgress(t, got, "hello")
			if streamed, u := a.calls(); streamed != 1 || u != 0 {
				t.Errorf("%d streamed and %d unary runs, want 1 and 0", streamed, u)
			}
		})
	}
	broken := []struct {
		name   string
		mode   int
		method string
		frags  []string
	}{
		{"execute without output", noOutput, execute, []string{"operator service at", "ended ExecuteStream without its output"}},
		{"run without result", noOutput, run, []string{"environment service at", "ended RunStream without a result"}},
		{"run result without output", emptyResult, run, []string{"environment service at", "ended RunStream without an output in its result"}},
		{"execute: more after the output", moreAfter, execute, []string{"operator service at", "sent more after the last message of ExecuteStream"}},
		{"run: more after the result", moreAfter, run, []string{"environment service at", "sent more after the last message of RunStream"}},
	}
	for _, tt := range broken {
		t.Run(tt.name+": INTERNAL naming the service", func(t *testing.T) {
			_, cc := serveStream(t, tt.mode)
			c := newCall(tt.method, "hello", nil)
			_, err := c.invoke(ctx, pass, &dispatch.Streamer{}, cc)
			boundarytest.WantStatus(t, err, codes.Internal, append(tt.frags, cc.Target())...)
		})
	}
	t.Run("not a dispatch: invoked as is", func(t *testing.T) {
		a, cc := serveStream(t, streams)
		req := &operatorv1.ExecuteRequest{Input: boundarytest.Input("x")}
		err := pass(ctx, "/layer0.operator.v1.OperatorService/Other", req, &operatorv1.ExecuteResponse{}, cc, (&dispatch.Streamer{}).Invoker(nil))
		boundarytest.WantStatus(t, err, codes.Unimplemented, "Other")
		if streamed, u := a.calls(); streamed+u != 0 {
			t.Errorf("%d streamed and %d unary runs", streamed, u)
		}
	})
}

// TestStreamBudget: the budget applies to a streamed dispatch as to a
// unary one: nothing left refuses it before it is made, and the
// invocation's max_cost is lowered to what is left.
func TestStreamBudget(t *testing.T) {
	chain := dispatch.Chain(dispatch.AuditInterceptor(nil), dispatch.BudgetInterceptor())
	for _, method := range []string{execute, run} {
		t.Run(short(method)+"/max_cost lowered", func(t *testing.T) {
			a, cc := serveStream(t, streams)
			c := newCall(method, "hello", &typesv1.Money{Amount: "5"})
			orig := proto.Clone(c.req)
			ctx := dispatch.WithBudget(context.Background(), decimal.NullDecimal{Decimal: decimal.RequireFromString("0.25"), Valid: true})
			got, err := c.invoke(ctx, chain, &dispatch.Streamer{}, cc)
			if err != nil {
				t.Fatal(err)
			}
			wantProgress(t, got, "hello")
			if streamed, _ := a.calls(); streamed != 1 {
				t.Fatalf("%d streamed calls, want 1", streamed)
			}
			if mc := a.lastInput().GetConfig().GetMaxCost().GetAmount(); mc != "0.25" {
				t.Errorf("the agent got max_cost %q, want what is left, 0.25", mc)
			}
			if !proto.Equal(c.req, orig) {
				t.Error("the caller's request was changed")
			}
		})
		t.Run(short(method)+"/nothing left: refused", func(t *testing.T) {
			a, cc := serveStream(t, streams)
			ctx := dispatch.WithBudget(context.Background(), decimal.NullDecimal{Decimal: decimal.Zero, Valid: true})
			got, err := newCall(method, "hello", nil).invoke(ctx, chain, &dispatch.Streamer{}, cc)
			boundarytest.WantStatus(t, err, codes.ResourceExhausted, `agent "agent-7" was not dispatched`)
			if streamed, u := a.calls(); streamed+u != 0 || len(got) != 0 {
				t.Errorf("dispatched with nothing left: %d streamed, %d unary, %d events", streamed, u, len(got))
			}
		})
	}
}

// TestStreamAudit: a streamed dispatch is recorded as a unary one, with
// its output's exit, cost and effects.
func TestStreamAudit(t *testing.T) {
	for _, method := range []string{execute, run} {
		t.Run(short(method), func(t *testing.T) {
			var buf bytes.Buffer
			log, _ := logging.New(&buf, logging.Options{Format: "json"})
			_, cc := serveStream(t, streams)
			if _, err := newCall(method, "hello", nil).invoke(context.Background(), dispatch.Chain(dispatch.AuditInterceptor(log)), &dispatch.Streamer{}, cc); err != nil {
				t.Fatal(err)
			}
			var rec map[string]any
			if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
				t.Fatalf("one JSON record expected: %q", buf.String())
			}
			want := map[string]any{"audit": "dispatch", "agent": "agent-7", "code": "OK", "exit": "EXIT_KIND_COMPLETE", "cost": "0.01", "effects": 1.0, "target": cc.Target()}
			for k, v := range want {
				if rec[k] != v {
					t.Errorf("%s = %v, want %v", k, rec[k], v)
				}
			}
			if strings.Contains(buf.String(), "hello") {
				t.Errorf("content logged: %s", buf.String())
			}
		})
	}
}

// TestChain: the first interceptor is the outermost; no interceptor only
// invokes.
func TestChain(t *testing.T) {
	var order []string
	ic := func(name string) grpc.UnaryClientInterceptor {
		return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			order = append(order, name+">")
			err := invoker(ctx, method, req, reply, cc, opts...)
			order = append(order, "<"+name)
			return err
		}
	}
	invoker := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
		order = append(order, "call")
		return nil
	}
	_ = dispatch.Chain(ic("a"), ic("b"))(context.Background(), execute, nil, nil, nil, invoker)
	_ = dispatch.Chain()(context.Background(), execute, nil, nil, nil, invoker)
	if got := strings.Join(order, " "); got != "a> b> call <b <a call" {
		t.Errorf("order %q", got)
	}
}

// BenchmarkDispatch is one Execute through the orchestrator's local chain
// (audit, budget) to an in-process agent: unary, and streamed with the
// agent's three progress events.
func BenchmarkDispatch(b *testing.B) {
	a := &streamAgent{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	s := grpc.NewServer()
	operatorv1.RegisterOperatorServiceServer(s, a)
	go func() { _ = s.Serve(lis) }()
	defer s.Stop()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	chain := dispatch.Chain(dispatch.AuditInterceptor(nil), dispatch.BudgetInterceptor())
	ctx := dispatch.WithBudget(context.Background(), decimal.NullDecimal{Decimal: decimal.RequireFromString("1"), Valid: true})
	unary := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
		return cc.Invoke(ctx, method, req, reply, opts...)
	}
	var s2 dispatch.Streamer
	for _, bm := range []struct {
		name    string
		invoker grpc.UnaryInvoker
	}{{"unary", unary}, {"stream", s2.Invoker(func(*operatorv1.ExecuteStreamResponse) {})}} {
		b.Run(bm.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				c := newCall(execute, "hello", nil)
				if err := chain(ctx, c.method, c.req, c.reply, cc, bm.invoker); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
