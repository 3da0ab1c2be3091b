package remote

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	middlewarev1 "github.com/secbear/neuron/gen/layer0/middleware/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/grpcserver"
)

// policy is the remote middleware of the tests: a real MiddlewareService
// with fixed rules, keyed on the text of inputs and outputs and on store
// keys and values.
//
//	dispatch/exec before: "forbidden" -> HALT; "rewrite me" -> MODIFY to
//	  "rewritten"; "broken" -> MODIFY without an input; else CONTINUE
//	  (sent as an unset verdict, which means CONTINUE).
//	dispatch/exec after: output "secret answer" -> MODIFY to "[redacted]";
//	  output "leak" -> HALT.
//	store before: key "forbidden" -> HALT; a written string holding
//	  "hunter2" -> MODIFY to "[redacted]".
//	store after: READ of "card" -> MODIFY to "****"; READ of "hidden" -> HALT.
type policy struct {
	middlewarev1.UnimplementedMiddlewareServiceServer
	name string
	subs []*middlewarev1.Subscription // nil: all six
	slow bool                         // Intercept* answers only when the caller gives up

	mu    sync.Mutex
	calls map[point]int
}

const haltReason = "no forbidden things"

func (p *policy) Describe(context.Context, *middlewarev1.DescribeRequest) (*middlewarev1.DescribeResponse, error) {
	subs := p.subs
	if subs == nil {
		for _, b := range []middlewarev1.Boundary{dispatchBoundary, storeBoundary, execBoundary} {
			subs = append(subs, &middlewarev1.Subscription{Boundary: b, Phase: before}, &middlewarev1.Subscription{Boundary: b, Phase: after})
		}
	}
	return &middlewarev1.DescribeResponse{Name: p.name, Subscriptions: subs}, nil
}

func (p *policy) count(ctx context.Context, b middlewarev1.Boundary, ph middlewarev1.Phase) error {
	p.mu.Lock()
	if p.calls == nil {
		p.calls = map[point]int{}
	}
	p.calls[point{b, ph}]++
	p.mu.Unlock()
	if p.slow {
		<-ctx.Done() // the caller's deadline, propagated by gRPC
		return status.Error(codes.DeadlineExceeded, "too slow")
	}
	return nil
}

func (p *policy) callsAt(b middlewarev1.Boundary, ph middlewarev1.Phase) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[point{b, ph}]
}

var (
	haltVerdict   = &middlewarev1.Verdict{Kind: middlewarev1.VerdictKind_VERDICT_KIND_HALT, Reason: haltReason}
	modifyVerdict = &middlewarev1.Verdict{Kind: middlewarev1.VerdictKind_VERDICT_KIND_MODIFY, Reason: "rewritten by policy"}
)

// inputVerdict and outputVerdict are the dispatch and exec rules.
func inputVerdict(in *operatorv1.OperatorInput) (*middlewarev1.Verdict, *operatorv1.OperatorInput) {
	switch content.TextOf(in.GetMessage()) {
	case "forbidden":
		return haltVerdict, nil
	case "rewrite me":
		return modifyVerdict, &operatorv1.OperatorInput{Message: content.Text("rewritten"), Dispatch: in.GetDispatch()}
	case "broken":
		return modifyVerdict, nil
	}
	return nil, nil
}

func outputVerdict(out *operatorv1.OperatorOutput) (*middlewarev1.Verdict, *operatorv1.OperatorOutput) {
	switch content.TextOf(out.GetMessage()) {
	case "secret answer":
		return modifyVerdict, &operatorv1.OperatorOutput{Message: content.Text("[redacted]"), ExitReason: out.GetExitReason()}
	case "leak":
		return haltVerdict, nil
	}
	return nil, nil
}

func (p *policy) InterceptDispatch(ctx context.Context, r *middlewarev1.InterceptDispatchRequest) (*middlewarev1.InterceptDispatchResponse, error) {
	if err := p.count(ctx, dispatchBoundary, r.GetPhase()); err != nil {
		return nil, err
	}
	if r.GetPhase() == before {
		v, in := inputVerdict(r.GetInput())
		return &middlewarev1.InterceptDispatchResponse{Verdict: v, Input: in}, nil
	}
	v, out := outputVerdict(r.GetOutput())
	return &middlewarev1.InterceptDispatchResponse{Verdict: v, Output: out}, nil
}

func (p *policy) InterceptExec(ctx context.Context, r *middlewarev1.InterceptExecRequest) (*middlewarev1.InterceptExecResponse, error) {
	if err := p.count(ctx, execBoundary, r.GetPhase()); err != nil {
		return nil, err
	}
	if r.GetPhase() == before {
		v, in := inputVerdict(r.GetInput())
		return &middlewarev1.InterceptExecResponse{Verdict: v, Input: in}, nil
	}
	v, out := outputVerdict(r.GetOutput())
	return &middlewarev1.InterceptExecResponse{Verdict: v, Output: out}, nil
}

func (p *policy) InterceptStore(ctx context.Context, r *middlewarev1.InterceptStoreRequest) (*middlewarev1.InterceptStoreResponse, error) {
	if err := p.count(ctx, storeBoundary, r.GetPhase()); err != nil {
		return nil, err
	}
	read := r.GetOperation() == middlewarev1.StoreOperation_STORE_OPERATION_READ
	switch {
	case r.GetPhase() == before && r.GetKey() == "forbidden":
		return &middlewarev1.InterceptStoreResponse{Verdict: haltVerdict}, nil
	case r.GetPhase() == before && r.GetOperation() == middlewarev1.StoreOperation_STORE_OPERATION_WRITE &&
		strings.Contains(r.GetValue().GetStringValue(), "hunter2"):
		return &middlewarev1.InterceptStoreResponse{Verdict: modifyVerdict, Value: structpb.NewStringValue("[redacted]")}, nil
	case r.GetPhase() == after && read && r.GetKey() == "card":
		return &middlewarev1.InterceptStoreResponse{Verdict: modifyVerdict, Value: structpb.NewStringValue("****")}, nil
	case r.GetPhase() == after && read && r.GetKey() == "hidden":
		return &middlewarev1.InterceptStoreResponse{Verdict: haltVerdict}, nil
	}
	return &middlewarev1.InterceptStoreResponse{Verdict: &middlewarev1.Verdict{Kind: middlewarev1.VerdictKind_VERDICT_KIND_CONTINUE}}, nil
}

// agent is a fake OperatorService and EnvironmentService that records the
// inputs it received and answers: "tell secret" -> "secret answer",
// "leak please" -> "leak", anything else -> "echo: <text>". Its outputs
// carry an effect and 42 input tokens.
type agent struct {
	operatorv1.UnimplementedOperatorServiceServer
	environmentv1.UnimplementedEnvironmentServiceServer

	mu       sync.Mutex
	received []string
}

func (a *agent) run(in *operatorv1.OperatorInput) *operatorv1.OperatorOutput {
	text := content.TextOf(in.GetMessage())
	a.mu.Lock()
	a.received = append(a.received, text)
	a.mu.Unlock()
	answer := "echo: " + text
	switch text {
	case "tell secret":
		answer = "secret answer"
	case "leak please":
		answer = "leak"
	}
	return &operatorv1.OperatorOutput{
		Message:    content.Text(answer),
		ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_COMPLETE},
		Metadata:   &operatorv1.OperatorMetadata{TokensIn: 42},
		Effects:    []*typesv1.Effect{{IdempotencyKey: "d/0", Kind: &typesv1.Effect_Log{Log: &typesv1.LogEffect{}}}},
	}
}

func (a *agent) Execute(_ context.Context, r *operatorv1.ExecuteRequest) (*operatorv1.ExecuteResponse, error) {
	return &operatorv1.ExecuteResponse{Output: a.run(r.GetInput())}, nil
}

func (a *agent) Run(_ context.Context, r *environmentv1.RunRequest) (*environmentv1.RunResponse, error) {
	return &environmentv1.RunResponse{Output: a.run(r.GetInput()), Backend: "fake"}, nil
}

func (a *agent) ExecuteStream(r *operatorv1.ExecuteStreamRequest, s operatorv1.OperatorService_ExecuteStreamServer) error {
	out := a.run(r.GetInput())
	if err := s.Send(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_TextDelta{
		TextDelta: &operatorv1.TextDelta{Turn: 1, Text: content.TextOf(out.GetMessage())},
	}}); err != nil {
		return err
	}
	return s.Send(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_Output{Output: out}})
}

// got returns the inputs received so far.
func (a *agent) got() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.received...)
}

// listen serves register's services on a fresh 127.0.0.1 port with a
// bare gRPC server. It returns the server (to stop it early) and its
// address.
func listen(t *testing.T, register func(*grpc.Server)) (*grpc.Server, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	register(s)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return s, lis.Addr().String()
}

// serveStandard serves register's services behind the standard chain of
// pkg/grpcserver (dev mode) with the given service interceptors.
func serveStandard(t *testing.T, register func(grpc.ServiceRegistrar), u []grpc.UnaryServerInterceptor, s []grpc.StreamServerInterceptor) string {
	t.Helper()
	srv, err := grpcserver.New(grpcserver.Config{Name: "test", Addr: "127.0.0.1:0", Dev: true}, nil, grpcserver.WithInterceptors(u, s))
	if err != nil {
		t.Fatal(err)
	}
	register(srv)
	lis, err := srv.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = srv.Serve(ctx, lis); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return lis.Addr().String()
}

// dial returns a plaintext connection to addr.
func dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// startPolicy serves p and returns a Middleware consulting it.
func startPolicy(t *testing.T, p *policy, cfg Config) *Middleware {
	t.Helper()
	_, addr := listen(t, func(s *grpc.Server) { middlewarev1.RegisterMiddlewareServiceServer(s, p) })
	m, err := New(context.Background(), middlewarev1.NewMiddlewareServiceClient(dial(t, addr)), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// closedAddr is a 127.0.0.1 address nothing listens on.
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

// syncBuffer is a log sink safe for concurrent writers and readers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func logTo(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

// input is an OperatorInput with text, dispatched to agent-7.
func input(text string) *operatorv1.OperatorInput {
	return &operatorv1.OperatorInput{Message: content.Text(text), Dispatch: &operatorv1.DispatchContext{AgentId: "agent-7"}}
}

// wantStatus fails unless err has code and (if non-empty) contains every
// fragment.
func wantStatus(t *testing.T, err error, code codes.Code, fragments ...string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != code {
		t.Fatalf("code %v (%q), want %v", st.Code(), st.Message(), code)
	}
	for _, f := range fragments {
		if !strings.Contains(st.Message(), f) {
			t.Errorf("message %q lacks %q", st.Message(), f)
		}
	}
}

func equal(a, b []string) bool { return fmt.Sprint(a) == fmt.Sprint(b) }
