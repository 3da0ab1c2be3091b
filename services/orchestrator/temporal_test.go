package orchestrator_test

import (
	"testing"
	"time"

	"google.golang.org/grpc"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/lifecycle"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/services/orchestrator"
	"github.com/secbear/neuron/services/orchestrator/temporal"
)

// startTemporalOrch runs an orchestrator on the Temporal backend (a
// worker and the gRPC server) against dev, stopped when the test ends.
func startTemporalOrch(t *testing.T, dev *testenv.TemporalDev, registry []byte, stateAddr string, o orchOptions) *orch {
	t.Helper()
	reg, err := orchestrator.ParseRegistry(registry)
	if err != nil {
		t.Fatal(err)
	}
	chain := append([]grpc.UnaryClientInterceptor{orchestrator.AuditInterceptor(quiet()), orchestrator.BudgetInterceptor()}, o.chain...)
	caller := orchestrator.NewGRPCCaller(grpcclient.Config{Dev: true}, grpcclient.Config{Dev: true}, chain...)
	stateConn, err := grpcclient.Dial(grpcclient.Config{Target: stateAddr, Dev: true})
	if err != nil {
		t.Fatal(err)
	}
	bus := lifecycle.NewBus(lifecycle.Options{StartSequence: uint64(time.Now().UnixMilli()) * 1_000_000})
	if o.engine.Log == nil {
		o.engine.Log = quiet()
	}
	tq := "neuron-" + t.Name()
	tb := temporal.New(dev.Client, orchestrator.Deps{Registry: reg, Caller: caller, State: statev1.NewStateServiceClient(stateConn), Bus: bus}, temporal.Options{
		TaskQueue: tq, HeartbeatTimeout: 2 * time.Second, Engine: o.engine,
	})
	if err := tb.StartWorker(); err != nil {
		t.Fatal(err)
	}
	addr := serve(t, func(s *grpcserver.Server) {
		orchestratorv1.RegisterOrchestratorServiceServer(s, orchestrator.NewServer(tb, o.engine.Workers))
		lifecyclev1.RegisterLifecycleServiceServer(s, lifecycle.NewServer(bus, lifecycle.WithWorkflowLog(tb, 50*time.Millisecond)))
	})
	t.Cleanup(func() {
		tb.Stop()
		bus.Close()
		caller.Close()
		stateConn.Close()
	})
	cc := dial(t, addr)
	return &orch{addr: addr, bus: bus, client: orchestratorv1.NewOrchestratorServiceClient(cc),
		events: lifecyclev1.NewLifecycleServiceClient(cc), stop: tb.Stop,
		replay: func(t *testing.T, id, name string) { replayHistory(t, dev.Client, id, name) }}
}

func TestTemporalEndToEnd(t *testing.T) {
	dev := testenv.Temporal(t)
	stateAddr, st, writes := startState(t)
	opAddr := startOperator(t, stateAddr)
	o := startTemporalOrch(t, dev, registryYAML(t, e2eAgents(opAddr)...), stateAddr, orchOptions{})
	testEndToEnd(t, o, st, writes)
}

// starter starts an orchestrator on one backend.
type starter func(t *testing.T, registry []byte, stateAddr string, o orchOptions) *orch

// backends runs a test on the bbolt backend and on the Temporal backend
// (with a dev server of its own; skipped where none can be started).
func backends(t *testing.T, test func(t *testing.T, start starter)) {
	t.Run("bolt", func(t *testing.T) {
		test(t, func(t *testing.T, registry []byte, stateAddr string, o orchOptions) *orch {
			return startOrch(t, t.TempDir(), registry, stateAddr, o)
		})
	})
	t.Run("temporal", func(t *testing.T) {
		dev := testenv.Temporal(t)
		test(t, func(t *testing.T, registry []byte, stateAddr string, o orchOptions) *orch {
			return startTemporalOrch(t, dev, registry, stateAddr, o)
		})
	})
}
