package grpcclient

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
)

// flaky fails with the given code a number of times, then answers.
type flaky struct {
	statev1.UnimplementedStateServiceServer
	failures int32
	code     codes.Code
	calls    atomic.Int32
	deadline atomic.Bool
	auth     atomic.Value
}

func (f *flaky) Read(ctx context.Context, _ *statev1.ReadRequest) (*statev1.ReadResponse, error) {
	n := f.calls.Add(1)
	_, has := ctx.Deadline()
	f.deadline.Store(has)
	if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get("authorization")) > 0 {
		f.auth.Store(md.Get("authorization")[0])
	}
	if n <= f.failures {
		return nil, status.Error(f.code, "try again")
	}
	return &statev1.ReadResponse{Revision: 1}, nil
}

func serve(t *testing.T, f *flaky, cfg Config) statev1.StateServiceClient {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	s := grpc.NewServer()
	statev1.RegisterStateServiceServer(s, f)
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	cfg.Target = "passthrough:///bufnet"
	cfg.Dev = true
	conn, err := Dial(cfg, grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return statev1.NewStateServiceClient(conn)
}

func TestRetriesUnavailableOnly(t *testing.T) {
	tests := []struct {
		name      string
		failures  int32
		code      codes.Code
		wantCode  codes.Code
		wantCalls int32
	}{
		{"unavailable twice then ok", 2, codes.Unavailable, codes.OK, 3},
		{"unavailable beyond max", 10, codes.Unavailable, codes.Unavailable, 4}, // 1 + 3 retries
		{"invalid argument not retried", 1, codes.InvalidArgument, codes.InvalidArgument, 1},
		{"internal not retried", 1, codes.Internal, codes.Internal, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &flaky{failures: tt.failures, code: tt.code}
			c := serve(t, f, Config{})
			_, err := c.Read(context.Background(), &statev1.ReadRequest{})
			if status.Code(err) != tt.wantCode || f.calls.Load() != tt.wantCalls {
				t.Fatalf("code %v after %d calls, want %v after %d", status.Code(err), f.calls.Load(), tt.wantCode, tt.wantCalls)
			}
		})
	}
}

func TestDefaultDeadlineAndToken(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("tok-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := &flaky{}
	c := serve(t, f, Config{Timeout: time.Second, TokenFile: tok})
	if _, err := c.Read(context.Background(), &statev1.ReadRequest{}); err != nil {
		t.Fatal(err)
	}
	if !f.deadline.Load() {
		t.Error("call without a deadline reached the server without one")
	}
	if got, _ := f.auth.Load().(string); got != "Bearer tok-0123456789abcdef" {
		t.Errorf("authorization %q", got)
	}
}

func TestDialErrors(t *testing.T) {
	if _, err := Dial(Config{}); err == nil {
		t.Error("empty target accepted")
	}
	if _, err := Dial(Config{Target: "x:1", Dev: true, TokenFile: "/nonexistent"}); err == nil {
		t.Error("missing token file accepted")
	}
	if _, err := Dial(Config{Target: "x:1", CertFile: "c.pem"}); err == nil {
		t.Error("certificate without key accepted")
	}
}
