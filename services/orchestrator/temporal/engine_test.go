package temporal

// The engine's client side (Start, Wait, Signal, queries, Cancel, List,
// Events) against a Temporal dev server (skipped where none can be
// started), with the in-process caller and State service of the suite.
// Every history it makes must replay on this build.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/lifecycle"
	"github.com/secbear/neuron/services/orchestrator"
)

func TestEngineOnDevServer(t *testing.T) {
	dev := testenv.Temporal(t)
	var mu sync.Mutex
	flaky := 0
	slowStarted := make(chan struct{}, 1)
	behaviours := map[string]tsBehaviour{
		"answer": func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			return tsDone(in, "Hello.", "0.01", tsWrite(in, "greeted", true)), nil
		},
		"flaky": func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			mu.Lock()
			flaky++
			n := flaky
			mu.Unlock()
			if n <= 2 {
				return nil, fmt.Errorf("overloaded: %w", errs.Unavailable)
			}
			return tsDone(in, "Finally.", "0"), nil
		},
		"refuse": func(context.Context, *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			return nil, fmt.Errorf("model refused: %w", errs.FailedPrecondition)
		},
		"approve": func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			if in.GetResume() == nil {
				out := tsOut(in, operatorv1.ExitKind_EXIT_KIND_SUSPENDED, "Approve?", "0")
				out.ExitReason.Suspension = &operatorv1.Suspension{ResumeToken: "tok"}
				return out, nil
			}
			return tsDone(in, "Approved.", "0"), nil
		},
		"slow": func(ctx context.Context, _ *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			slowStarted <- struct{}{}
			<-ctx.Done()
			return nil, ctx.Err()
		},
	}
	var agents []map[string]any
	for id := range behaviours {
		agents = append(agents, tsAgent(id, 3))
	}
	b, err := json.Marshal(map[string]any{"agents": agents})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := orchestrator.ParseRegistry(b)
	if err != nil {
		t.Fatal(err)
	}
	bus := lifecycle.NewBus(lifecycle.Options{})
	t.Cleanup(bus.Close)
	e := New(dev.Client, orchestrator.Deps{Registry: reg, Caller: &tsCaller{agents: behaviours}, State: startTSState(t), Bus: bus},
		Options{TaskQueue: "neuron-engine-test", HeartbeatTimeout: 2 * time.Second})
	if err := e.StartWorker(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	ctx := context.Background()
	start := func(t *testing.T, ctx context.Context, id, agent, text string, detached bool) {
		t.Helper()
		_, existed, err := e.Start(ctx, &orchestrator.StartRequest{WorkflowID: id, AgentID: agent, Input: userInput(text), Detached: detached})
		if err != nil || existed {
			t.Fatalf("Start %s: existed %v, %v", id, existed, err)
		}
	}
	wait := func(t *testing.T, id string) *orchestrator.Workflow {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		wf, err := e.Wait(wctx, id)
		if err != nil {
			t.Fatalf("Wait %s: %v", id, err)
		}
		return wf
	}

	t.Run("dispatch", func(t *testing.T) {
		sub, err := bus.Subscribe(lifecycle.Filter{WorkflowID: "e-answer"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()
		dctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		start(t, dctx, "e-answer", "answer", "Hi.", false)
		if _, existed, err := e.Start(dctx, &orchestrator.StartRequest{WorkflowID: "e-answer", AgentID: "answer", Input: userInput("Hi.")}); err != nil || !existed {
			t.Errorf("the same Start again: existed %v, %v; want existed", existed, err)
		}
		if _, _, err := e.Start(dctx, &orchestrator.StartRequest{WorkflowID: "e-answer", AgentID: "answer", Input: userInput("Other.")}); !errors.Is(err, errs.AlreadyExists) {
			t.Errorf("another request with the id: %v, want ALREADY_EXISTS", err)
		}
		wf := wait(t, "e-answer")
		if wf.Status != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED || wf.Spent.String() != "0.01" || wf.Steps != 1 ||
			content.TextOf(wf.LastOutput.GetMessage()) != "Hello." {
			t.Errorf("Wait: %s, spent %s, %d steps, output %v; want COMPLETED, 0.01, 1, Hello.", wf.Status, wf.Spent, wf.Steps, wf.LastOutput)
		}
		if len(wf.Effects) != 1 || !wf.Effects[0].GetApplied() || wf.Effects[0].GetIdempotencyKey() != "e-answer#1/effect/0" {
			t.Errorf("effects %v, want the write applied", wf.Effects)
		}
		got, err := e.Get(ctx, "e-answer")
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED || got.RootAgent != "answer" || got.Created.IsZero() ||
			got.Updated.Before(got.Created) || got.LastOutput == nil || got.Effects != nil {
			t.Errorf("Get: %+v", got)
		}
		steps, err := e.Steps(ctx, "e-answer")
		if err != nil || len(steps) != 1 || steps[0].State != "done" || steps[0].Effects != 1 || steps[0].Trigger != "TRIGGER_TYPE_USER" {
			t.Errorf("Steps: %+v, %v", steps, err)
		}
		evs, ended, err := e.Events(ctx, "e-answer", 0)
		if err != nil {
			t.Fatal(err)
		}
		want := "orchestrator.workflow.started,orchestrator.dispatch.completed,cost_incurred,orchestrator.effect.applied,orchestrator.workflow.completed"
		if names(evs) != want || !ended {
			t.Errorf("Events: %s (ended %v), want %s, ended", names(evs), ended, want)
		}
		if evs, _, err := e.Events(ctx, "e-answer", 3); err != nil || len(evs) != 2 || evs[0].GetWorkflowSequence() != 4 {
			t.Errorf("Events after 3: %v, %v; want events 4 and 5", evs, err)
		}
		var sent []*lifecyclev1.LifecycleEvent
		for len(sub.C()) > 0 {
			sent = append(sent, (<-sub.C()).Event)
		}
		if names(sent) != want {
			t.Errorf("events sent: %s, want each once: %s", names(sent), want)
		}
		if _, _, err := e.Events(ctx, "e-nobody", 0); !errors.Is(err, errs.NotFound) {
			t.Errorf("Events of an unknown workflow: %v, want NOT_FOUND", err)
		}
		replay(t, dev.Client, "e-answer")
	})

	t.Run("retries", func(t *testing.T) {
		start(t, ctx, "e-flaky", "flaky", "Hi.", true)
		wf := wait(t, "e-flaky")
		if wf.Status != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED {
			t.Errorf("Wait: %s (%+v), want COMPLETED after two retries", wf.Status, wf.Failure)
		}
		// The workflow retried in its history (a version marker, timers
		// and three activities): that must replay.
		replay(t, dev.Client, "e-flaky")
	})

	t.Run("failure", func(t *testing.T) {
		start(t, ctx, "e-refuse", "refuse", "Hi.", true)
		wf := wait(t, "e-refuse")
		if wf.Status != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED || wf.Failure == nil ||
			codes.Code(wf.Failure.Code) != codes.FailedPrecondition || !strings.Contains(wf.Failure.Message, "model refused") {
			t.Errorf("Wait: %s, %+v; want FAILED with the operator's failure", wf.Status, wf.Failure)
		}
		got, err := e.Get(ctx, "e-refuse")
		if err != nil || got.Status != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED || got.Failure == nil ||
			got.Failure.Message != wf.Failure.Message {
			t.Errorf("Get: %+v, %v", got, err)
		}
		// Listed failed workflows show their failure (from the memo).
		listed := eventually(t, func() *orchestrator.Workflow {
			wfs, _, err := e.List(ctx, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED, 100, "")
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range wfs {
				if w.ID == "e-refuse" {
					return w
				}
			}
			return nil
		})
		if listed.Failure == nil || listed.Failure.Message != wf.Failure.Message || codes.Code(listed.Failure.Code) != codes.FailedPrecondition ||
			listed.RootAgent != "refuse" {
			t.Errorf("listed: %+v (failure %+v), want its failure", listed, listed.Failure)
		}
		replay(t, dev.Client, "e-refuse")

		// Before retryChange, a failure the agent's policy could retry
		// reached the workflow only after the activity's last attempt, and
		// failed the step at once: such a history (here e-refuse's, its
		// failure made retryable) still replays.
		h := history(t, dev.Client, "e-refuse")
		found := false
		for _, ev := range h.GetEvents() {
			if a := ev.GetActivityTaskFailedEventAttributes(); a != nil {
				a.GetFailure().GetApplicationFailureInfo().Type = errTypeRetryable
				found = true
			}
		}
		if !found {
			t.Fatal("e-refuse's history has no failed activity")
		}
		if err := replayer().ReplayWorkflowHistory(quietTemporal(), h); err != nil {
			t.Errorf("a history recorded before the workflow retried does not replay: %v", err)
		}
	})

	t.Run("suspend and signal", func(t *testing.T) {
		start(t, ctx, "e-approve", "approve", "Deploy?", true)
		wf := wait(t, "e-approve")
		if wf.Status != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED || wf.Steps != 1 {
			t.Fatalf("Wait: %s after %d steps, want SUSPENDED after 1", wf.Status, wf.Steps)
		}
		payload := signalPayload(t, "approval", map[string]any{"ok": true})
		seq, dup, err := e.Signal(ctx, "e-approve", payload, "approve-1")
		if err != nil || seq != 1 || dup {
			t.Fatalf("Signal: %d, duplicate %v, %v; want 1", seq, dup, err)
		}
		if seq, dup, err := e.Signal(ctx, "e-approve", payload, "approve-1"); err != nil || seq != 1 || !dup {
			t.Errorf("Signal again: %d, duplicate %v, %v; want 1, duplicate", seq, dup, err)
		}
		wf = eventually(t, func() *orchestrator.Workflow {
			wf := wait(t, "e-approve")
			if wf.Status == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED {
				return nil
			}
			return wf
		})
		if wf.Status != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED || wf.Steps != 2 {
			t.Errorf("after the signal: %s after %d steps, want COMPLETED after 2", wf.Status, wf.Steps)
		}
		sigs, err := e.Signals(ctx, "e-approve")
		if err != nil || len(sigs) != 1 || sigs[0].Seq != 1 || sigs[0].Step != 2 || !proto.Equal(payloadOf(t, sigs[0].Payload), payloadOf(t, payload)) {
			t.Errorf("Signals: %+v, %v; want signal 1, delivered by step 2", sigs, err)
		}
		if _, _, err := e.Signal(ctx, "e-approve", payload, ""); !errors.Is(err, errs.FailedPrecondition) {
			t.Errorf("Signal to an ended workflow: %v, want FAILED_PRECONDITION", err)
		}
		if _, _, err := e.Signal(ctx, "e-nobody", payload, ""); !errors.Is(err, errs.NotFound) {
			t.Errorf("Signal to an unknown workflow: %v, want NOT_FOUND", err)
		}
		evs, _, err := e.Events(ctx, "e-approve", 0)
		if err != nil {
			t.Fatal(err)
		}
		want := "orchestrator.workflow.started,orchestrator.dispatch.completed,cost_incurred,orchestrator.workflow.suspended," +
			"orchestrator.signal.accepted,orchestrator.dispatch.completed,cost_incurred,orchestrator.workflow.completed"
		if names(evs) != want {
			t.Errorf("Events: %s, want %s", names(evs), want)
		}
		replay(t, dev.Client, "e-approve")
	})

	t.Run("cancel", func(t *testing.T) {
		start(t, ctx, "e-slow", "slow", "Take your time.", true)
		select {
		case <-slowStarted:
		case <-time.After(30 * time.Second):
			t.Fatal("the operator call did not start")
		}
		wf, err := e.Cancel(ctx, "e-slow", "the user gave up")
		if err != nil {
			t.Fatal(err)
		}
		if wf.Status != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED || wf.Failure == nil || wf.Failure.Message != "the user gave up" {
			t.Errorf("Cancel: %s, %+v; want CANCELED with the reason", wf.Status, wf.Failure)
		}
		if again, err := e.Cancel(ctx, "e-slow", "twice"); err != nil || again.Failure == nil || again.Failure.Message != "the user gave up" {
			t.Errorf("Cancel again: %+v, %v; want it unchanged", again, err)
		}
		if wf := wait(t, "e-slow"); wf.Status != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED {
			t.Errorf("Wait: %s, want CANCELED", wf.Status)
		}
		evs, ended, err := e.Events(ctx, "e-slow", 0)
		if err != nil || !ended || len(evs) == 0 || names(evs[len(evs)-1:]) != "orchestrator.workflow.canceled" {
			t.Errorf("Events: %s (ended %v), %v; want the log to end canceled", names(evs), ended, err)
		}
		replay(t, dev.Client, "e-slow")
	})

	t.Run("list", func(t *testing.T) {
		eventually(t, func() *orchestrator.Workflow {
			wfs, _, err := e.List(ctx, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_UNSPECIFIED, 100, "")
			if err != nil || len(wfs) < 5 {
				return nil
			}
			return wfs[0]
		})
		seen := map[string]bool{}
		token := ""
		for range 10 {
			wfs, next, err := e.List(ctx, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_UNSPECIFIED, 2, token)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range wfs {
				seen[w.ID] = true
			}
			if next == "" {
				break
			}
			token = next
		}
		for _, id := range []string{"e-answer", "e-flaky", "e-refuse", "e-approve", "e-slow"} {
			if !seen[id] {
				t.Errorf("listing by pages of 2 missed %s (saw %v)", id, seen)
			}
		}
		if token == "" {
			t.Fatal("no second page")
		}
		if _, _, err := e.List(ctx, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED, 2, token); !errors.Is(err, errs.InvalidArgument) {
			t.Errorf("a token of another status filter: %v, want INVALID_ARGUMENT", err)
		}
		wfs, _, err := e.List(ctx, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED, 100, "")
		if err != nil || len(wfs) != 1 || wfs[0].ID != "e-slow" {
			t.Errorf("List CANCELED: %v, %v; want e-slow", wfs, err)
		}
	})
}

func userInput(text string) *operatorv1.OperatorInput {
	return &operatorv1.OperatorInput{Message: content.Text(text), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_USER, Dispatch: &operatorv1.DispatchContext{}}
}

func signalPayload(t *testing.T, typ string, data any) []byte {
	t.Helper()
	v, err := structpb.NewValue(data)
	if err != nil {
		t.Fatal(err)
	}
	b, err := proto.Marshal(&typesv1.SignalPayload{SignalType: typ, Data: v})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func payloadOf(t *testing.T, b []byte) *typesv1.SignalPayload {
	t.Helper()
	p := &typesv1.SignalPayload{}
	if err := proto.Unmarshal(b, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// names are the events' names (see eventName), comma-separated.
func names(evs []*lifecyclev1.LifecycleEvent) string {
	var out []string
	for _, ev := range evs {
		out = append(out, eventName(ev))
	}
	return strings.Join(out, ",")
}

// eventually polls f until it returns non-nil (visibility is eventually
// consistent).
func eventually[T any](t *testing.T, f func() *T) *T {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if v := f(); v != nil {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatal("the awaited condition never held")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// history is workflow id's history.
func history(t *testing.T, c client.Client, id string) *historypb.History {
	t.Helper()
	it := c.GetWorkflowHistory(context.Background(), id, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	h := &historypb.History{}
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			t.Fatalf("history of %s: %v", id, err)
		}
		h.Events = append(h.Events, ev)
	}
	return h
}

// replayer replays histories on this build's workflow.
func replayer() worker.WorkflowReplayer {
	r := worker.NewWorkflowReplayer()
	New(nil, orchestrator.Deps{}, Options{}).RegisterWorkflow(r)
	return r
}

// replay replays workflow id's history on this build.
func replay(t *testing.T, c client.Client, id string) {
	t.Helper()
	if err := replayer().ReplayWorkflowHistory(quietTemporal(), history(t, c, id)); err != nil {
		t.Errorf("the history of workflow %s does not replay: %v", id, err)
	}
}
