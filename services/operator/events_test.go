package operator_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"google.golang.org/grpc"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	"github.com/secbear/neuron/services/operator"
)

// fakeLifecycle records published events; until release is closed each
// Publish blocks, as a slow orchestrator would.
type fakeLifecycle struct {
	lifecyclev1.LifecycleServiceClient
	release chan struct{}
	fail    bool
	mu      sync.Mutex
	got     []string
}

func (f *fakeLifecycle) Publish(_ context.Context, req *lifecyclev1.PublishRequest, _ ...grpc.CallOption) (*lifecyclev1.PublishResponse, error) {
	<-f.release
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got = append(f.got, req.GetEvent().GetWorkflowId())
	if f.fail {
		return nil, errors.New("orchestrator down")
	}
	return &lifecyclev1.PublishResponse{Sequence: uint64(len(f.got))}, nil
}

func event(wf string) *lifecyclev1.LifecycleEvent {
	return &lifecyclev1.LifecycleEvent{WorkflowId: wf}
}

// TestLifecyclePublisher checks that publishing never blocks the loop: a
// full queue drops and counts, Close sends what was queued, and a failing
// service is only logged.
func TestLifecyclePublisher(t *testing.T) {
	t.Run("full queue drops", func(t *testing.T) {
		client := &fakeLifecycle{release: make(chan struct{})}
		p := operator.NewLifecyclePublisher(client, quietLog(), 2)
		// One event is taken by the sender (blocked in Publish), two fill
		// the queue, the rest are dropped, and none of this blocks.
		for _, wf := range []string{"a", "b", "c", "d", "e", "f"} {
			p.Publish(event(wf))
		}
		if p.Dropped() < 3 {
			t.Fatalf("dropped %d, want at least 3 of 6 with a queue of 2", p.Dropped())
		}
		close(client.release)
		p.Close()
		client.mu.Lock()
		defer client.mu.Unlock()
		if uint64(len(client.got))+p.Dropped() != 6 {
			t.Fatalf("sent %d + dropped %d, want 6 in all", len(client.got), p.Dropped())
		}
	})
	t.Run("close flushes", func(t *testing.T) {
		client := &fakeLifecycle{release: make(chan struct{})}
		close(client.release)
		p := operator.NewLifecyclePublisher(client, quietLog(), 16)
		for _, wf := range []string{"a", "b", "c"} {
			p.Publish(event(wf))
		}
		p.Close()
		client.mu.Lock()
		defer client.mu.Unlock()
		if len(client.got) != 3 || client.got[0] != "a" || client.got[2] != "c" || p.Dropped() != 0 {
			t.Fatalf("sent %v, dropped %d", client.got, p.Dropped())
		}
	})
	t.Run("service errors are not fatal", func(t *testing.T) {
		client := &fakeLifecycle{release: make(chan struct{}), fail: true}
		close(client.release)
		p := operator.NewLifecyclePublisher(client, quietLog(), 4)
		p.Publish(event("a"))
		p.Publish(event("b"))
		p.Close()
		client.mu.Lock()
		defer client.mu.Unlock()
		if len(client.got) != 2 {
			t.Fatalf("attempted %d, want 2", len(client.got))
		}
	})
}
