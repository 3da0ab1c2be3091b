package journal

import (
	"context"
	"testing"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/services/orchestrator"
)

// RunEnd's channel is the run's: while the workflow runs its log has not
// ended, and once the channel is closed Events says it has, so a
// watcher woken by it ends its stream at once.
func TestRunEnd(t *testing.T) {
	j := openT(t, t.TempDir()+"/journal.db")
	defer j.Close()
	caller := newFakeCaller()
	e := newEngine(t, j, caller)
	defer e.Close()
	ctx := context.Background()
	if c := e.RunEnd(ctx, "none"); c != nil {
		t.Fatal("RunEnd of a workflow that does not run: not nil")
	}
	id, _, err := e.Start(ctx, &orchestrator.StartRequest{WorkflowID: "slow-1", AgentID: "slow", Input: &operatorv1.OperatorInput{Message: content.Text("go")}, Detached: true})
	if err != nil {
		t.Fatal(err)
	}
	<-caller.started
	end := e.RunEnd(ctx, id)
	if end == nil {
		t.Fatal("RunEnd of a running workflow: nil")
	}
	if _, ended, err := e.Events(ctx, id, 0); err != nil || ended {
		t.Fatalf("Events while it runs: ended %v, %v", ended, err)
	}
	close(caller.release)
	<-end
	evs, ended, err := e.Events(ctx, id, 0)
	if err != nil || !ended {
		t.Fatalf("Events once the run ended: ended %v, %v; want ended", ended, err)
	}
	if last := evs[len(evs)-1].GetObservable().GetEventType(); last != "orchestrator.workflow.completed" {
		t.Errorf("last event %q; want the ending event", last)
	}
	if c := e.RunEnd(ctx, id); c != nil {
		t.Error("RunEnd of an ended workflow: not nil")
	}
}
