package agent_test

import (
	"context"
	"flag"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/secbear/neuron/internal/harness"
	conformance "github.com/secbear/neuron/pkg/conformance/agent"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	orchserve "github.com/secbear/neuron/services/orchestrator/serve"
	"github.com/secbear/neuron/services/state"
)

var (
	addr       = flag.String("addr", "", "AgentService to check (host:port); empty: start the reference orchestrator in process")
	tokenFile  = flag.String("token-file", "", "file holding a bearer token allowed every AgentService method")
	useTLS     = flag.Bool("tls", false, "connect with TLS (implied by -ca)")
	caFile     = flag.String("ca", "", "CA bundle that signed the server's certificate")
	serverName = flag.String("server-name", "", "server name to verify in the server's certificate")
)

// TestConformance runs the suite against -addr, or against the
// orchestrator's AgentService over an in-process State service.
func TestConformance(t *testing.T) {
	if *addr != "" {
		secure := *useTLS || *caFile != ""
		conformance.Run(t, conformance.Target{Conn: dial(t, grpcclient.Config{Target: *addr, Plaintext: !secure, CAFile: *caFile, ServerName: *serverName, TokenFile: *tokenFile})})
		return
	}
	stateAddr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		return state.Run(ctx, state.Config{Server: grpcserver.Config{Dev: true, ShutdownTimeout: 2 * time.Second},
			Log: harness.Quiet(), Listener: lis, Backend: state.BackendMemory})
	})
	dir := t.TempDir()
	registry := filepath.Join(dir, "agents.yaml")
	if err := os.WriteFile(registry, []byte("agents: [{id: seeded, operator: 127.0.0.1:1}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	orchAddr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		return orchserve.Run(ctx, orchserve.Config{
			Server: grpcserver.Config{Name: "orchestrator", Dev: true, ShutdownTimeout: 2 * time.Second},
			Log:    harness.Quiet(), Listener: lis, Agents: registry,
			State:   grpcclient.Config{Target: stateAddr},
			DataDir: filepath.Join(dir, "journal"),
		})
	})
	conformance.Run(t, conformance.Target{Conn: harness.Dial(t, orchAddr)})
}

func dial(t *testing.T, cfg grpcclient.Config) *grpc.ClientConn {
	t.Helper()
	conn, err := grpcclient.Dial(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}
