package environment_test

import (
	"context"
	"flag"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/secbear/neuron/internal/harness"
	conformance "github.com/secbear/neuron/pkg/conformance/environment"
	"github.com/secbear/neuron/pkg/conformance/internal/remote"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/services/environment"
	_ "github.com/secbear/neuron/services/environment/local" // registers the local backend
	"github.com/secbear/neuron/services/operator"
)

var (
	server      = remote.Register("EnvironmentService", "the local backend in process", "Run")
	unsupported = flag.String("unsupported", "gvisor,microvm,wasm", "comma-separated isolation boundaries the server cannot enforce")
	limits      = flag.Bool("enforces-limits", false, "the server enforces resource limits (process, docker, kubernetes backends)")
)

// TestConformance runs the suite against -addr, or in process against
// the environment service on its local backend (no isolation: it
// refuses every boundary, credential and limit) forwarding to the
// reference operator with the scripted model.
func TestConformance(t *testing.T) {
	target := conformance.Target{Unsupported: strings.Split(*unsupported, ","), EnforcesLimits: *limits}
	if server.Addr() != "" {
		target.Conn = server.Dial(t)
		conformance.Run(t, target)
		return
	}
	cfg := operator.DefaultConfig()
	cfg.Model, cfg.Tools, cfg.Workspace = "scripted", nil, t.TempDir()
	opAddr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		cfg.Server = grpcserver.Config{Name: "operator", Dev: true, ShutdownTimeout: 2 * time.Second}
		cfg.Log, cfg.Listener = harness.Quiet(), lis
		return operator.Run(ctx, cfg)
	})
	envAddr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		return environment.Run(ctx, environment.Config{
			Server: grpcserver.Config{Name: "environment", Dev: true, ShutdownTimeout: 2 * time.Second},
			Log:    harness.Quiet(), Listener: lis, Backend: "local",
			Operator: grpcclient.Config{Target: opAddr, Dev: true, Plaintext: true, Timeout: time.Minute},
		})
	})
	target.Conn = harness.Dial(t, envAddr)
	target.Unsupported = append(target.Unsupported, "process", "container")
	conformance.Run(t, target)
}
