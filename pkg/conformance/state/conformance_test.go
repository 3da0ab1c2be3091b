package state_test

import (
	"context"
	"encoding/json"
	"flag"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/conformance/internal/remote"
	conformance "github.com/secbear/neuron/pkg/conformance/state"
	"github.com/secbear/neuron/pkg/embed"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/interceptor/auth"
	"github.com/secbear/neuron/services/state"
)

var (
	server            = remote.Register("StateService", "start the reference service in process", "every method")
	readOnlyTokenFile = flag.String("readonly-token-file", "", "file holding a bearer token allowed only Read, List and Search")
	maxKeyBytes       = flag.Int("max-key-bytes", conformance.DefaultMaxKeyBytes, "the server's key size limit")
	maxValueBytes     = flag.Int("max-value-bytes", conformance.DefaultMaxValueBytes, "the server's value size limit")
)

// The limits of the in-process servers: not the defaults, so the suite is
// seen to follow the configured limits.
var inProcessLimits = state.Limits{MaxKeyBytes: 1024, MaxValueBytes: 64 << 10}

// TestConformance runs the suite against -addr, or against the reference
// service over bbolt and over memory.
func TestConformance(t *testing.T) {
	if server.Addr() != "" {
		t.Run("remote", func(t *testing.T) { conformance.Run(t, remoteTarget(t)) })
		return
	}
	backends := []struct {
		name string
		open func(t *testing.T) state.Backend
	}{
		{"bolt", func(t *testing.T) state.Backend {
			b, err := state.OpenBolt(filepath.Join(t.TempDir(), "state.db"), state.WithLimits(inProcessLimits))
			if err != nil {
				t.Fatal(err)
			}
			return b
		}},
		{"memory", func(t *testing.T) state.Backend { return state.NewMemory(state.WithLimits(inProcessLimits)) }},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			store := b.open(t)
			t.Cleanup(func() { // runs last: after the servers stopped
				if err := store.Close(); err != nil {
					t.Errorf("close %s backend: %v", b.name, err)
				}
			})
			conformance.Run(t, inProcessTarget(t, store))
		})
	}
}

// remoteTarget dials -addr with the flags' credentials.
func remoteTarget(t *testing.T) conformance.Target {
	dial := func(tokenFile string) *grpc.ClientConn {
		return remote.Dial(t, server.Config(server.Addr(), tokenFile))
	}
	target := conformance.Target{Conn: server.Dial(t), MaxKeyBytes: *maxKeyBytes, MaxValueBytes: *maxValueBytes}
	if *readOnlyTokenFile != "" {
		target.ReadOnly = dial(*readOnlyTokenFile)
	}
	if server.TokenFile() != "" || *readOnlyTokenFile != "" {
		target.Anonymous = dial("")
	}
	return target
}

// inProcessTarget serves store twice on loopback through the standard
// server chain: in dev mode (no auth), which the suite writes through,
// and with an auth policy of a writer and a read-only operator, for the
// access checks. Both serve the same store.
func inProcessTarget(t *testing.T, store state.Backend) conformance.Target {
	dir := t.TempDir()
	readerTok := writeToken(t, dir, "reader.tok", "reader-token-0123456789abcdef")
	principals := []auth.Principal{
		{Name: "orchestrator", Tokens: []string{"writer-token-0123456789abcdef"}, Allow: []string{"*"}},
		{Name: "operator", Tokens: []string{"reader-token-0123456789abcdef"}, Allow: []string{
			"/layer0.state.v1.StateService/Read",
			"/layer0.state.v1.StateService/List",
			"/layer0.state.v1.StateService/Search",
		}},
	}
	policy, err := json.Marshal(map[string]any{"principals": principals})
	if err != nil {
		t.Fatal(err)
	}
	policyFile := filepath.Join(dir, "policy.json")
	if err := os.WriteFile(policyFile, policy, 0o600); err != nil {
		t.Fatal(err)
	}
	devAddr := serve(t, grpcserver.Config{Name: "state", Dev: true}, store, embed.Test{})
	authAddr := serve(t, grpcserver.Config{Name: "state", Plaintext: true, AuthPolicy: policyFile}, store, nil)

	target := conformance.Target{
		Conn:          remote.Dial(t, grpcclient.Config{Target: devAddr, Dev: true}),
		ReadOnly:      remote.Dial(t, grpcclient.Config{Target: authAddr, Plaintext: true, TokenFile: readerTok}),
		Anonymous:     remote.Dial(t, grpcclient.Config{Target: authAddr, Plaintext: true}),
		MaxKeyBytes:   inProcessLimits.MaxKeyBytes,
		MaxValueBytes: inProcessLimits.MaxValueBytes,
		Embedder:      conformance.EmbedderTest,

		RetentionMaxEntries: confRetention[0].MaxEntries,
	}
	waitServing(t, target.Conn.(*grpc.ClientConn))
	waitServing(t, target.Anonymous.(*grpc.ClientConn)) // health needs no credential
	return target
}

// confRetention is the retention rule the in-process servers enforce,
// for the suite's Retention group (Target.RetentionMaxEntries).
var confRetention = []state.RetentionRule{{Scope: "custom", Prefix: conformance.RetentionPrefix, MaxEntries: 3}}

// serve runs the state service over backend as its binary starts it
// (state.Run: the standard chain, the audit log), with embedder (nil:
// none) and the retention rule confRetention swept every 100 ms, until
// the test ends.
func serve(t *testing.T, cfg grpcserver.Config, backend state.Backend, embedder embed.Embedder) string {
	t.Helper()
	return harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		return state.Run(ctx, state.Config{Server: cfg, Listener: lis, Store: backend, Embedder: embedder,
			Retention: confRetention, RetentionInterval: 100 * time.Millisecond})
	})
}

func writeToken(t *testing.T, dir, name, token string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// waitServing waits until the server behind conn reports the service
// SERVING (Serve sets it just after it starts accepting).
func waitServing(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	hc := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		res, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "layer0.state.v1.StateService"})
		cancel()
		if err == nil && res.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("server did not become SERVING: %v %v", res.GetStatus(), err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
