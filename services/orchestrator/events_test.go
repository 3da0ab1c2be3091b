package orchestrator_test

import (
	"context"
	"errors"
	"io"
	"testing"

	"github.com/shopspring/decimal"
	"google.golang.org/protobuf/types/known/structpb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/money"
	"google.golang.org/protobuf/proto"
)

// approver suspends until a signal of type "approve" arrives.
func approver(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
	for _, s := range in.GetMetadata().GetFields()["signals"].GetListValue().GetValues() {
		if s.GetStructValue().GetFields()["signal_type"].GetStringValue() == "approve" {
			return done(in, "approved", "0.01"), nil
		}
	}
	return &operatorv1.OperatorOutput{
		Message: content.Text("waiting for approval"),
		ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_SUSPENDED,
			Suspension: &operatorv1.Suspension{ResumeToken: "tok-1", Prompt: "approve?"}},
		Metadata: &operatorv1.OperatorMetadata{Cost: money.FromDecimal(decimal.RequireFromString("0.01"))},
	}, nil
}

// logged is one event of a workflow's log as a subscriber saw it.
type logged struct {
	pos uint64
	typ string // the observable event type, or "budget"
	ev  *lifecyclev1.LifecycleEvent
}

// readLog subscribes to workflow id's event log after position after and
// reads until stop says so (true) or the stream ends (ended=true).
func readLog(t *testing.T, o *orch, id string, after uint64, stop func(logged) bool) (got []logged, ended bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	sub, err := o.events.Subscribe(ctx, &lifecyclev1.SubscribeRequest{WorkflowId: id, AfterWorkflowSequence: proto.Uint64(after)})
	if err != nil {
		t.Fatal(err)
	}
	for {
		r, err := sub.Recv()
		if errors.Is(err, io.EOF) {
			return got, true
		}
		if err != nil {
			t.Fatalf("reading the event log of %s after %d (read %v): %v", id, after, got, err)
		}
		ev := r.GetEvent()
		typ := ev.GetObservable().GetEventType()
		if typ == "" {
			typ = "budget"
		}
		l := logged{pos: ev.GetWorkflowSequence(), typ: typ, ev: ev}
		got = append(got, l)
		if stop != nil && stop(l) {
			return got, false
		}
	}
}

func count(evs []logged, typ string) int {
	n := 0
	for _, e := range evs {
		if e.typ == typ {
			n++
		}
	}
	return n
}

// contiguous fails t unless evs hold positions from+1, from+2, ... in
// order.
func contiguous(t *testing.T, evs []logged, from uint64) {
	t.Helper()
	for i, e := range evs {
		if e.pos != from+uint64(i)+1 {
			t.Fatalf("event %d of the log after %d is at position %d; want %d (a gap or a duplicate): %v", i, from, e.pos, from+uint64(i)+1, evs)
		}
	}
}

// TestWorkflowEventLog checks a workflow's durable event log: a
// subscriber that reads part of it, goes away, and comes back with the
// last position it saw to another orchestrator (the journal restarted on
// the same file; a second Temporal replica) gets everything after that
// position exactly once, and the stream ends with the workflow.
func TestWorkflowEventLog(t *testing.T) {
	t.Run("bolt", func(t *testing.T) {
		dir := t.TempDir()
		testWorkflowEventLog(t, func(t *testing.T, registry []byte, stateAddr string) (first, second func() *orch) {
			var o1 *orch
			return func() *orch {
					o1 = startOrch(t, dir, registry, stateAddr, orchOptions{})
					return o1
				}, func() *orch {
					o1.stop()
					return startOrch(t, dir, registry, stateAddr, orchOptions{})
				}
		})
	})
	t.Run("temporal", func(t *testing.T) {
		dev := testenv.Temporal(t)
		testWorkflowEventLog(t, func(t *testing.T, registry []byte, stateAddr string) (first, second func() *orch) {
			var o1 *orch
			return func() *orch {
					o1 = startTemporalOrch(t, dev, registry, stateAddr, orchOptions{})
					return o1
				}, func() *orch {
					o2 := startTemporalOrch(t, dev, registry, stateAddr, orchOptions{})
					o1.stop() // its worker: the second replica runs the rest
					return o2
				}
		})
	})
}

func testWorkflowEventLog(t *testing.T, replicas func(t *testing.T, registry []byte, stateAddr string) (first, second func() *orch)) {
	ctx := ctxT(t)
	stateAddr, _, _ := startState(t)
	_, opAddr := startFake(t, map[string]behaviour{"approver": approver})
	first, second := replicas(t, registryYAML(t, agentsAt(opAddr, "approver")...), stateAddr)
	o1 := first()
	if _, err := o1.client.StartWorkflow(ctx, &orchestratorv1.StartWorkflowRequest{WorkflowId: "log1", AgentId: "approver", Input: userInput("deploy?", "")}); err != nil {
		t.Fatal(err)
	}
	before, ended := readLog(t, o1, "log1", 0, func(l logged) bool { return l.typ == "orchestrator.workflow.suspended" })
	if ended {
		t.Fatalf("the log of a suspended workflow ended: %v", before)
	}
	contiguous(t, before, 0)
	if before[0].typ != "orchestrator.workflow.started" {
		t.Errorf("the log starts with %q; want orchestrator.workflow.started: %v", before[0].typ, before)
	}
	last := before[len(before)-1].pos

	o2 := second()
	if _, err := o2.client.Signal(ctx, &orchestratorv1.SignalRequest{WorkflowId: "log1",
		Signal: &typesv1.SignalPayload{SignalType: "approve", Data: structpb.NewBoolValue(true)}}); err != nil {
		t.Fatal(err)
	}
	after, ended := readLog(t, o2, "log1", last, nil)
	if !ended {
		t.Fatalf("the log did not end with the workflow: %v", after)
	}
	contiguous(t, after, last)
	for _, typ := range []string{"orchestrator.signal.accepted", "orchestrator.dispatch.completed", "orchestrator.workflow.completed"} {
		if count(after, typ) != 1 {
			t.Errorf("after resuming at %d: %d %s events; want 1: %v", last, count(after, typ), typ, after)
		}
	}
	if after[len(after)-1].typ != "orchestrator.workflow.completed" {
		t.Errorf("the log ends with %q; want orchestrator.workflow.completed: %v", after[len(after)-1].typ, after)
	}

	all, ended := readLog(t, o2, "log1", 0, nil)
	if !ended {
		t.Fatal("the whole log did not end")
	}
	contiguous(t, all, 0)
	if len(all) != len(before)+len(after) {
		t.Errorf("the whole log has %d events; the two reads %d + %d: %v", len(all), len(before), len(after), all)
	}
	for _, typ := range []string{"orchestrator.workflow.started", "orchestrator.workflow.suspended", "orchestrator.workflow.completed"} {
		if count(all, typ) != 1 {
			t.Errorf("%d %s events in the whole log; want 1: %v", count(all, typ), typ, all)
		}
	}
}
