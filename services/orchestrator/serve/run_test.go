package serve_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/services/orchestrator/serve"
)

// TestRunRefusesABadConfig checks that a Config Run cannot serve is an
// error naming the flag to fix, returned before anything is served, and
// that Run closes the Listener it was given either way.
func TestRunRefusesABadConfig(t *testing.T) {
	dir := t.TempDir()
	agents := filepath.Join(dir, "agents.yaml")
	if err := os.WriteFile(agents, []byte("agents:\n  - id: a\n    operator: 127.0.0.1:1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	notADir := filepath.Join(dir, "file")
	if err := os.WriteFile(notADir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ok := func() serve.Config {
		return serve.Config{Server: grpcserver.Config{Dev: true}, Agents: agents,
			State: grpcclient.Config{Target: "127.0.0.1:1"}, DataDir: filepath.Join(t.TempDir(), "data")}
	}
	for _, tc := range []struct {
		name string
		edit func(*serve.Config)
		want string
	}{
		{"no registry", func(c *serve.Config) { c.Agents = "" }, "--agents is required"},
		{"no state", func(c *serve.Config) { c.State.Target = "" }, "--state-addr is required"},
		{"unknown backend", func(c *serve.Config) { c.Backend = "sqlite" }, `--backend "sqlite": want bolt or temporal`},
		{"temporal without address", func(c *serve.Config) { c.Backend = serve.BackendTemporal }, "--backend temporal needs --temporal-address"},
		{"warn fraction above 1", func(c *serve.Config) { c.Engine.WarnFraction = decimal.RequireFromString("1.5") }, `--budget-warn-fraction "1.5"`},
		{"warn fraction below 0", func(c *serve.Config) { c.Engine.WarnFraction = decimal.RequireFromString("-0.1") }, `--budget-warn-fraction "-0.1"`},
		{"missing registry", func(c *serve.Config) { c.Agents = filepath.Join(dir, "none.yaml") }, "none.yaml"},
		{"data dir is a file", func(c *serve.Config) { c.DataDir = notADir }, "--data-dir"},
		{"retention below a minute", func(c *serve.Config) { c.Retention = 30 * time.Second }, "--retention 30s: want 0 (keep finished workflows for any age) or at least 1m0s"},
		{"insecure server", func(c *serve.Config) { c.Server.Dev = false }, "--auth-policy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			cfg := ok()
			tc.edit(&cfg)
			cfg.Listener = lis
			err = serve.Run(context.Background(), cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run: %v; want an error containing %q", err, tc.want)
			}
			if _, err := lis.Accept(); err == nil {
				t.Error("the listener is still open after Run returned")
			}
		})
	}
}

// TestRunServesUntilItsContextEnds checks a good Config: Run serves on
// the Listener until its context ends, then returns nil with the journal
// closed (the next Run opens it within a short lock timeout).
func TestRunServesUntilItsContextEnds(t *testing.T) {
	dir := t.TempDir()
	agents := filepath.Join(dir, "agents.yaml")
	if err := os.WriteFile(agents, []byte("agents:\n  - id: a\n    operator: 127.0.0.1:1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := serve.Config{Server: grpcserver.Config{Dev: true, ShutdownTimeout: time.Second}, Log: harness.Quiet(),
		Agents: agents, State: grpcclient.Config{Target: "127.0.0.1:1"},
		DataDir: filepath.Join(dir, "data"), LockTimeout: 200 * time.Millisecond}
	for i := range 2 {
		t.Run(fmt.Sprint("run ", i+1), func(t *testing.T) {
			// Serve fails the test unless Run reports SERVING, and
			// returns nil once the test ends.
			harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
				cfg := cfg
				cfg.Listener = lis
				return serve.Run(ctx, cfg)
			})
		})
	}
}

// TestRunCapsLifecycleStreams checks that Run passes the lifecycle
// limits to the LifecycleService: with one stream per client, a second
// Subscribe from the same address is refused at once, naming the flag
// and the value it was given.
func TestRunCapsLifecycleStreams(t *testing.T) {
	dir := t.TempDir()
	agents := filepath.Join(dir, "agents.yaml")
	if err := os.WriteFile(agents, []byte("agents:\n  - id: a\n    operator: 127.0.0.1:1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := serve.Config{Server: grpcserver.Config{Dev: true, ShutdownTimeout: time.Second}, Log: harness.Quiet(),
		Agents: agents, State: grpcclient.Config{Target: "127.0.0.1:1"}, DataDir: filepath.Join(dir, "data"),
		MaxStreamsPerClient: 1}
	addr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		cfg := cfg
		cfg.Listener = lis
		return serve.Run(ctx, cfg)
	})
	client := lifecyclev1.NewLifecycleServiceClient(harness.Dial(t, addr))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first, err := client.Subscribe(ctx, &lifecyclev1.SubscribeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if md, err := first.Header(); md == nil || err != nil {
		t.Fatalf("the first stream: headers %v, %v; want it subscribed", md, err)
	}
	second, err := client.Subscribe(ctx, &lifecyclev1.SubscribeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = second.Recv()
	want := "(--lifecycle-max-streams-per-client=1)"
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), want) {
		t.Fatalf("the second stream: %v; want RESOURCE_EXHAUSTED naming %s", err, want)
	}
}
