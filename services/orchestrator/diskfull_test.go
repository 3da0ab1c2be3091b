package orchestrator_test

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/services/state"
)

// bigText needs fresh pages wherever it is written (about 300 KiB).
var bigText = strings.Repeat("the quick brown fox jumps over the lazy dog ", 7000)

// waitFor polls GetWorkflow until ok says yes or ctx ends.
func waitFor(t *testing.T, ctx context.Context, o *orch, id string, what string, ok func(*orchestratorv1.Workflow) bool) *orchestratorv1.Workflow {
	t.Helper()
	var last *orchestratorv1.Workflow
	for {
		r, err := o.client.GetWorkflow(ctx, &orchestratorv1.GetWorkflowRequest{WorkflowId: id})
		if err == nil {
			last = r.GetWorkflow()
			if ok(last) {
				return last
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("workflow %s: %s did not happen; last seen %v, waiting %v, failure %v (err %v)", id, what,
				last.GetStatus(), last.GetWaiting(), last.GetFailure(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestJournalDiskFull: when the journal's disk fills during a workflow,
// its Dispatch fails at once with RESOURCE_EXHAUSTED (STORAGE_FULL)
// instead of hanging, the workflow stays RUNNING and says what it waits
// for, reads keep being served, and once space is freed the workflow
// completes by itself, with no restart, and new dispatches work.
func TestJournalDiskFull(t *testing.T) {
	ctx := ctxT(t)
	dir := testenv.SmallFS(t, 4<<20)
	stateAddr, _, _ := startState(t)
	release := make(chan struct{})
	var calls atomic.Int32
	_, opAddr := startFake(t, map[string]behaviour{
		"big": func(ctx context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			calls.Add(1)
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return done(in, bigText, "0.001"), nil
		},
		"small": answer("small"),
	})
	o := startOrch(t, dir, registryYAML(t, agentsAt(opAddr, "big", "small")...), stateAddr, orchOptions{})

	dispatched := make(chan error, 1)
	go func() {
		_, err := o.client.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: "big", WorkflowId: "full-1", Input: userInput("go", "")})
		dispatched <- err
	}()
	for calls.Load() == 0 {
		select {
		case <-ctx.Done():
			t.Fatal("the operator was never called")
		case <-time.After(10 * time.Millisecond):
		}
	}
	free := testenv.Fill(t, dir)
	close(release) // the output cannot be journaled now

	var err error
	select {
	case err = <-dispatched:
	case <-ctx.Done():
		t.Fatal("Dispatch hung on a full journal")
	}
	if status.Code(err) != codes.ResourceExhausted || errs.Reason(err) != errs.ReasonStorageFull || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("Dispatch with its journal full: %v (reason %q); want RESOURCE_EXHAUSTED, STORAGE_FULL, naming the cause", err, errs.Reason(err))
	}
	wf := waitFor(t, ctx, o, "full-1", "a RUNNING workflow that says it waits for the journal", func(w *orchestratorv1.Workflow) bool {
		return w.GetStatus() == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING && strings.Contains(w.GetWaiting().GetReason(), "journal cannot be written")
	})
	if wf.GetWaiting().GetAttempts() < 1 || wf.GetWaiting().GetSince() == nil {
		t.Errorf("waiting %v: want attempts and since", wf.GetWaiting())
	}
	// Another Dispatch meanwhile is refused the same way or taken, never INTERNAL.
	if _, err := o.client.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: "small", Input: userInput("hi", "")}); err != nil &&
		(status.Code(err) != codes.ResourceExhausted || errs.Reason(err) != errs.ReasonStorageFull) {
		t.Errorf("a Dispatch while the journal is full: %v; want OK or RESOURCE_EXHAUSTED STORAGE_FULL", err)
	}

	free()
	wf = waitFor(t, ctx, o, "full-1", "COMPLETED once space was freed", func(w *orchestratorv1.Workflow) bool {
		return w.GetStatus() == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED
	})
	if content.TextOf(wf.GetLastOutput().GetMessage()) != bigText || wf.GetWaiting() != nil {
		t.Fatalf("completed workflow: %d bytes of output, waiting %v", len(content.TextOf(wf.GetLastOutput().GetMessage())), wf.GetWaiting())
	}
	r, err := o.client.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: "small", Input: userInput("hi", "")})
	if err != nil || content.TextOf(r.GetOutput().GetMessage()) != "small" {
		t.Fatalf("a Dispatch after recovery: %v", err)
	}
}

// TestEffectWaitsForFullState: a memory effect the State service refuses
// because its disk is full is not recorded as not applied and forgotten:
// the workflow waits (and says so), and once space is freed the effect is
// applied and the workflow completes with it.
func TestEffectWaitsForFullState(t *testing.T) {
	ctx := ctxT(t)
	dir := testenv.SmallFS(t, 8<<20)
	stateAddr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		return state.Run(ctx, state.Config{Server: grpcserver.Config{Dev: true, ShutdownTimeout: 2 * time.Second},
			Log: quiet(), Listener: lis, DataDir: dir})
	})
	st := statev1.NewStateServiceClient(harness.Dial(t, stateAddr))
	_, opAddr := startFake(t, map[string]behaviour{"writer": answer("wrote", writeMem("notes", bigText))})
	o := startOrch(t, t.TempDir(), registryYAML(t, agentsAt(opAddr, "writer")...), stateAddr, orchOptions{})

	free := testenv.Fill(t, dir)
	dispatched := make(chan *orchestratorv1.DispatchResponse, 1)
	go func() {
		r, err := o.client.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: "writer", WorkflowId: "eff-1", Input: userInput("go", "")})
		if err != nil {
			t.Errorf("Dispatch: %v", err)
		}
		dispatched <- r
	}()
	waitFor(t, ctx, o, "eff-1", "a RUNNING workflow that says it waits for State", func(w *orchestratorv1.Workflow) bool {
		return w.GetStatus() == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING && strings.Contains(w.GetWaiting().GetReason(), "disk is full")
	})
	free()
	var r *orchestratorv1.DispatchResponse
	select {
	case r = <-dispatched:
	case <-ctx.Done():
		t.Fatal("the workflow did not complete once State had space again")
	}
	if eff := r.GetEffects(); len(eff) != 1 || !eff[0].GetApplied() {
		t.Fatalf("effects %v; want the write applied", eff)
	}
	got, err := st.Read(ctx, &statev1.ReadRequest{Scope: scope.Workflow("eff-1"), Key: "notes"})
	if err != nil || got.GetValue().GetStringValue() != bigText {
		t.Fatalf("the effect's key after recovery: %v", err)
	}
}
