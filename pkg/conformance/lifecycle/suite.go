package lifecycle

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
)

// callTimeout bounds every call and every wait for an event.
const callTimeout = 30 * time.Second

// SlowEvents is how many events the slow-subscriber check publishes
// while its subscriber reads nothing, each carrying about 1 KiB of data:
// more than a subscriber buffer of 256 events or 256 KiB plus gRPC's
// flow-control window hold, and fewer than a replay ring of 4096 events.
const SlowEvents = 2000

// Target is a LifecycleService under test.
type Target struct {
	// Conn reaches the service with a credential that may Subscribe and
	// Publish (or none, when it has auth off). Required.
	Conn grpc.ClientConnInterface
	// Skip names checks to skip, as their subtest paths below Run's test
	// (such as "Dropped/SlowSubscriber"), each with the reason.
	Skip map[string]string
}

type suite struct {
	c    lifecyclev1.LifecycleServiceClient
	ns   string
	seq  atomic.Int64
	root string
	skip map[string]string
}

type group struct {
	name string
	run  func(*testing.T, *suite)
}

// Run checks target against the LifecycleService contract. Every event
// it publishes names a workflow id under a random prefix, and every
// subscription filters on one, so Run can share a server with other
// publishers (the orchestrator's own events).
func Run(t *testing.T, target Target) {
	t.Helper()
	if target.Conn == nil {
		t.Fatal("conformance: Target.Conn is nil")
	}
	s := &suite{c: lifecyclev1.NewLifecycleServiceClient(target.Conn), ns: "conf" + randomHex(6), root: t.Name(), skip: target.Skip}
	t.Logf("workflow ids of this run start with %s", s.ns)
	for _, g := range []group{
		{"Publish", testPublish},
		{"Order", testOrder},
		{"Filters", testFilters},
		{"Replay", testReplay},
		{"Dropped", testDropped},
		{"Invalid", testInvalid},
	} {
		s.run(t, g.name, func(t *testing.T) { g.run(t, s) })
	}
}

func (s *suite) run(t *testing.T, name string, fn func(t *testing.T)) {
	t.Helper()
	t.Run(name, func(t *testing.T) {
		if reason, ok := s.skip[strings.TrimPrefix(t.Name(), s.root+"/")]; ok {
			t.Skipf("skipped by Target.Skip: %s", reason)
		}
		fn(t)
	})
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), callTimeout)
	t.Cleanup(cancel)
	return c
}

// workflow returns a fresh workflow id of this run.
func (s *suite) workflow() string { return fmt.Sprintf("%s-%d", s.ns, s.seq.Add(1)) }

// observable is an observable event of wf from source, its event_type
// and data naming n.
func observable(wf, agent string, source lifecyclev1.EventSource, n int) *lifecyclev1.LifecycleEvent {
	return &lifecyclev1.LifecycleEvent{
		WorkflowId: wf, AgentId: agent, CorrelationId: wf,
		Event: &lifecyclev1.LifecycleEvent_Observable{Observable: &lifecyclev1.ObservableEvent{
			Source: source, EventType: fmt.Sprintf("conformance.event.%d", n),
			Data: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"n": structpb.NewNumberValue(float64(n))}}),
		}},
	}
}

// budget is a CostIncurred event of wf.
func budget(wf, agent string) *lifecyclev1.LifecycleEvent {
	return &lifecyclev1.LifecycleEvent{
		WorkflowId: wf, AgentId: agent,
		Event: &lifecyclev1.LifecycleEvent_Budget{Budget: &lifecyclev1.BudgetEvent{Kind: &lifecyclev1.BudgetEvent_CostIncurred{
			CostIncurred: &lifecyclev1.CostIncurred{AgentId: agent, Cost: &typesv1.Money{Amount: "0.01"}, Cumulative: &typesv1.Money{Amount: "0.02"}},
		}}},
	}
}

// compaction is a CompactionComplete event of wf.
func compaction(wf, agent string) *lifecyclev1.LifecycleEvent {
	return &lifecyclev1.LifecycleEvent{
		WorkflowId: wf, AgentId: agent,
		Event: &lifecyclev1.LifecycleEvent_Compaction{Compaction: &lifecyclev1.CompactionEvent{Kind: &lifecyclev1.CompactionEvent_CompactionComplete{
			CompactionComplete: &lifecyclev1.CompactionComplete{AgentId: agent, Strategy: "truncate", TokensFreed: 100},
		}}},
	}
}

// publish publishes ev, which must succeed, and returns its sequence.
func (s *suite) publish(t *testing.T, ev *lifecyclev1.LifecycleEvent) uint64 {
	t.Helper()
	res, err := s.c.Publish(ctx(t), &lifecyclev1.PublishRequest{Event: ev})
	if err != nil {
		t.Fatalf("Publish(%v): %v", ev, err)
	}
	if res.GetSequence() == 0 {
		t.Fatalf("Publish(%v): sequence 0; sequences start at 1", ev)
	}
	return res.GetSequence()
}

// subscription is an open Subscribe stream.
type subscription struct {
	st      grpc.ServerStreamingClient[lifecyclev1.SubscribeResponse]
	cancel  context.CancelFunc
	dropped uint64
}

// subscribe opens req's stream; it ends when the test does.
func (s *suite) subscribe(t *testing.T, req *lifecyclev1.SubscribeRequest) *subscription {
	t.Helper()
	c, cancel := context.WithTimeout(t.Context(), 2*callTimeout)
	t.Cleanup(cancel)
	st, err := s.c.Subscribe(c, req)
	if err != nil {
		t.Fatalf("Subscribe(%v): %v", req, err)
	}
	return &subscription{st: st, cancel: cancel}
}

// next returns the next event, summing the dropped counts.
func (sub *subscription) next(t *testing.T) *lifecyclev1.LifecycleEvent {
	t.Helper()
	res, err := sub.st.Recv()
	if err != nil {
		t.Fatalf("Subscribe stream: %v", err)
	}
	sub.dropped += res.GetDropped()
	if res.GetEvent() == nil {
		t.Fatalf("Subscribe sent a message without an event: %v", res)
	}
	return res.GetEvent()
}

// until returns the events up to and including the one of sequence last.
func (sub *subscription) until(t *testing.T, last uint64) []*lifecyclev1.LifecycleEvent {
	t.Helper()
	var evs []*lifecyclev1.LifecycleEvent
	for {
		ev := sub.next(t)
		evs = append(evs, ev)
		if ev.GetSequence() >= last {
			if ev.GetSequence() > last {
				t.Fatalf("the stream went from before sequence %d to %d without sending it", last, ev.GetSequence())
			}
			return evs
		}
	}
}

// live subscribes with req once a marker event of req's workflow is
// published and replayed to it, so the subscription is registered
// before the caller publishes: it returns the stream, positioned after
// the marker.
func (s *suite) live(t *testing.T, req *lifecyclev1.SubscribeRequest, marker *lifecyclev1.LifecycleEvent) *subscription {
	t.Helper()
	seq := s.publish(t, marker)
	req = proto.CloneOf(req)
	req.AfterSequence = proto.Uint64(seq - 1)
	sub := s.subscribe(t, req)
	if ev := sub.next(t); ev.GetSequence() != seq {
		t.Fatalf("subscribed after sequence %d, the first event is sequence %d (%v); want the marker %d", seq-1, ev.GetSequence(), ev, seq)
	}
	return sub
}

// wantCode fails t unless err is a status of code want with a message.
func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	st := status.Convert(err)
	if err == nil || st.Code() != want {
		t.Fatalf("%s: %v, want %v", what, err, want)
	}
	if strings.TrimSpace(st.Message()) == "" {
		t.Fatalf("%s: %v with an empty message", what, want)
	}
}

// same reports whether got is want as published: everything but the
// sequence and time, which the server assigns.
func same(got, want *lifecyclev1.LifecycleEvent) bool {
	g := proto.CloneOf(got)
	g.Sequence, g.Time, g.WorkflowSequence = 0, nil, 0
	return proto.Equal(g, want)
}
