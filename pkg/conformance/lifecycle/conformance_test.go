package lifecycle_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/conformance/internal/remote"
	conformance "github.com/secbear/neuron/pkg/conformance/lifecycle"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/lifecycle"
	orchserve "github.com/secbear/neuron/services/orchestrator/serve"
	"github.com/secbear/neuron/services/state"
)

var server = remote.Register("LifecycleService", "the reference implementations in process", "Subscribe and Publish")

// TestConformance runs the suite against -addr, or in process against
// pkg/lifecycle's server over a bus of the default size and against the
// orchestrator's LifecycleService.
func TestConformance(t *testing.T) {
	if server.Addr() != "" {
		conformance.Run(t, conformance.Target{Conn: server.Dial(t)})
		return
	}
	t.Run("Bus", func(t *testing.T) {
		a := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
			gs, err := grpcserver.New(grpcserver.Config{Name: "lifecycle", Dev: true, ShutdownTimeout: 2 * time.Second}, harness.Quiet())
			if err != nil {
				return err
			}
			lifecyclev1.RegisterLifecycleServiceServer(gs, lifecycle.NewServer(lifecycle.NewBus(lifecycle.Options{}), lifecycle.WithShutdown(ctx)))
			return gs.Serve(ctx, lis)
		})
		conformance.Run(t, conformance.Target{Conn: harness.Dial(t, a)})
	})
	t.Run("Orchestrator", func(t *testing.T) {
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
	})
}
