package operator_test

import (
	"context"
	"flag"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/conformance/internal/remote"
	conformance "github.com/secbear/neuron/pkg/conformance/operator"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/services/operator"
)

var (
	server  = remote.Register("OperatorService", "start the reference operator in process", "Execute and ExecuteStream")
	breaker = flag.Int("circuit-breaker", 0, "the server's limit of consecutive failed tool calls; 0 skips that check")
)

// TestConformance runs the suite against -addr, or against the reference
// operator (services/operator, as the binary serves it with --model
// scripted) in process.
func TestConformance(t *testing.T) {
	if server.Addr() != "" {
		conformance.Run(t, conformance.Target{Conn: server.Dial(t), CircuitBreaker: *breaker})
		return
	}
	conformance.Run(t, conformance.Target{Conn: serveReference(t), CircuitBreaker: operator.DefaultCircuitBreaker})
}

// serveReference starts the reference operator with the binary's
// defaults, the scripted model and no file tools.
func serveReference(t *testing.T) *grpc.ClientConn {
	t.Helper()
	cfg := operator.DefaultConfig()
	cfg.Model = "scripted"
	cfg.Tools = nil
	cfg.Workspace = t.TempDir()
	a := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		cfg.Server = grpcserver.Config{Name: "operator", Dev: true, ShutdownTimeout: 2 * time.Second}
		cfg.Log = harness.Quiet()
		cfg.Listener = lis
		return operator.Run(ctx, cfg)
	})
	return harness.Dial(t, a)
}
