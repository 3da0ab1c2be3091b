//go:build unix

package benchmark

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/internal/benchkit"
	"github.com/secbear/neuron/internal/floor"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/logging"
	"github.com/secbear/neuron/services/orchestrator/journal"
	"github.com/secbear/neuron/services/orchestrator/serve"
	"github.com/secbear/neuron/services/state"
)

// concurrencies are the numbers of goroutines issuing calls at once. They
// are explicit goroutines (not RunParallel, which multiplies by
// GOMAXPROCS), all sharing one client connection.
var concurrencies = []int{1, 64}

// agentID is the registry's one agent, on the trivial operator.
const agentID = "echo"

// BenchmarkDispatch is one Dispatch per op, each a new one-step workflow
// on the trivial operator.
func BenchmarkDispatch(b *testing.B) {
	log := discardLogger(b)
	benchDispatch(b, startOrchestrator(b, log, startOperator(b)))
}

// BenchmarkDispatchNoSync is BenchmarkDispatch over a journal opened
// without fsyncs (journal.WithoutSync): the same gRPC hops, server chain
// and journal writes, with no durability. NOT a production mode: it
// shows how much of a dispatch is the disk's fsync and how much the rest
// (two gRPC hops, the journal's CPU, the operator process).
func BenchmarkDispatchNoSync(b *testing.B) {
	log := discardLogger(b)
	cfg := config(b, log, startOperator(b))
	cfg.Backend, cfg.DataDir = serve.BackendBolt, b.TempDir()
	cfg.JournalOptions = []journal.OpenOption{journal.WithoutSync()}
	benchDispatch(b, serveOrchestrator(b, cfg))
}

// BenchmarkDispatchFloor is BenchmarkDispatch's work with nothing of
// ours in the orchestrator's place: internal/floor's orchestrator (a
// bare grpc-go server that streams the call, writes the transcript entry
// to the same State and makes one fsynced bbolt commit) in front of its
// trivial operator. What the design costs on this machine: Dispatch
// cannot be cheaper than this.
func BenchmarkDispatchFloor(b *testing.B) {
	db, err := floor.OpenDB(b.TempDir(), "journal.db")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = db.Close() })
	ops := grpc.NewServer()
	operatorv1.RegisterOperatorServiceServer(ops, floor.TrivialOperator())
	opAddr := serveBare(b, ops)
	gs := grpc.NewServer()
	orchestratorv1.RegisterOrchestratorServiceServer(gs, floor.NewOrchestrator(db,
		statev1.NewStateServiceClient(dial(b, startState(b))), operatorv1.NewOperatorServiceClient(dial(b, opAddr))))
	benchDispatch(b, orchestratorv1.NewOrchestratorServiceClient(dial(b, serveBare(b, gs))))
}

// BenchmarkDispatchTemporal is BenchmarkDispatch on the Temporal backend,
// against a Temporal dev server (SQLite) started for it; it skips where
// none can be started (scripts/temporal.sh builds one).
func BenchmarkDispatchTemporal(b *testing.B) {
	dev := testenv.Temporal(b)
	log := discardLogger(b)
	benchDispatch(b, startTemporal(b, dev, log, startOperator(b)))
}

func benchDispatch(b *testing.B, client orchestratorv1.OrchestratorServiceClient) {
	req := &orchestratorv1.DispatchRequest{AgentId: agentID, Input: &operatorv1.OperatorInput{Message: content.Text("ping")}}
	call := func() error {
		resp, err := client.Dispatch(context.Background(), req)
		if err != nil {
			return err
		}
		if k := resp.GetOutput().GetExitReason().GetKind(); k != operatorv1.ExitKind_EXIT_KIND_COMPLETE {
			return fmt.Errorf("workflow %s ended with exit %s", resp.GetWorkflowId(), k)
		}
		return nil
	}
	if err := call(); err != nil { // warm up both connections
		b.Fatal(err)
	}
	forEachConc(b, "dispatches/s", call)
}

// BenchmarkEcho is one Execute per op on the trivial operator, called
// directly: the cost of a gRPC round trip and nothing else.
func BenchmarkEcho(b *testing.B) {
	client := operatorv1.NewOperatorServiceClient(dial(b, startOperator(b)))
	req := &operatorv1.ExecuteRequest{Input: &operatorv1.OperatorInput{Message: content.Text("ping")}}
	call := func() error {
		resp, err := client.Execute(context.Background(), req)
		if err != nil {
			return err
		}
		if k := resp.GetOutput().GetExitReason().GetKind(); k != operatorv1.ExitKind_EXIT_KIND_COMPLETE {
			return fmt.Errorf("exit %s", k)
		}
		return nil
	}
	if err := call(); err != nil {
		b.Fatal(err)
	}
	forEachConc(b, "calls/s", call)
}

func forEachConc(b *testing.B, unit string, call func() error) {
	for _, conc := range concurrencies {
		b.Run(fmt.Sprintf("c=%d", conc), func(b *testing.B) {
			r := benchkit.Concurrent(b, conc, func(int, int) error { return call() })
			r.Report(b, unit)
			b.ReportMetric(benchkit.Micros(r.CPU)/float64(b.N), "cpu-us/op")
		})
	}
}

// discardLogger formats JSON at info level as the binary does, to
// io.Discard: the cost of the log lines is in, the terminal's is not.
func discardLogger(b *testing.B) *slog.Logger {
	log, err := logging.New(io.Discard, logging.Options{Level: "info", Format: "json", Service: "orchestrator"})
	if err != nil {
		b.Fatal(err)
	}
	return log
}

// trivialOperator answers Execute at once: the request's message back,
// EXIT_KIND_COMPLETE, no cost, no effects.
type trivialOperator struct {
	operatorv1.UnimplementedOperatorServiceServer
}

func (trivialOperator) Execute(_ context.Context, req *operatorv1.ExecuteRequest) (*operatorv1.ExecuteResponse, error) {
	return &operatorv1.ExecuteResponse{Output: &operatorv1.OperatorOutput{
		Message:    req.GetInput().GetMessage(),
		ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_COMPLETE},
	}}, nil
}

// startOperator serves trivialOperator on a bare grpc-go server (no
// options, no interceptors) on loopback TCP and returns its address.
func startOperator(b *testing.B) string {
	b.Helper()
	gs := grpc.NewServer()
	operatorv1.RegisterOperatorServiceServer(gs, trivialOperator{})
	return serveBare(b, gs)
}

// startState serves an in-memory StateService on a grpc-go server with
// the errs mapping the state binary's chain does (the Temporal backend
// tells a missing key by its NOT_FOUND).
func startState(b *testing.B) string {
	b.Helper()
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		if err != nil {
			return nil, errs.ToStatus(err).Err()
		}
		return resp, nil
	}))
	statev1.RegisterStateServiceServer(gs, state.NewServer(state.NewMemory()))
	return serveBare(b, gs)
}

func serveBare(b *testing.B, gs *grpc.Server) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- gs.Serve(lis) }()
	b.Cleanup(func() {
		gs.Stop()
		if err := <-done; err != nil {
			b.Error(err)
		}
	})
	return lis.Addr().String()
}

// startTemporal serves the orchestrator on the Temporal backend through
// serve.Run, as cmd/orchestrator does with --backend temporal, with one
// agent on the operator at opAddr.
func startTemporal(b *testing.B, dev *testenv.TemporalDev, log *slog.Logger, opAddr string) orchestratorv1.OrchestratorServiceClient {
	cfg := config(b, log, opAddr)
	cfg.Backend = serve.BackendTemporal
	cfg.Temporal = serve.Temporal{Address: dev.Address, Namespace: dev.Namespace}
	return serveOrchestrator(b, cfg)
}

// startOrchestrator serves the orchestrator through serve.Run, as
// cmd/orchestrator does (without the optional remote middleware), over a
// journal in a temporary directory, with one agent on the operator at
// opAddr, and returns a client of it.
func startOrchestrator(b *testing.B, log *slog.Logger, opAddr string) orchestratorv1.OrchestratorServiceClient {
	cfg := config(b, log, opAddr)
	cfg.Backend, cfg.DataDir = serve.BackendBolt, b.TempDir()
	return serveOrchestrator(b, cfg)
}

// config is the orchestrator's Config: dev mode, a registry of one agent
// on the operator at opAddr, an in-memory State service.
func config(b *testing.B, log *slog.Logger, opAddr string) serve.Config {
	b.Helper()
	agents := filepath.Join(b.TempDir(), "agents.yaml")
	if err := os.WriteFile(agents, fmt.Appendf(nil, "agents:\n  - id: %s\n    operator: %q\n", agentID, opAddr), 0o600); err != nil {
		b.Fatal(err)
	}
	return serve.Config{
		Server: grpcserver.Config{Name: "orchestrator", Dev: true},
		Log:    log,
		Agents: agents,
		State:  grpcclient.Config{Target: startState(b)},
	}
}

// serveOrchestrator runs serve.Run with cfg until the benchmark ends and
// returns a client of it.
func serveOrchestrator(b *testing.B, cfg serve.Config) orchestratorv1.OrchestratorServiceClient {
	b.Helper()
	addr := harness.Serve(b, func(ctx context.Context, lis net.Listener) error {
		cfg.Listener = lis
		return serve.Run(ctx, cfg)
	})
	return orchestratorv1.NewOrchestratorServiceClient(dial(b, addr))
}

// dial returns one plain client connection, the same for the orchestrator
// and the echo server, so the comparison is of the servers.
func dial(b *testing.B, addr string) *grpc.ClientConn {
	b.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	return conn
}
