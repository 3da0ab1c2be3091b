package boundarytest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	middlewarev1 "github.com/secbear/neuron/gen/layer0/middleware/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/middleware/remote"
)

// Quick is the middleware deadline of the failure tests; callers have a
// much longer one, which must not matter. Within is how long a refused or
// proceeding call may take at most.
const (
	Quick  = 150 * time.Millisecond
	Within = 2 * time.Second
)

// AgentID is the agent every Input is dispatched to.
const AgentID = "agent-7"

// Input is an OperatorInput with text, dispatched to AgentID.
func Input(text string) *operatorv1.OperatorInput {
	return &operatorv1.OperatorInput{Message: content.Text(text), Dispatch: &operatorv1.DispatchContext{AgentId: AgentID}}
}

// AgentTokens and AgentEffects are what every output of Agent carries:
// its metadata's input tokens and its number of effects.
const (
	AgentTokens  = 42
	AgentEffects = 1
)

// Agent is a fake OperatorService and EnvironmentService that records the
// inputs it received and answers each with its text, exit COMPLETE,
// AgentTokens input tokens and AgentEffects effects. ExecuteStream sends
// the text as one delta, then the output.
type Agent struct {
	operatorv1.UnimplementedOperatorServiceServer
	environmentv1.UnimplementedEnvironmentServiceServer

	mu       sync.Mutex
	received []string
}

func (a *Agent) run(in *operatorv1.OperatorInput) *operatorv1.OperatorOutput {
	text := content.TextOf(in.GetMessage())
	a.mu.Lock()
	a.received = append(a.received, text)
	a.mu.Unlock()
	return &operatorv1.OperatorOutput{
		Message:    content.Text(text),
		ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_COMPLETE},
		Metadata:   &operatorv1.OperatorMetadata{TokensIn: AgentTokens},
		Effects:    []*typesv1.Effect{{IdempotencyKey: "d/0", Kind: &typesv1.Effect_Log{Log: &typesv1.LogEffect{}}}},
	}
}

// Execute implements OperatorServiceServer.
func (a *Agent) Execute(_ context.Context, r *operatorv1.ExecuteRequest) (*operatorv1.ExecuteResponse, error) {
	return &operatorv1.ExecuteResponse{Output: a.run(r.GetInput())}, nil
}

// Run implements EnvironmentServiceServer.
func (a *Agent) Run(_ context.Context, r *environmentv1.RunRequest) (*environmentv1.RunResponse, error) {
	return &environmentv1.RunResponse{Output: a.run(r.GetInput()), Backend: "fake"}, nil
}

// ExecuteStream implements OperatorServiceServer.
func (a *Agent) ExecuteStream(r *operatorv1.ExecuteStreamRequest, s operatorv1.OperatorService_ExecuteStreamServer) error {
	out := a.run(r.GetInput())
	if err := s.Send(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_TextDelta{
		TextDelta: &operatorv1.TextDelta{Turn: 1, Text: content.TextOf(out.GetMessage())},
	}}); err != nil {
		return err
	}
	return s.Send(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_Output{Output: out}})
}

// Got returns the inputs' texts received so far.
func (a *Agent) Got() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.received...)
}

// RegisterAgent registers a as both services on r.
func RegisterAgent(r grpc.ServiceRegistrar, a *Agent) {
	operatorv1.RegisterOperatorServiceServer(r, a)
	environmentv1.RegisterEnvironmentServiceServer(r, a)
}

// Listen serves register's services on a fresh 127.0.0.1 port with a
// bare gRPC server until the test ends. It returns the server (to stop it
// early) and its address.
func Listen(t *testing.T, register func(*grpc.Server)) (*grpc.Server, string) {
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

// ServeStandard serves register's services behind the standard chain of
// pkg/grpcserver (dev mode) with the given service interceptors, as a
// service adds a boundary's interceptors, until the test ends.
func ServeStandard(t *testing.T, register func(grpc.ServiceRegistrar), u []grpc.UnaryServerInterceptor, s []grpc.StreamServerInterceptor) string {
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

// Dial returns a plaintext connection to addr, closed when the test ends.
func Dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// ServePolicy serves a MiddlewareService and returns a client of it.
func ServePolicy(t *testing.T, p middlewarev1.MiddlewareServiceServer) (*grpc.Server, middlewarev1.MiddlewareServiceClient) {
	t.Helper()
	s, addr := Listen(t, func(s *grpc.Server) { middlewarev1.RegisterMiddlewareServiceServer(s, p) })
	return s, middlewarev1.NewMiddlewareServiceClient(Dial(t, addr))
}

// StartPolicy serves p and returns a Middleware consulting it.
func StartPolicy(t *testing.T, p *Policy, cfg remote.Config) *remote.Middleware {
	t.Helper()
	_, client := ServePolicy(t, p)
	m, err := remote.New(context.Background(), client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// ClosedAddr is a 127.0.0.1 address nothing listens on.
func ClosedAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

// WantStatus fails unless err has code and its message contains every
// fragment.
func WantStatus(t *testing.T, err error, code codes.Code, fragments ...string) {
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

// Equal reports whether two lists of texts are the same.
func Equal(a, b []string) bool { return fmt.Sprint(a) == fmt.Sprint(b) }

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
