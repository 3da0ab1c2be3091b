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
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/services/environment"
	_ "github.com/secbear/neuron/services/environment/local" // registers the local backend
	"github.com/secbear/neuron/services/operator"
)

var (
	addr        = flag.String("addr", "", "EnvironmentService to check (host:port); empty: the local backend in process")
	tokenFile   = flag.String("token-file", "", "file holding a bearer token allowed Run")
	useTLS      = flag.Bool("tls", false, "connect with TLS (implied by -ca)")
	caFile      = flag.String("ca", "", "CA bundle that signed the server's certificate")
	serverName  = flag.String("server-name", "", "server name to verify in the server's certificate")
	unsupported = flag.String("unsupported", "gvisor,microvm,wasm", "comma-separated isolation boundaries the server cannot enforce")
	limits      = flag.Bool("enforces-limits", false, "the server enforces resource limits (process, docker, kubernetes backends)")
)

// TestConformance runs the suite against -addr, or in process against
// the environment service on its local backend (no isolation: it
// refuses every boundary, credential and limit) forwarding to the
// reference operator with the scripted model.
func TestConformance(t *testing.T) {
	target := conformance.Target{Unsupported: strings.Split(*unsupported, ","), EnforcesLimits: *limits}
	if *addr != "" {
		secure := *useTLS || *caFile != ""
		conn, err := grpcclient.Dial(grpcclient.Config{Target: *addr, Plaintext: !secure, CAFile: *caFile, ServerName: *serverName, TokenFile: *tokenFile})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		target.Conn = conn
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
