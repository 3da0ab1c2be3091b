//go:build unix

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/internal/proc"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/content"
)

// peerWorld is the three real binaries of a peer-restart test: State
// (bbolt), the operator on the scripted model, and the orchestrator.
type peerWorld struct {
	t                 *testing.T
	dir               string
	stateBin, opBin   string
	stateAddr, opAddr string
	state, op         *proc.Proc
	client            orchestratorv1.OrchestratorServiceClient
	restarts          int
}

func newPeerWorld(t *testing.T) *peerWorld {
	t.Helper()
	w := &peerWorld{t: t, dir: t.TempDir(),
		stateBin: testenv.BuildStatic(t, "github.com/secbear/neuron/services/state/cmd/state"),
		opBin:    testenv.BuildStatic(t, "github.com/secbear/neuron/services/operator/cmd/operator"),
	}
	orchBin := testenv.BuildStatic(t, "github.com/secbear/neuron/services/orchestrator/cmd/orchestrator")
	// The clock starts after the builds.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	w.stateAddr, w.opAddr = proc.FreeAddr(t), proc.FreeAddr(t)
	w.startState(ctx)
	w.startOperator(ctx)

	// Each call takes 1.5 s, so a restart lands while calls are in flight.
	slow := map[string]any{"scripted": map[string]any{"turns": []any{map[string]any{"text": "done", "delay": "1500ms", "cost": "0.001"}}}}
	registry, err := json.Marshal(map[string]any{"agents": []any{map[string]any{
		"id": "slow", "operator": w.opAddr, "metadata": slow,
		// The default policy: 3 attempts, which a restart used to burn.
	}}})
	if err != nil {
		t.Fatal(err)
	}
	agents := filepath.Join(w.dir, "agents.yaml")
	if err := os.WriteFile(agents, registry, 0o600); err != nil {
		t.Fatal(err)
	}
	orchAddr := proc.FreeAddr(t)
	orch := proc.Start(t, orchBin, proc.Options{Name: "orchestrator", LogPath: filepath.Join(w.dir, "orchestrator.log"), EnvPrefix: "NEURON"},
		"--dev", "--addr", orchAddr, "--data-dir", filepath.Join(w.dir, "orch"), "--agents", agents,
		"--state-addr", w.stateAddr, "--peer-down-horizon", "1m")
	conn := dial(t, orchAddr)
	orch.WaitServing(ctx, t, healthpb.NewHealthClient(conn), "layer0.orchestrator.v1.OrchestratorService", pollInterval)
	w.client = orchestratorv1.NewOrchestratorServiceClient(conn)
	return w
}

func (w *peerWorld) startState(ctx context.Context) {
	w.t.Helper()
	w.restarts++
	w.state = proc.Start(w.t, w.stateBin, proc.Options{Name: "state", LogPath: filepath.Join(w.dir, fmt.Sprintf("state-%d.log", w.restarts)), EnvPrefix: "NEURON"},
		"--dev", "--addr", w.stateAddr, "--data-dir", filepath.Join(w.dir, "state"))
	w.state.WaitServing(ctx, w.t, healthpb.NewHealthClient(dial(w.t, w.stateAddr)), "layer0.state.v1.StateService", pollInterval)
}

func (w *peerWorld) startOperator(ctx context.Context) {
	w.t.Helper()
	w.restarts++
	w.op = proc.Start(w.t, w.opBin, proc.Options{Name: "operator", LogPath: filepath.Join(w.dir, fmt.Sprintf("operator-%d.log", w.restarts)), EnvPrefix: "NEURON"},
		"--dev", "--addr", w.opAddr, "--model", "scripted", "--state-addr", w.stateAddr, "--workspace", filepath.Join(w.dir, "workspace"))
	w.op.WaitServing(ctx, w.t, healthpb.NewHealthClient(dial(w.t, w.opAddr)), "layer0.operator.v1.OperatorService", pollInterval)
}

// startMany starts n workflows (each one call of the slow agent, in a
// session, so the operator reads its history from State) and returns
// their ids once every one is in its first call.
func (w *peerWorld) startMany(ctx context.Context, n int) []string {
	w.t.Helper()
	var ids []string
	for i := range n {
		id := fmt.Sprintf("%s-%d", w.t.Name(), i)
		session := id
		_, err := w.client.StartWorkflow(ctx, &orchestratorv1.StartWorkflowRequest{WorkflowId: id, AgentId: "slow",
			Input: &operatorv1.OperatorInput{Message: content.Text("go"), SessionId: &session, Trigger: operatorv1.TriggerType_TRIGGER_TYPE_USER}})
		if err != nil {
			w.t.Fatalf("StartWorkflow %s: %v", id, err)
		}
		ids = append(ids, id)
	}
	time.Sleep(300 * time.Millisecond) // into the calls' 1.5 s
	return ids
}

// allComplete waits until every workflow has ended and fails the test
// for each that did not complete.
func (w *peerWorld) allComplete(ctx context.Context, ids []string) {
	w.t.Helper()
	for _, id := range ids {
		for {
			r, err := w.client.GetWorkflow(ctx, &orchestratorv1.GetWorkflowRequest{WorkflowId: id})
			if err != nil {
				w.t.Fatalf("GetWorkflow %s: %v", id, err)
			}
			wf := r.GetWorkflow()
			if wf.GetStatus() == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED {
				break
			}
			if wf.GetStatus() != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING {
				w.t.Fatalf("workflow %s ended %v: %v", id, wf.GetStatus(), wf.GetFailure())
			}
			select {
			case <-ctx.Done():
				w.t.Fatalf("workflow %s still RUNNING", id)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}

// TestPeerRestartsHeal: a SIGKILL and an immediate restart of the
// operator while five workflows are in their calls fails none of them
// (the calls wait for it to come back instead of using up the agent's
// three attempts on connection errors); nor does a State service that is
// away for 3 s while workflows start and read their history.
func TestPeerRestartsHeal(t *testing.T) {
	w := newPeerWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	t.Run("operator SIGKILL and restart", func(t *testing.T) {
		ids := w.startMany(ctx, 5)
		w.op.Kill(t)
		w.startOperator(ctx)
		w.allComplete(ctx, ids)
	})

	t.Run("State away for 3s", func(t *testing.T) {
		w.state.Kill(t)
		ids := w.startMany(ctx, 5) // their calls read history from a State that is down
		time.Sleep(3 * time.Second)
		w.startState(ctx)
		w.allComplete(ctx, ids)
	})
}
