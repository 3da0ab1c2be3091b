package agent_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/secbear/neuron/internal/harness"
	conformance "github.com/secbear/neuron/pkg/conformance/agent"
	"github.com/secbear/neuron/pkg/conformance/internal/remote"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	orchserve "github.com/secbear/neuron/services/orchestrator/serve"
	"github.com/secbear/neuron/services/state"
)

var server = remote.Register("AgentService", "start the reference orchestrator in process", "every AgentService method")

// TestConformance runs the suite against -addr, or against the
// orchestrator's AgentService over an in-process State service.
func TestConformance(t *testing.T) {
	if server.Addr() != "" {
		conformance.Run(t, conformance.Target{Conn: server.Dial(t)})
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
