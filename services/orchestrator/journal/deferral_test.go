package journal

import (
	"context"
	"errors"
	"slices"
	"testing"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/orchestrator"
)

var canceled = orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED

// startUnnamed starts a workflow as a Dispatch that names none does, on
// the slow agent, and returns its id once its operator call has begun.
func startUnnamed(t *testing.T, e *Engine, caller *fakeCaller, id string) {
	t.Helper()
	got, existed, err := e.Start(context.Background(), &orchestrator.StartRequest{WorkflowID: id, AgentID: "slow", Unnamed: true,
		Input: &operatorv1.OperatorInput{Message: content.Text("go")}})
	if err != nil || existed || got != id {
		t.Fatalf("Start = %q, %v, %v", got, existed, err)
	}
	if started := <-caller.started; started != id {
		t.Fatalf("operator called for %q; want %q", started, id)
	}
}

// notJournaled fails unless workflow id is absent from the journal.
func notJournaled(t *testing.T, j *Journal, id string) {
	t.Helper()
	if r, err := j.Get(id); !errors.Is(err, errs.NotFound) {
		t.Fatalf("during the first operator call of an unnamed Dispatch: %+v, %v; want it not journaled yet", r, err)
	}
}

// A workflow an unnamed Dispatch started is not journaled during its
// first operator call, yet whoever names it meanwhile (GetWorkflow,
// Query, ListWorkflows, Signal, Cancel) finds it as before: looking
// journals it, RUNNING with its step's intent, and the run goes on
// from there, calling the operator once (twice with a signal: it is
// pending after step 1's intent, so a step 2 takes it).
func TestUnnamedDispatchVisibleWhileDeferred(t *testing.T) {
	for _, look := range []struct {
		name  string
		calls int
		fn    func(t *testing.T, e *Engine, id string)
	}{
		{"Get", 1, func(t *testing.T, e *Engine, id string) {
			if wf, err := e.Get(context.Background(), id); err != nil || wf.Status != running {
				t.Fatalf("Get = %+v, %v; want RUNNING", wf, err)
			}
		}},
		{"Steps", 1, func(t *testing.T, e *Engine, id string) {
			if steps, err := e.Steps(context.Background(), id); err != nil || len(steps) != 1 || steps[0].State != "running" {
				t.Fatalf("Steps = %+v, %v; want step 1 running", steps, err)
			}
		}},
		{"List", 1, func(t *testing.T, e *Engine, id string) {
			wfs, _, err := e.List(context.Background(), running, 10, "")
			if err != nil || !slices.ContainsFunc(wfs, func(wf *orchestrator.Workflow) bool { return wf.ID == id }) {
				t.Fatalf("List(RUNNING) = %+v, %v; want %s in it", wfs, err, id)
			}
		}},
		{"Signal", 2, func(t *testing.T, e *Engine, id string) {
			if seq, _, err := e.Signal(context.Background(), id, []byte{}, "k"); err != nil || seq != 1 {
				t.Fatalf("Signal = %d, %v; want sequence 1", seq, err)
			}
		}},
	} {
		t.Run(look.name, func(t *testing.T) {
			j := openT(t, t.TempDir()+"/journal.db")
			defer j.Close()
			caller := newFakeCaller()
			e := newEngine(t, j, caller)
			defer e.Close()
			id := "wf-unnamed-" + look.name
			startUnnamed(t, e, caller, id)
			notJournaled(t, j, id)
			look.fn(t, e, id)
			if r, err := j.Get(id); err != nil || r.Status != running {
				t.Fatalf("after %s: %+v, %v; want it journaled RUNNING", look.name, r, err)
			}
			if st, err := j.Step(id, 1); err != nil || st == nil || st.done() {
				t.Fatalf("after %s, step 1: %+v, %v; want its intent journaled", look.name, st, err)
			}
			close(caller.release)
			wf, err := e.Wait(context.Background(), id)
			if err != nil || wf.Status != completed {
				t.Fatalf("Wait = %+v, %v; want COMPLETED", wf, err)
			}
			if n := caller.callsOf(id); n != look.calls {
				t.Errorf("%d operator calls; want %d", n, look.calls)
			}
		})
	}
}

// A Cancel of a workflow in its deferred first call (the Dispatch
// caller went away) ends it CANCELED in the journal, as before.
func TestUnnamedDispatchCanceledWhileDeferred(t *testing.T) {
	j := openT(t, t.TempDir()+"/journal.db")
	defer j.Close()
	caller := newFakeCaller()
	e := newEngine(t, j, caller)
	defer e.Close()
	const id = "wf-unnamed-cancel"
	startUnnamed(t, e, caller, id)
	notJournaled(t, j, id)
	if wf, err := e.Cancel(context.Background(), id, "gone"); err != nil || wf.Status != canceled {
		t.Fatalf("Cancel = %+v, %v; want CANCELED", wf, err)
	}
	wf, err := e.Wait(context.Background(), id)
	if err != nil || wf.Status != canceled {
		t.Fatalf("Wait = %+v, %v; want CANCELED", wf, err)
	}
	if r, err := j.Get(id); err != nil || r.Status != canceled {
		t.Fatalf("journal: %+v, %v; want CANCELED", r, err)
	}
}

// An engine closed during the deferred first call (a graceful stop)
// journals the workflow RUNNING, as it does one that names its
// workflow, and the next engine over the journal completes it.
func TestUnnamedDispatchPausedByClose(t *testing.T) {
	path := t.TempDir() + "/journal.db"
	j := openT(t, path)
	caller := newFakeCaller()
	e := newEngine(t, j, caller)
	const id = "wf-unnamed-close"
	startUnnamed(t, e, caller, id)
	e.Close()
	if r, err := j.Get(id); err != nil || r.Status != running {
		t.Fatalf("after Close: %+v, %v; want it journaled RUNNING", r, err)
	}
	close(caller.release)
	e = newEngine(t, j, caller)
	defer e.Close()
	if n, err := e.Resume(); err != nil || n != 1 {
		t.Fatalf("Resume = %d, %v; want 1", n, err)
	}
	<-caller.started
	waitFor(t, e, id, completed)
	j.Close()
}
