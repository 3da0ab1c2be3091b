package grpcserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/structpb"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/interceptor/auth"
	"github.com/secbear/neuron/pkg/logging"
)

// fakeState behaves according to the key it is given, so one service can
// drive every path of the chain.
type fakeState struct {
	statev1.UnimplementedStateServiceServer
	kind *errs.Kind // returned for key "kind"
}

func (f *fakeState) Read(ctx context.Context, req *statev1.ReadRequest) (*statev1.ReadResponse, error) {
	switch req.GetKey() {
	case "panic":
		panic("secret-panic-detail /etc/passwd")
	case "raw":
		return nil, errors.New("raw-internal-detail: connection to 10.1.2.3 refused")
	case "kind":
		return nil, fmt.Errorf("key %q: %w", req.GetKey(), f.kind)
	case "slow":
		select {
		case <-time.After(300 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	who := "anonymous"
	if p := auth.PrincipalFrom(ctx); p != nil {
		who = p.Name
	}
	return &statev1.ReadResponse{Value: structpb.NewStringValue(who), Revision: 1}, nil
}

func (f *fakeState) Write(context.Context, *statev1.WriteRequest) (*statev1.WriteResponse, error) {
	return &statev1.WriteResponse{Revision: 2}, nil
}

const (
	writerToken = "writer-token-0123456789"
	readerToken = "reader-token-0123456789"
)

func testPolicy(t *testing.T) *auth.Policy {
	t.Helper()
	p, err := auth.NewPolicy([]auth.Principal{
		{Name: "orchestrator", Tokens: []string{writerToken}, Allow: []string{"*"}},
		{Name: "operator", Tokens: []string{readerToken}, Allow: []string{
			"/layer0.state.v1.StateService/Read",
			"/layer0.state.v1.StateService/List",
			"/layer0.state.v1.StateService/Search",
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type harness struct {
	conn   *grpc.ClientConn
	logs   *syncBuffer
	cancel context.CancelFunc
	done   chan error
}

// start runs a real Server with the standard chain over bufconn.
func start(t *testing.T, cfg Config, fake *fakeState, opts ...Option) *harness {
	t.Helper()
	logs := &syncBuffer{}
	log, err := logging.New(logs, logging.Options{Format: "json", Level: "debug"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Name == "" {
		cfg.Name = "test"
	}
	srv, err := New(cfg, log, opts...)
	if err != nil {
		t.Fatal(err)
	}
	statev1.RegisterStateServiceServer(srv, fake)
	lis := bufconn.Listen(1 << 20)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{conn: conn, logs: logs, cancel: cancel, done: done}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return h
}

func withToken(t *testing.T, tok string) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
}

func read(key string) *statev1.ReadRequest {
	return &statev1.ReadRequest{Scope: &typesv1.Scope{Kind: &typesv1.Scope_Global{Global: &typesv1.GlobalScope{}}}, Key: key}
}

func TestPanicBecomesInternalWithoutLeak(t *testing.T) {
	h := start(t, Config{Dev: true}, &fakeState{})
	c := statev1.NewStateServiceClient(h.conn)
	_, err := c.Read(context.Background(), read("panic"))
	st := status.Convert(err)
	if st.Code() != codes.Internal || st.Message() != "internal error" {
		t.Fatalf("got %v %q, want INTERNAL \"internal error\"", st.Code(), st.Message())
	}
	if !strings.Contains(h.logs.String(), "secret-panic-detail") {
		t.Errorf("panic detail missing from server logs")
	}
	// The server survives: the next call works.
	if _, err := c.Read(context.Background(), read("ok")); err != nil {
		t.Fatalf("after panic: %v", err)
	}
}

func TestUnknownErrorTextNeverLeaks(t *testing.T) {
	h := start(t, Config{Dev: true}, &fakeState{})
	_, err := statev1.NewStateServiceClient(h.conn).Read(context.Background(), read("raw"))
	st := status.Convert(err)
	if st.Code() != codes.Internal || st.Message() != "internal error" {
		t.Fatalf("got %v %q", st.Code(), st.Message())
	}
	if strings.Contains(err.Error(), "10.1.2.3") {
		t.Fatalf("internal detail leaked: %v", err)
	}
	if !strings.Contains(h.logs.String(), "10.1.2.3") {
		t.Errorf("internal detail missing from logs")
	}
}

func TestKindsMapToDocumentedCodes(t *testing.T) {
	fake := &fakeState{}
	h := start(t, Config{Dev: true}, fake)
	c := statev1.NewStateServiceClient(h.conn)
	for _, k := range errs.Kinds() {
		t.Run(k.Error(), func(t *testing.T) {
			fake.kind = k
			_, err := c.Read(context.Background(), read("kind"))
			if got := status.Code(err); got != k.Code() {
				t.Fatalf("code %v, want %v", got, k.Code())
			}
			if got := errs.Reason(err); got != k.Reason() {
				t.Errorf("reason %q, want %q", got, k.Reason())
			}
			// The client side classifies the error back to the same kind.
			if k != errs.Internal && !errors.Is(errs.FromGRPC(err), k) {
				t.Errorf("FromGRPC(%v) is not %v", err, k)
			}
		})
	}
}

func TestValidationRejectsBadRequests(t *testing.T) {
	h := start(t, Config{Dev: true}, &fakeState{})
	c := statev1.NewStateServiceClient(h.conn)
	tests := []struct {
		name string
		req  *statev1.ReadRequest
		want string
	}{
		{"empty key", read(""), "key"},
		{"no scope", &statev1.ReadRequest{Key: "k"}, "scope"},
		{"scope without kind", &statev1.ReadRequest{Scope: &typesv1.Scope{}, Key: "k"}, "kind"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.Read(context.Background(), tt.req)
			st := status.Convert(err)
			if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tt.want) {
				t.Fatalf("got %v %q, want INVALID_ARGUMENT naming %q", st.Code(), st.Message(), tt.want)
			}
		})
	}
}

func TestAuth(t *testing.T) {
	h := start(t, Config{Plaintext: true}, &fakeState{}, WithPolicy(testPolicy(t)))
	c := statev1.NewStateServiceClient(h.conn)
	write := &statev1.WriteRequest{Scope: read("k").Scope, Key: "k", Value: structpb.NewNullValue()}
	tests := []struct {
		name  string
		ctx   context.Context
		write bool
		code  codes.Code
	}{
		{"no credentials", context.Background(), false, codes.Unauthenticated},
		{"unknown token", withToken(t, "not-a-known-token-at-all"), false, codes.Unauthenticated},
		{"malformed header", metadata.AppendToOutgoingContext(context.Background(), "authorization", "Basic abc"), false, codes.Unauthenticated},
		{"reader reads", withToken(t, readerToken), false, codes.OK},
		{"reader writes", withToken(t, readerToken), true, codes.PermissionDenied},
		{"writer writes", withToken(t, writerToken), true, codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			if tt.write {
				_, err = c.Write(tt.ctx, write)
			} else {
				_, err = c.Read(tt.ctx, read("k"))
			}
			if got := status.Code(err); got != tt.code {
				t.Fatalf("code %v (%v), want %v", got, err, tt.code)
			}
		})
	}
	// Auth runs before validation: an unauthenticated caller learns nothing
	// about the request's shape.
	if _, err := c.Read(context.Background(), read("")); status.Code(err) != codes.Unauthenticated {
		t.Errorf("invalid unauthenticated request: %v, want UNAUTHENTICATED", err)
	}
	// The principal reaches the handler.
	resp, err := c.Read(withToken(t, readerToken), read("k"))
	if err != nil || resp.GetValue().GetStringValue() != "operator" {
		t.Errorf("principal in handler: %v %v", resp, err)
	}
	// Tokens never reach the logs.
	if strings.Contains(h.logs.String(), readerToken) || strings.Contains(h.logs.String(), writerToken) {
		t.Errorf("token in logs: %s", h.logs.String())
	}
	if !strings.Contains(h.logs.String(), `"principal":"operator"`) {
		t.Errorf("call log lacks the principal: %s", h.logs.String())
	}
}

func TestHealthAndReflectionNeedNoCredentials(t *testing.T) {
	h := start(t, Config{Plaintext: true}, &fakeState{}, WithPolicy(testPolicy(t)))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	hc := healthpb.NewHealthClient(h.conn)
	for _, svc := range []string{"", "layer0.state.v1.StateService"} {
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health %q: %v %v", svc, resp, err)
		}
	}
	names := listServices(t, ctx, h.conn)
	for _, want := range []string{"layer0.state.v1.StateService", "grpc.health.v1.Health"} {
		if !names[want] {
			t.Errorf("reflection does not list %s: %v", want, names)
		}
	}
}

// listServices is what `grpcurl list` does.
func listServices(t *testing.T, ctx context.Context, conn *grpc.ClientConn) map[string]bool {
	t.Helper()
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{},
	}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, s := range resp.GetListServicesResponse().GetService() {
		names[s.GetName()] = true
	}
	return names
}

func TestShutdownTurnsHealthNotServing(t *testing.T) {
	h := start(t, Config{Dev: true, ShutdownTimeout: 5 * time.Second}, &fakeState{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	watch, err := healthpb.NewHealthClient(h.conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := watch.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first status %v %v", r, err)
	}
	// An in-flight call finishes during the graceful stop.
	slow := make(chan error, 1)
	go func() {
		_, err := statev1.NewStateServiceClient(h.conn).Read(ctx, read("slow"))
		slow <- err
	}()
	time.Sleep(50 * time.Millisecond)
	h.cancel()
	if r, err := watch.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("status during shutdown %v %v, want NOT_SERVING", r, err)
	}
	if err := <-slow; err != nil {
		t.Fatalf("in-flight call cut by graceful stop: %v", err)
	}
}

func TestInsecureConfigRefused(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no policy", Config{Plaintext: true}, "--auth-policy"},
		{"no tls", Config{AuthPolicy: "p.json"}, "--tls-cert"},
		{"half a key pair", Config{Dev: true, TLSCert: "c.pem"}, "--tls-key"},
		{"mtls without cert", Config{Dev: true, ClientCA: "ca.pem"}, "--tls-client-ca"},
		{"missing policy file", Config{Plaintext: true, AuthPolicy: "/nonexistent/policy.json"}, "auth policy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg, nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error naming %q", err, tt.want)
			}
		})
	}
}

func TestDevModeAnnounced(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	if _, err := New(Config{Dev: true}, log); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "DEVELOPMENT MODE") {
		t.Fatalf("dev mode not announced: %s", buf.String())
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
