package integration

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"google.golang.org/grpc"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/internal/testenv"
	conformance "github.com/secbear/neuron/pkg/conformance/state"
)

// stateService is the StateService's name in grpc.health.v1.
const stateService = "layer0.state.v1.StateService"

// TestSwapStateImplementations runs the services as processes: the State
// service over bbolt, the operator and the orchestrator. A workflow
// writes memory; then the State service is stopped and another
// implementation takes its address while the operator and orchestrator
// keep running: the memory backend of the same binary, then (when
// Python's grpcio and a protoc for its stubs are installed:
// scripts/client-deps.sh) the Python StateService of testdata/pystate.
// After each swap the new server holds none of the old data, the
// workflow passes again through the orchestrator's reconnected client,
// and the state conformance suite passes against it.
func TestSwapStateImplementations(t *testing.T) {
	bins := binaries(t)
	dir := t.TempDir()
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + dir}

	bolt := startProc(t, "state (bolt)", []string{bins["state"], "--dev", "--addr", "127.0.0.1:0",
		"--backend", "bolt", "--data-dir", filepath.Join(dir, "state")}, env)
	stateAddr := bolt.addr
	op := startProc(t, "operator", []string{bins["operator"], "--dev", "--addr", "127.0.0.1:0",
		"--tools", "read,write,edit", "--workspace", filepath.Join(dir, "workspace"), "--state-addr", stateAddr}, env)
	agents := filepath.Join(dir, "agents.yaml")
	if err := os.WriteFile(agents, registry(op.addr), 0o644); err != nil {
		t.Fatal(err)
	}
	orch := startProc(t, "orchestrator", []string{bins["orchestrator"], "--dev", "--addr", "127.0.0.1:0",
		"--agents", agents, "--state-addr", stateAddr, "--data-dir", filepath.Join(dir, "orchestrator")}, env)
	orchClient := orchestratorv1.NewOrchestratorServiceClient(dial(t, orch.addr))

	boltRun := newMemoryWorkflow(t, "bolt")
	boltRun.run(t, orchClient, statev1.NewStateServiceClient(dial(t, stateAddr)))
	t.Logf("workflow %s wrote %q through the orchestrator at %s into the bolt State service at %s", boltRun.id, boltRun.key, orch.addr, stateAddr)

	// swap stops current and starts the next implementation on its
	// address, then checks the operator and orchestrator kept running and
	// the new server is empty of prev's key; it returns a fresh
	// connection to the new server, once it reports SERVING.
	swap := func(t *testing.T, current *proc, name string, argv, env []string, prev memoryWorkflow) (*proc, *grpc.ClientConn) {
		t.Helper()
		current.stopClean(t)
		next := startProc(t, name, argv, env)
		if next.addr != stateAddr {
			t.Fatalf("%s serves at %s, want the old address %s", name, next.addr, stateAddr)
		}
		for _, p := range []*proc{op, orch} {
			if s := p.state(); s != "running" {
				t.Fatalf("%s stopped while the State service was swapped: %s", p.name, s)
			}
		}
		conn := dial(t, stateAddr)
		waitHealthy(t, conn, stateService)
		prev.wantMissing(t, statev1.NewStateServiceClient(conn))
		return next, conn
	}

	mem, memConn := swap(t, bolt, "state (memory)", []string{bins["state"], "--dev", "--addr", stateAddr, "--backend", "memory"}, env, boltRun)
	memRun := newMemoryWorkflow(t, "memory")
	memRun.run(t, orchClient, statev1.NewStateServiceClient(memConn))
	t.Logf("after the swap to the memory backend, workflow %s wrote %q through the same orchestrator", memRun.id, memRun.key)
	t.Run("MemoryConformance", func(t *testing.T) {
		conformance.Run(t, conformance.Target{Conn: memConn})
	})

	t.Run("Python", func(t *testing.T) {
		root := repoRoot(t)
		stubs, missing := testenv.PythonStubs(t, root,
			"layer0/state/v1/state.proto", "layer0/types/v1/scope.proto", "buf/validate/validate.proto")
		if missing != "" {
			t.Skip(missing)
		}
		server := filepath.Join(root, "test", "integration", "testdata", "pystate", "state_server.py")
		pyEnv := append(slices.Clone(env), "PYTHONPATH="+stubs, "PYTHONDONTWRITEBYTECODE=1")
		_, pyConn := swap(t, mem, "state (python)", []string{testenv.Python, server, "--addr", stateAddr}, pyEnv, memRun)
		pyRun := newMemoryWorkflow(t, "python")
		pyRun.run(t, orchClient, statev1.NewStateServiceClient(pyConn))
		t.Logf("after the swap to the Python StateService, workflow %s wrote %q through the same orchestrator", pyRun.id, pyRun.key)
		t.Run("Conformance", func(t *testing.T) {
			conformance.Run(t, conformance.Target{Conn: pyConn})
		})
	})
}

// TestScaleBackends runs the same memory-writing workflow through the
// real binaries with both engines users grow into swapped in: the State
// service on PostgreSQL (two replicas on one database, the workflow's
// memory read back from the replica the orchestrator did not write to)
// and the orchestrator on Temporal. It skips where PostgreSQL or the
// Temporal CLI is missing (make test-deps installs both).
func TestScaleBackends(t *testing.T) {
	dsn := testenv.Postgres(t)
	dev := testenv.Temporal(t)
	bins := binaries(t)
	dir := t.TempDir()
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + dir}
	dsnFile := filepath.Join(dir, "state.dsn")
	if err := os.WriteFile(dsnFile, []byte(dsn), 0o600); err != nil {
		t.Fatal(err)
	}
	stateArgs := func() []string {
		return []string{bins["state"], "--dev", "--addr", "127.0.0.1:0", "--backend", "postgres", "--postgres-dsn-file", dsnFile}
	}
	first := startProc(t, "state (postgres 1)", stateArgs(), env)
	second := startProc(t, "state (postgres 2)", stateArgs(), env)
	op := startProc(t, "operator", []string{bins["operator"], "--dev", "--addr", "127.0.0.1:0",
		"--tools", "read,write,edit", "--workspace", filepath.Join(dir, "workspace"), "--state-addr", first.addr}, env)
	agents := filepath.Join(dir, "agents.yaml")
	if err := os.WriteFile(agents, registry(op.addr), 0o644); err != nil {
		t.Fatal(err)
	}
	orch := startProc(t, "orchestrator (temporal)", []string{bins["orchestrator"], "--dev", "--addr", "127.0.0.1:0",
		"--agents", agents, "--state-addr", first.addr, "--backend", "temporal", "--temporal-address", dev.Address,
		"--temporal-namespace", dev.Namespace, "--temporal-task-queue", "neuron-scale-test"}, env)
	run := newMemoryWorkflow(t, "scale")
	run.run(t, orchestratorv1.NewOrchestratorServiceClient(dial(t, orch.addr)), statev1.NewStateServiceClient(dial(t, second.addr)))
	t.Logf("workflow %s ran on Temporal (%s) and wrote %q into PostgreSQL through %s; read back through %s", run.id, dev.Address, run.key, first.addr, second.addr)
	t.Run("StateConformance", func(t *testing.T) {
		conformance.Run(t, conformance.Target{Conn: dial(t, second.addr)})
	})
}
