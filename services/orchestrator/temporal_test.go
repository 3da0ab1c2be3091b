package orchestrator_test

import (
	"testing"
	"time"

	"github.com/secbear/neuron/internal/testenv"
	orchserve "github.com/secbear/neuron/services/orchestrator/serve"
)

// startTemporalOrch runs an orchestrator on the Temporal backend (the
// binary's --backend temporal, a worker on a task queue of the test's
// own) against dev, stopped when the test ends.
func startTemporalOrch(t *testing.T, dev *testenv.TemporalDev, registry []byte, stateAddr string, o orchOptions) *orch {
	t.Helper()
	cfg := orchConfig(t, registry, stateAddr, o)
	cfg.Backend = orchserve.BackendTemporal
	cfg.Temporal = orchserve.Temporal{Address: dev.Address, Namespace: dev.Namespace,
		TaskQueue: "neuron-" + t.Name(), HeartbeatTimeout: 2 * time.Second}
	o2 := runOrch(t, cfg)
	o2.replay = func(t *testing.T, id, name string) { replayHistory(t, dev.Client, id, name) }
	return o2
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
