package middleware_test

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	middlewarev1 "github.com/secbear/neuron/gen/layer0/middleware/v1"
	"github.com/secbear/neuron/internal/harness"
	conformance "github.com/secbear/neuron/pkg/conformance/middleware"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/middleware/remote"
	"github.com/secbear/neuron/services/operator"
	orchserve "github.com/secbear/neuron/services/orchestrator/serve"
	"github.com/secbear/neuron/services/state"
)

var (
	addr    = flag.String("addr", "", "MiddlewareService to check, deployed with the conformance policy (host:port, plaintext); empty: the reference Policy in process")
	callers = flag.Bool("callers", true, "also put the reference State, operator and orchestrator in front of it, in process, and check what they do with its verdicts")
)

// TestConformance runs the suite against -addr, or against
// conformance.Policy served in process; with -callers (the default) the
// reference callers of each boundary consult the same middleware.
func TestConformance(t *testing.T) {
	target := *addr
	if target == "" {
		target = harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
			gs, err := grpcserver.New(grpcserver.Config{Name: "middleware", Dev: true, ShutdownTimeout: 2 * time.Second}, harness.Quiet())
			if err != nil {
				return err
			}
			middlewarev1.RegisterMiddlewareServiceServer(gs, conformance.Policy{})
			return gs.Serve(ctx, lis)
		})
	}
	conn, err := grpcclient.Dial(grpcclient.Config{Target: target, Plaintext: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	tg := conformance.Target{Conn: conn}
	if *callers {
		tg.Callers = func(t *testing.T) conformance.Callers { return startCallers(t, target) }
	}
	conformance.Run(t, tg)
}

// startCallers starts, in process, a State service, an operator and an
// orchestrator each consulting the middleware at mw at its boundary, and
// a plain operator for the orchestrator's agent.
func startCallers(t *testing.T, mw string) conformance.Callers {
	t.Helper()
	flags := remote.Flags{Client: grpcclient.Config{Target: mw}}
	storeMW, closeMW, err := remote.Dial(t.Context(), remote.Flags{Client: grpcclient.Config{Target: mw, Plaintext: true}}, harness.Quiet())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeMW)
	stateAddr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		return state.Run(ctx, state.Config{Server: grpcserver.Config{Dev: true, ShutdownTimeout: 2 * time.Second},
			Log: harness.Quiet(), Listener: lis, Backend: state.BackendMemory, Middleware: storeMW})
	})
	plainState := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		return state.Run(ctx, state.Config{Server: grpcserver.Config{Dev: true, ShutdownTimeout: 2 * time.Second},
			Log: harness.Quiet(), Listener: lis, Backend: state.BackendMemory})
	})
	startOperator := func(withMW bool) string {
		cfg := operator.DefaultConfig()
		cfg.Model, cfg.Tools, cfg.Workspace = "scripted", nil, t.TempDir()
		if withMW {
			cfg.Middleware = flags
		}
		return harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
			cfg.Server = grpcserver.Config{Name: "operator", Dev: true, ShutdownTimeout: 2 * time.Second}
			cfg.Log, cfg.Listener = harness.Quiet(), lis
			return operator.Run(ctx, cfg)
		})
	}
	opAddr := startOperator(true)
	plainOp := startOperator(false)
	dir := t.TempDir()
	registry := filepath.Join(dir, "agents.yaml")
	if err := os.WriteFile(registry, fmt.Appendf(nil, "agents: [{id: echo, operator: %q}]\n", plainOp), 0o600); err != nil {
		t.Fatal(err)
	}
	orchAddr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		return orchserve.Run(ctx, orchserve.Config{
			Server: grpcserver.Config{Name: "orchestrator", Dev: true, ShutdownTimeout: 2 * time.Second},
			Log:    harness.Quiet(), Listener: lis, Agents: registry,
			State:      grpcclient.Config{Target: plainState},
			DataDir:    filepath.Join(dir, "journal"),
			Middleware: flags,
		})
	})
	return conformance.Callers{
		Operator: harness.Dial(t, opAddr), State: harness.Dial(t, stateAddr),
		Orchestrator: harness.Dial(t, orchAddr), Agent: "echo",
	}
}
