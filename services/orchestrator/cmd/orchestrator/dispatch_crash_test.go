//go:build unix

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/internal/proc"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/services/state"
)

// gateOperator holds every call until released, telling entered the
// workflow of each call that began; once released it answers at once.
type gateOperator struct {
	operatorv1.UnimplementedOperatorServiceServer
	entered chan string
	release chan struct{}
	mu      sync.Mutex
	calls   map[string]int // by workflow id
}

func (g *gateOperator) Execute(ctx context.Context, req *operatorv1.ExecuteRequest) (*operatorv1.ExecuteResponse, error) {
	id := req.GetInput().GetDispatch().GetWorkflowId()
	g.mu.Lock()
	g.calls[id]++
	g.mu.Unlock()
	select {
	case g.entered <- id:
	default:
	}
	select {
	case <-g.release:
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return &operatorv1.ExecuteResponse{Output: &operatorv1.OperatorOutput{Message: req.GetInput().GetMessage(),
		ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_COMPLETE}}}, nil
}

func (g *gateOperator) callsOf(id string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls[id]
}

// A SIGKILL during the operator call of two one-step Dispatches: the one
// that named its workflow was journaled before the call, so the next
// run resumes it and it completes; the one that named none was not (its
// creation waits for the step's result: one commit per dispatch), so
// it has left nothing behind: no workflow, and nothing RUNNING to
// resume. Its caller saw UNAVAILABLE and may dispatch again.
func TestDispatchKilledDuringOperatorCall(t *testing.T) {
	dir := t.TempDir()
	h := &world{t: t, bin: testenv.BuildStatic(t, "github.com/secbear/neuron/services/orchestrator/cmd/orchestrator"),
		backend: []string{"--data-dir", filepath.Join(dir, "data")}, logDir: dir}
	h.stateAddr = harness.ServeFake(t, "state", func(s *grpcserver.Server) {
		statev1.RegisterStateServiceServer(s, state.NewServer(state.NewMemory()))
	})
	op := &gateOperator{entered: make(chan string, 8), release: make(chan struct{}), calls: map[string]int{}}
	opAddr := harness.ServeFake(t, "operator", func(s *grpcserver.Server) { operatorv1.RegisterOperatorServiceServer(s, op) })
	h.agents = filepath.Join(dir, "agents.yaml")
	if err := os.WriteFile(h.agents, fmt.Appendf(nil, "agents:\n  - id: gate\n    operator: %s\n", opAddr), 0o600); err != nil {
		t.Fatal(err)
	}
	h.connect(proc.FreeAddr(t))
	ctx, cancel := context.WithTimeout(context.Background(), crashBudget)
	defer cancel()

	p := h.start(ctx)
	const named = "named-1"
	errc := make(chan error, 2)
	for _, id := range []string{named, ""} {
		go func() {
			// A deadline well past the restart: the resumed workflow
			// keeps its caller's.
			cctx, cancel := context.WithTimeout(ctx, crashBudget)
			defer cancel()
			_, err := h.client.Dispatch(cctx, &orchestratorv1.DispatchRequest{WorkflowId: id, AgentId: "gate",
				Input: &operatorv1.OperatorInput{Message: content.Text("hold")}})
			errc <- err
		}()
	}
	var unnamed string
	for range 2 {
		select {
		case id := <-op.entered:
			if id != named {
				unnamed = id
			}
		case <-ctx.Done():
			t.Fatal("the operator calls did not begin")
		}
	}
	if unnamed == "" {
		t.Fatal("no operator call for the Dispatch that named no workflow")
	}
	h.kill(p)
	for range 2 {
		if err := <-errc; status.Code(err) != codes.Unavailable {
			t.Errorf("Dispatch killed in its operator call: %v; want UNAVAILABLE", err)
		}
	}

	close(op.release)
	p = h.start(ctx)
	if n := resumed(p); n != 1 {
		t.Errorf("the restarted orchestrator resumed %d workflows; want 1 (%s)", n, named)
	}
	h.waitStatus(ctx, named, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)
	if n := op.callsOf(named); n != 2 {
		t.Errorf("%d operator calls for %s; want 2 (the one the kill cut, then the resumed one)", n, named)
	}
	if _, err := h.tryGetWorkflow(ctx, unnamed); status.Code(err) != codes.NotFound {
		t.Errorf("GetWorkflow of %s, the unnamed Dispatch's workflow, after the restart: %v; want NOT_FOUND", unnamed, err)
	}
	list, err := h.client.ListWorkflows(ctx, &orchestratorv1.ListWorkflowsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, wf := range list.GetWorkflows() {
		if wf.GetWorkflowId() != named {
			t.Errorf("after the restart the journal holds %s (%v); want only %s", wf.GetWorkflowId(), wf.GetStatus(), named)
		}
	}
	if n := op.callsOf(unnamed); n != 1 {
		t.Errorf("%d operator calls for %s; want 1 (nothing resumed it)", n, unnamed)
	}
	p.Terminate(t)
}
