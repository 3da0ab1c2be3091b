package lifecycle

import (
	"fmt"
	"io"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
)

// testPublish: Publish assigns strictly increasing sequences.
func testPublish(t *testing.T, s *suite) {
	wf := s.workflow()
	var last uint64
	for i := range 5 {
		seq := s.publish(t, observable(wf, "a", lifecyclev1.EventSource_EVENT_SOURCE_OPERATOR, i))
		if seq <= last {
			t.Fatalf("Publish %d got sequence %d after %d; sequences must strictly increase", i, seq, last)
		}
		last = seq
	}
}

// testOrder: a subscriber receives what is published after it subscribed
// in publish order, each event as published with the sequence Publish
// returned and a time, and no drops.
func testOrder(t *testing.T, s *suite) {
	wf := s.workflow()
	sub := s.live(t, &lifecyclev1.SubscribeRequest{WorkflowId: wf}, observable(wf, "a", lifecyclev1.EventSource_EVENT_SOURCE_OPERATOR, -1))
	var (
		sent []*lifecyclev1.LifecycleEvent
		seqs []uint64
	)
	for i := range 20 {
		ev := observable(wf, "a", lifecyclev1.EventSource_EVENT_SOURCE_OPERATOR, i)
		if i%5 == 4 {
			ev = budget(wf, "a")
		}
		sent = append(sent, ev)
		seqs = append(seqs, s.publish(t, ev))
	}
	for i := range sent {
		got := sub.next(t)
		if got.GetSequence() != seqs[i] || !same(got, sent[i]) {
			t.Fatalf("event %d: got sequence %d %v, want sequence %d %v", i, got.GetSequence(), got, seqs[i], sent[i])
		}
		if got.GetTime() == nil {
			t.Fatalf("event %d (sequence %d) has no time; the server sets it", i, got.GetSequence())
		}
	}
	if sub.dropped != 0 {
		t.Fatalf("a subscriber that kept up was told %d events were dropped", sub.dropped)
	}
}

// testFilters: workflow_id, agent_id, kinds and sources select the events
// that match all of them; sources admits only observable events.
func testFilters(t *testing.T, s *suite) {
	wf, other := s.workflow(), s.workflow()
	op, orch := lifecyclev1.EventSource_EVENT_SOURCE_OPERATOR, lifecyclev1.EventSource_EVENT_SOURCE_ORCHESTRATOR
	events := []*lifecyclev1.LifecycleEvent{
		observable(wf, "a", op, 0),    // 0
		observable(wf, "b", op, 1),    // 1
		observable(wf, "a", orch, 2),  // 2
		budget(wf, "a"),               // 3
		compaction(wf, "b"),           // 4
		observable(other, "a", op, 5), // 5
		budget(other, "a"),            // 6
	}
	published := map[uint64]bool{}
	first := uint64(0)
	for i, ev := range events {
		seq := s.publish(t, ev)
		if i == 0 {
			first = seq
		}
		published[seq] = true
	}
	end := observable(wf, "a", op, 99) // matches every filter below but kinds BUDGET
	cases := []struct {
		name string
		req  *lifecyclev1.SubscribeRequest
		want []int
	}{
		{"Workflow", &lifecyclev1.SubscribeRequest{WorkflowId: wf}, []int{0, 1, 2, 3, 4}},
		{"Agent", &lifecyclev1.SubscribeRequest{WorkflowId: wf, AgentId: "a"}, []int{0, 2, 3}},
		{"Kinds", &lifecyclev1.SubscribeRequest{WorkflowId: wf, Kinds: []lifecyclev1.EventKind{lifecyclev1.EventKind_EVENT_KIND_BUDGET, lifecyclev1.EventKind_EVENT_KIND_COMPACTION}}, []int{3, 4}},
		{"Sources", &lifecyclev1.SubscribeRequest{WorkflowId: wf, Sources: []lifecyclev1.EventSource{orch}}, []int{2}},
		{"All", &lifecyclev1.SubscribeRequest{WorkflowId: wf, AgentId: "a", Kinds: []lifecyclev1.EventKind{lifecyclev1.EventKind_EVENT_KIND_OBSERVABLE}, Sources: []lifecyclev1.EventSource{op}}, []int{0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := proto.CloneOf(c.req)
			req.AfterSequence = proto.Uint64(first - 1)
			sub := s.subscribe(t, req)
			var marker *lifecyclev1.LifecycleEvent
			switch {
			case len(req.Kinds) > 0 && req.Kinds[0] == lifecyclev1.EventKind_EVENT_KIND_BUDGET:
				marker = budget(wf, "a")
			case len(req.Sources) > 0 && req.Sources[0] == orch:
				marker = observable(wf, "a", orch, 99)
			default:
				marker = end
			}
			last := s.publish(t, marker)
			// The markers of earlier cases may match too: only the
			// seven events are compared.
			var names, wants []string
			for _, ev := range sub.until(t, last) {
				if published[ev.GetSequence()] {
					names = append(names, describe(ev))
				}
			}
			for _, i := range c.want {
				wants = append(wants, describe(events[i]))
			}
			if strings.Join(names, " ") != strings.Join(wants, " ") {
				t.Fatalf("filter %v streamed\n  %s\nwant\n  %s", c.req, strings.Join(names, " "), strings.Join(wants, " "))
			}
		})
	}
}

// describe names an event for messages: workflow suffix, agent, kind.
func describe(ev *lifecyclev1.LifecycleEvent) string {
	kind := "?"
	switch {
	case ev.GetObservable() != nil:
		kind = fmt.Sprintf("%s/%s", ev.GetObservable().GetSource(), ev.GetObservable().GetEventType())
	case ev.GetBudget() != nil:
		kind = "budget"
	case ev.GetCompaction() != nil:
		kind = "compaction"
	}
	wf := ev.GetWorkflowId()
	if i := strings.LastIndexByte(wf, '-'); i >= 0 {
		wf = wf[i:]
	}
	return fmt.Sprintf("[%s %s %s]", wf, ev.GetAgentId(), kind)
}

// testReplay: after_sequence replays the buffered events after it, then
// goes on with live ones, with no gap and no duplicate.
func testReplay(t *testing.T, s *suite) {
	wf := s.workflow()
	var seqs []uint64
	for i := range 5 {
		seqs = append(seqs, s.publish(t, observable(wf, "a", lifecyclev1.EventSource_EVENT_SOURCE_OPERATOR, i)))
	}
	sub := s.subscribe(t, &lifecyclev1.SubscribeRequest{WorkflowId: wf, AfterSequence: proto.Uint64(seqs[1])})
	for _, want := range seqs[2:] {
		if got := sub.next(t); got.GetSequence() != want {
			t.Fatalf("replay after %d: got sequence %d, want %d", seqs[1], got.GetSequence(), want)
		}
	}
	liveSeq := s.publish(t, observable(wf, "a", lifecyclev1.EventSource_EVENT_SOURCE_OPERATOR, 5))
	if got := sub.next(t); got.GetSequence() != liveSeq {
		t.Fatalf("after the replay: got sequence %d, want the live event %d", got.GetSequence(), liveSeq)
	}
}

// testDropped: a subscriber that reads nothing while SlowEvents events
// are published either receives them all, or receives a contiguous run
// and then RESOURCE_EXHAUSTED (resubscribe with after_sequence), or is
// told of each gap by a dropped count that is exactly the number of
// matching events it missed. Never a silent gap.
func testDropped(t *testing.T, s *suite) {
	wf := s.workflow()
	big := strings.Repeat("x", 1024)
	mk := func(i int) *lifecyclev1.LifecycleEvent {
		ev := observable(wf, "a", lifecyclev1.EventSource_EVENT_SOURCE_OPERATOR, i)
		ev.GetObservable().Data = structpb.NewStringValue(big)
		return ev
	}
	sub := s.live(t, &lifecyclev1.SubscribeRequest{WorkflowId: wf}, mk(-1))
	seqs := make([]uint64, SlowEvents)
	for i := range seqs {
		seqs[i] = s.publish(t, mk(i))
	}
	next := 0 // index into seqs of the next event expected
	var missed uint64
	for next < len(seqs) {
		res, err := sub.st.Recv()
		if err != nil {
			if err == io.EOF || status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("after %d of %d events: %v; want the rest, or RESOURCE_EXHAUSTED", next, len(seqs), err)
			}
			if !strings.Contains(status.Convert(err).Message(), "after_sequence") {
				t.Errorf("RESOURCE_EXHAUSTED %q does not say how to resume (after_sequence)", status.Convert(err).Message())
			}
			if missed != 0 {
				t.Fatalf("the stream both reported %d dropped events and then ended", missed)
			}
			t.Logf("the slow subscriber got %d contiguous events, then %v", next, err)
			// Resubscribing after the last event received replays the
			// rest, contiguous (the ring holds all SlowEvents).
			after := seqs[0] - 1
			if next > 0 {
				after = seqs[next-1]
			}
			again := s.subscribe(t, &lifecyclev1.SubscribeRequest{WorkflowId: wf, AfterSequence: proto.Uint64(after)})
			for ; next < len(seqs); next++ {
				if ev := again.next(t); ev.GetSequence() != seqs[next] {
					t.Fatalf("resubscribed after %d: got sequence %d, want %d", after, ev.GetSequence(), seqs[next])
				}
			}
			return
		}
		ev := res.GetEvent()
		skipped := 0
		for next < len(seqs) && seqs[next] < ev.GetSequence() {
			next++
			skipped++
		}
		if next == len(seqs) || seqs[next] != ev.GetSequence() {
			t.Fatalf("got sequence %d, which was not published to this workflow", ev.GetSequence())
		}
		if res.GetDropped() != uint64(skipped) {
			t.Fatalf("sequence %d came after %d missed events with dropped=%d; the count must match the gap", ev.GetSequence(), skipped, res.GetDropped())
		}
		missed += res.GetDropped()
		next++
	}
	t.Logf("the slow subscriber got all %d events but %d, each gap counted", len(seqs), missed)
}

// testInvalid: Publish without an event or without a kind, and Subscribe
// with an unspecified kind or source, or after_workflow_sequence without
// a workflow, are INVALID_ARGUMENT.
func testInvalid(t *testing.T, s *suite) {
	_, err := s.c.Publish(ctx(t), &lifecyclev1.PublishRequest{})
	wantCode(t, "Publish without an event", err, codes.InvalidArgument)
	_, err = s.c.Publish(ctx(t), &lifecyclev1.PublishRequest{Event: &lifecyclev1.LifecycleEvent{WorkflowId: s.workflow()}})
	wantCode(t, "Publish of an event with no kind", err, codes.InvalidArgument)
	ev := observable(s.workflow(), "a", lifecyclev1.EventSource_EVENT_SOURCE_OPERATOR, 0)
	ev.GetObservable().EventType = ""
	_, err = s.c.Publish(ctx(t), &lifecyclev1.PublishRequest{Event: ev})
	wantCode(t, "Publish of an observable event without event_type", err, codes.InvalidArgument)

	for name, req := range map[string]*lifecyclev1.SubscribeRequest{
		"an unspecified kind":                      {Kinds: []lifecyclev1.EventKind{lifecyclev1.EventKind_EVENT_KIND_UNSPECIFIED}},
		"an unspecified source":                    {Sources: []lifecyclev1.EventSource{lifecyclev1.EventSource_EVENT_SOURCE_UNSPECIFIED}},
		"after_workflow_sequence without workflow": {AfterWorkflowSequence: proto.Uint64(0)},
	} {
		st, err := s.c.Subscribe(ctx(t), req)
		if err == nil {
			_, err = st.Recv()
		}
		wantCode(t, "Subscribe with "+name, err, codes.InvalidArgument)
	}
}
