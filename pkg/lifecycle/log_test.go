package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	"github.com/secbear/neuron/pkg/errs"
)

// memLog is a WorkflowLog in memory: one workflow, "w1", whose events are
// appended by the test, pages of at most two.
type memLog struct {
	mu    sync.Mutex
	evs   []*lifecyclev1.LifecycleEvent
	ended bool
}

func (l *memLog) add(typ string, agent string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ev := Observable(lifecyclev1.EventSource_EVENT_SOURCE_ORCHESTRATOR, typ, "w1", agent, nil)
	ev.WorkflowSequence = uint64(len(l.evs) + 1)
	l.evs = append(l.evs, ev)
}

func (l *memLog) end() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ended = true
}

func (l *memLog) Events(_ context.Context, id string, after uint64) ([]*lifecyclev1.LifecycleEvent, bool, error) {
	if id != "w1" {
		return nil, false, fmt.Errorf("workflow %q does not exist: %w", id, errs.NotFound)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*lifecyclev1.LifecycleEvent
	for _, ev := range l.evs {
		if ev.GetWorkflowSequence() > after && len(out) < 2 {
			out = append(out, proto.Clone(ev).(*lifecyclev1.LifecycleEvent))
		}
	}
	return out, l.ended && len(out) == 0, nil
}

// A subscription with after_workflow_sequence streams the log after that
// position, page after page, follows what is recorded later (found by
// polling: nothing is published on this process's bus), applies the
// other filters, and ends with the workflow.
func TestSubscribeWorkflowLog(t *testing.T) {
	log := &memLog{}
	for _, typ := range []string{"a", "b", "c", "d"} {
		log.add("orchestrator."+typ, "x")
	}
	h := start(t, NewBus(Options{}), harnessOptions{log: log})
	sub, err := h.client.Subscribe(context.Background(), &lifecyclev1.SubscribeRequest{WorkflowId: "w1", AgentId: "x", AfterWorkflowSequence: proto.Uint64(1)})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	recv := func() {
		t.Helper()
		r, err := sub.Recv()
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		got = append(got, fmt.Sprintf("%d %s", r.GetEvent().GetWorkflowSequence(), r.GetEvent().GetObservable().GetEventType()))
	}
	for range 3 {
		recv()
	}
	log.add("orchestrator.other-agent", "y") // filtered out by agent_id
	log.add("orchestrator.e", "x")
	recv()
	log.end()
	if _, err := sub.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the workflow ended: %v; want the stream to end OK", err)
	}
	want := "[2 orchestrator.b 3 orchestrator.c 4 orchestrator.d 6 orchestrator.e]"
	if fmt.Sprint(got) != want {
		t.Errorf("got %v; want %s", got, want)
	}
}

func TestSubscribeWorkflowLogErrors(t *testing.T) {
	for _, tt := range []struct {
		name string
		log  WorkflowLog
		req  *lifecyclev1.SubscribeRequest
		code codes.Code
	}{
		{"no workflow", &memLog{}, &lifecyclev1.SubscribeRequest{AfterWorkflowSequence: proto.Uint64(0)}, codes.InvalidArgument},
		{"both positions", &memLog{}, &lifecyclev1.SubscribeRequest{WorkflowId: "w1", AfterWorkflowSequence: proto.Uint64(0), AfterSequence: proto.Uint64(0)}, codes.InvalidArgument},
		{"unknown workflow", &memLog{}, &lifecyclev1.SubscribeRequest{WorkflowId: "w2", AfterWorkflowSequence: proto.Uint64(0)}, codes.NotFound},
		{"no log here", nil, &lifecyclev1.SubscribeRequest{WorkflowId: "w1", AfterWorkflowSequence: proto.Uint64(0)}, codes.FailedPrecondition},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := start(t, NewBus(Options{}), harnessOptions{log: tt.log})
			sub, err := h.client.Subscribe(context.Background(), tt.req)
			if err == nil {
				_, err = sub.Recv()
			}
			if status.Code(err) != tt.code {
				t.Errorf("Subscribe: %v; want %v", err, tt.code)
			}
		})
	}
}
