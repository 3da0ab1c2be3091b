package orchestrator_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/services/operator"
	"github.com/secbear/neuron/services/orchestrator"
	// Named so: serve is this package's helper serving the fakes.
	orchserve "github.com/secbear/neuron/services/orchestrator/serve"
	"github.com/secbear/neuron/services/state"
)

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// writeCounter counts the writes a State service applied (not the
// replays it recognised), per scope and key: exactly-once shows as 1.
type writeCounter struct {
	mu sync.Mutex
	n  map[string]int
}

// StoreServerInterceptor makes c a state.StoreMiddleware.
func (c *writeCounter) StoreServerInterceptor() grpc.UnaryServerInterceptor { return c.interceptor }

func (c *writeCounter) interceptor(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	if w, ok := req.(*statev1.WriteRequest); ok && err == nil && !resp.(*statev1.WriteResponse).GetReplayed() {
		c.mu.Lock()
		c.n[scope.String(w.GetScope())+"|"+w.GetKey()]++
		c.mu.Unlock()
	}
	return resp, err
}

func (c *writeCounter) count(sc *typesv1.Scope, key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[scope.String(sc)+"|"+key]
}

// startState runs the State service (state.Run, the memory backend)
// with a writeCounter as its store middleware, counting the writes it
// applies.
func startState(t *testing.T) (string, statev1.StateServiceClient, *writeCounter) {
	wc := &writeCounter{n: map[string]int{}}
	addr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		return state.Run(ctx, state.Config{Server: grpcserver.Config{Dev: true, ShutdownTimeout: 2 * time.Second},
			Log: quiet(), Listener: lis, Backend: state.BackendMemory, Middleware: wc})
	})
	return addr, statev1.NewStateServiceClient(dial(t, addr)), wc
}

// startOperator runs the operator service (operator.Run) on the
// scripted model, which reads its script from each agent's registry
// metadata, with the effect tools and session history from the State
// service.
func startOperator(t *testing.T, stateAddr string) string {
	t.Helper()
	return harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		cfg := operator.DefaultConfig()
		cfg.Server = grpcserver.Config{Name: "operator", Dev: true, ShutdownTimeout: 2 * time.Second}
		cfg.Log, cfg.Listener = quiet(), lis
		cfg.Model = "scripted"
		cfg.Tools = nil // the effect tools only
		cfg.State = grpcclient.Config{Target: stateAddr}
		return operator.Run(ctx, cfg)
	})
}

// orch is an orchestrator under test.
type orch struct {
	addr    string
	client  orchestratorv1.OrchestratorServiceClient
	events  lifecyclev1.LifecycleServiceClient
	journal string
	// stop ends the orchestrator as a SIGTERM would (its Run's context
	// ends): the engine pauses first, its workflows left to resume, then
	// the server stops. It returns once Run has, the journal closed.
	stop func()
	// replay replays a workflow's Temporal history on this build (and
	// records it under name when asked); nil on the bbolt backend.
	replay func(t *testing.T, id, name string)
}

// replayed checks that workflow id's history replays, on the Temporal
// backend; a no-op on the bbolt one.
func (o *orch) replayed(t *testing.T, id, name string) {
	if o.replay != nil {
		o.replay(t, id, name)
	}
}

// orchOptions adjust startOrch.
type orchOptions struct {
	// engine is orchserve.Config.Engine.
	engine orchestrator.Options
	// chain is orchserve.Config.DispatchInterceptors.
	chain []grpc.UnaryClientInterceptor
	// approvalTimeout is orchserve.Config.ApprovalTimeout.
	approvalTimeout time.Duration
}

// registryYAML renders agents as a registry file (JSON is YAML).
func registryYAML(t *testing.T, agents ...map[string]any) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"agents": agents})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// orchConfig is the Config of an orchestrator under test: dev mode, the
// registry written to a file, the State service at stateAddr, a short
// event-log poll, o's engine options and interceptors.
func orchConfig(t *testing.T, registry []byte, stateAddr string, o orchOptions) orchserve.Config {
	t.Helper()
	agents := filepath.Join(t.TempDir(), "agents.yaml")
	if err := os.WriteFile(agents, registry, 0o600); err != nil {
		t.Fatal(err)
	}
	return orchserve.Config{
		Server:               grpcserver.Config{Name: "orchestrator", Dev: true, ShutdownTimeout: 2 * time.Second},
		Log:                  harness.Quiet(),
		Agents:               agents,
		State:                grpcclient.Config{Target: stateAddr},
		DispatchInterceptors: o.chain,
		Engine:               o.engine,
		EventLogPoll:         50 * time.Millisecond,
		ApprovalTimeout:      o.approvalTimeout,
	}
}

// runOrch serves cfg through orchserve.Run (harness.Serve) until the test
// ends or stop is called.
func runOrch(t *testing.T, cfg orchserve.Config) *orch {
	t.Helper()
	stopCtx, stopRun := context.WithCancel(context.Background())
	t.Cleanup(stopRun)
	returned := make(chan struct{})
	addr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		defer close(returned)
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(stopCtx, cancel)()
		cfg.Listener = lis
		return orchserve.Run(ctx, cfg)
	})
	cc := harness.Dial(t, addr)
	return &orch{addr: addr, client: orchestratorv1.NewOrchestratorServiceClient(cc),
		events: lifecyclev1.NewLifecycleServiceClient(cc),
		stop:   func() { stopRun(); <-returned }}
}

// startOrch runs an orchestrator over a journal in dir (the binary's
// --backend bolt --data-dir dir), stopped when the test ends.
func startOrch(t *testing.T, dir string, registry []byte, stateAddr string, o orchOptions) *orch {
	t.Helper()
	cfg := orchConfig(t, registry, stateAddr, o)
	cfg.Backend, cfg.DataDir, cfg.LockTimeout = orchserve.BackendBolt, dir, time.Second
	o2 := runOrch(t, cfg)
	o2.journal = filepath.Join(dir, "journal.db")
	return o2
}

// script is a scripted-model script as registry metadata.
func script(turns []map[string]any, cases ...map[string]any) map[string]any {
	s := map[string]any{"turns": turns}
	if len(cases) > 0 {
		s["cases"] = cases
	}
	return map[string]any{"scripted": s}
}

func call(name string, args map[string]any) map[string]any {
	return map[string]any{"name": name, "arguments": args}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func must[T any](t *testing.T) func(v T, err error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// jsonOf renders a value as compact JSON.
func jsonOf(t *testing.T, v *structpb.Value) string {
	t.Helper()
	b, err := json.Marshal(v.AsInterface())
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
