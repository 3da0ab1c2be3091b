package orchestrator_test

import (
	"context"
	"sync"
	"testing"
	"time"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/services/orchestrator"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// endingEngine is an Engine whose one workflow has logged its ending
// event but still runs (its log ends once the run has ended), as a
// journal run is between its last commit and leaving the run table.
type endingEngine struct {
	orchestrator.Engine // only Events, Get and RunEnd are called
	mu                  sync.Mutex
	running             bool
	done                chan struct{}
	looks               chan struct{} // a token per Events call
}

func (e *endingEngine) Events(_ context.Context, _ string, after uint64) ([]*lifecyclev1.LifecycleEvent, bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.looks <- struct{}{}
	var evs []*lifecyclev1.LifecycleEvent
	if after == 0 {
		evs = append(evs, &lifecyclev1.LifecycleEvent{WorkflowSequence: 1})
	}
	return evs, !e.running, nil
}

func (e *endingEngine) Get(_ context.Context, id string) (*orchestrator.Workflow, error) {
	return &orchestrator.Workflow{ID: id, Status: orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED}, nil
}

func (e *endingEngine) RunEnd(_ context.Context, _ string) <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.running {
		return nil
	}
	return e.done
}

func (e *endingEngine) end() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.running = false
	close(e.done)
}

// A watcher whose workflow's run ends after its ending event was read
// gets the end when the run ends, not at its next look: with a poll of
// an hour and no event to wake it, the stream still ends.
func TestWatchWorkflowEndsWithTheRun(t *testing.T) {
	e := &endingEngine{running: true, done: make(chan struct{}), looks: make(chan struct{}, 100)}
	addr := harness.ServeFake(t, "orchestrator", func(s *grpcserver.Server) {
		orchestratorv1.RegisterOrchestratorServiceServer(s, orchestrator.NewServer(e, 1, orchestrator.WithWatch(nil, time.Hour, nil)))
	})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := ctxT(t)
	stream, err := orchestratorv1.NewOrchestratorServiceClient(conn).WatchWorkflow(ctx, &orchestratorv1.WatchWorkflowRequest{WorkflowId: "wf-1"})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := stream.Recv(); err != nil || resp.GetEvent().GetWorkflowSequence() != 1 {
		t.Fatalf("first = %v, %v; want event 1", resp, err)
	}
	<-e.looks
	<-e.looks // the look after the event found the workflow still running: the watcher waits
	e.end()
	resp, err := stream.Recv()
	if err != nil || resp.GetEnd().GetStatus() != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED {
		t.Fatalf("after the run ended: %v, %v; want the end", resp, err)
	}
	if n := len(e.looks); n != 1 {
		t.Errorf("%d looks after the run ended; want 1", n)
	}
}
