package lifecycle

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	"github.com/secbear/neuron/pkg/errs"
)

// hangGuard bounds every wait; tests never sleep to synchronise.
const hangGuard = 5 * time.Second

func obs(wf string) *lifecyclev1.LifecycleEvent {
	return Observable(srcOrch, "test.event", wf, "", nil)
}

func seqp(n uint64) *uint64 { return &n }

// recv returns the next delivery, failing if the channel is closed or
// nothing arrives within the hang guard.
func recv(t *testing.T, s *Subscription) Delivery {
	t.Helper()
	select {
	case d, ok := <-s.C():
		if !ok {
			t.Fatal("subscription closed")
		}
		return d
	case <-time.After(hangGuard):
		t.Fatal("no delivery")
	}
	return Delivery{}
}

// buffered drains what is already in the channel, without waiting. Publish
// is synchronous, so after it returns its deliveries are in the channel.
func buffered(s *Subscription) (ds []Delivery, open bool) {
	for {
		select {
		case d, ok := <-s.C():
			if !ok {
				return ds, false
			}
			ds = append(ds, d)
		default:
			return ds, true
		}
	}
}

func seqs(ds []Delivery) []uint64 {
	out := make([]uint64, len(ds))
	for i, d := range ds {
		out[i] = d.Event.GetSequence()
	}
	return out
}

func span(from, to uint64) []uint64 {
	var out []uint64
	for s := from; s <= to; s++ {
		out = append(out, s)
	}
	return out
}

func TestSequenceAndTime(t *testing.T) {
	clock := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	b := NewBus(Options{StartSequence: 100, Now: func() time.Time { return clock }})
	if got := b.LastSequence(); got != 100 {
		t.Fatalf("LastSequence before any publish = %d, want 100", got)
	}
	sub, err := b.Subscribe(Filter{}, nil)
	if err != nil {
		t.Fatal(err)
	}

	unset := obs("wf")
	unset.Sequence = 7 // ignored
	if got := b.Publish(unset); got != 101 {
		t.Fatalf("first sequence %d, want 101", got)
	}
	if unset.GetSequence() != 7 || unset.GetTime() != nil {
		t.Fatalf("Publish modified its argument: %v", unset)
	}
	d := recv(t, sub)
	if d.Event.GetSequence() != 101 || !d.Event.GetTime().AsTime().Equal(clock) {
		t.Fatalf("delivered %v, want sequence 101 at %v", d.Event, clock)
	}
	// The bus keeps a clone: changing the published message later changes
	// nothing delivered or buffered.
	unset.WorkflowId = "changed"
	if d.Event.GetWorkflowId() != "wf" {
		t.Fatalf("delivered event aliases the published one")
	}

	when := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	set := obs("wf")
	set.Time = timestamppb.New(when)
	if got := b.Publish(set); got != 102 {
		t.Fatalf("second sequence %d, want 102", got)
	}
	if d := recv(t, sub); d.Event.GetSequence() != 102 || !d.Event.GetTime().AsTime().Equal(when) {
		t.Fatalf("delivered %v, want the publisher's time %v kept", d.Event, when)
	}
	if got := b.LastSequence(); got != 102 {
		t.Fatalf("LastSequence = %d, want 102", got)
	}
	if got := b.Publish(nil); got != 0 {
		t.Fatalf("Publish(nil) = %d, want 0", got)
	}
	if got := b.LastSequence(); got != 102 {
		t.Fatalf("Publish(nil) assigned a sequence: %d", got)
	}
}

func TestReplay(t *testing.T) {
	// Ring of 4 holding sequences 7..10 after ten events; odd sequences
	// belong to workflow "odd".
	newBus := func() *Bus {
		b := NewBus(Options{BufferSize: 4})
		for i := 1; i <= 10; i++ {
			wf := "even"
			if i%2 == 1 {
				wf = "odd"
			}
			b.Publish(obs(wf))
		}
		return b
	}
	tests := []struct {
		name   string
		filter Filter
		after  *uint64
		want   []uint64
	}{
		{"no after: live only", Filter{}, nil, nil},
		{"just before the oldest kept", Filter{}, seqp(6), span(7, 10)},
		{"inside the ring", Filter{}, seqp(8), span(9, 10)},
		{"the last", Filter{}, seqp(10), nil},
		{"beyond the last", Filter{}, seqp(1000), nil},
		{"filtered", Filter{WorkflowID: "odd"}, seqp(6), []uint64{7, 9}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBus()
			sub, err := b.Subscribe(tt.filter, tt.after)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := buffered(sub)
			if !slices.Equal(seqs(got), tt.want) {
				t.Fatalf("replayed %v, want %v", seqs(got), tt.want)
			}
			for _, d := range got {
				if d.Dropped != 0 {
					t.Fatalf("replayed delivery with dropped %d", d.Dropped)
				}
			}
			// Live events follow the replay.
			b.Publish(obs("odd"))
			if d := recv(t, sub); d.Event.GetSequence() != 11 {
				t.Fatalf("live event %d, want 11", d.Event.GetSequence())
			}
		})
	}
}

func TestReplayLargerThanSubscriberBuffer(t *testing.T) {
	b := NewBus(Options{BufferSize: 100, SubscriberBuffer: 2})
	for range 50 {
		b.Publish(obs("wf"))
	}
	sub, err := b.Subscribe(Filter{}, seqp(0))
	if err != nil {
		t.Fatal(err)
	}
	// The replay and SubscriberBuffer live events fit without drops.
	b.Publish(obs("wf"))
	b.Publish(obs("wf"))
	got, _ := buffered(sub)
	if !slices.Equal(seqs(got), span(1, 52)) || sub.Dropped() != 0 {
		t.Fatalf("got %v dropped %d, want 1..52 and none dropped", seqs(got), sub.Dropped())
	}
}

func TestOutOfRange(t *testing.T) {
	tests := []struct {
		name  string
		opts  Options
		n     int
		after uint64
		want  string
	}{
		{"evicted", Options{BufferSize: 4}, 10, 5, "the oldest sequence kept is 7"},
		{"long evicted", Options{BufferSize: 4}, 10, 0, "the oldest sequence kept is 7"},
		{"before a restart, nothing buffered", Options{StartSequence: 500}, 0, 100, "the next sequence is 501"},
		{"before a restart", Options{StartSequence: 500}, 3, 499, "the oldest sequence kept is 501"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := NewBus(tt.opts)
			for range tt.n {
				b.Publish(obs("wf"))
			}
			_, err := b.Subscribe(Filter{}, seqp(tt.after))
			if !errors.Is(err, errs.OutOfRange) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Subscribe(after %d) = %v, want OUT_OF_RANGE naming %q", tt.after, err, tt.want)
			}
			if b.Subscribers() != 0 {
				t.Fatalf("a failed Subscribe registered a subscriber")
			}
		})
	}
	// The boundaries are accepted.
	b := NewBus(Options{StartSequence: 500})
	if _, err := b.Subscribe(Filter{}, seqp(500)); err != nil {
		t.Fatalf("after = StartSequence: %v", err)
	}
	b = NewBus(Options{BufferSize: 4})
	for range 10 {
		b.Publish(obs("wf"))
	}
	if _, err := b.Subscribe(Filter{}, seqp(6)); err != nil {
		t.Fatalf("after = oldest-1: %v", err)
	}
}

// TestReplayThenLiveConcurrent subscribes, with and without replay, while
// several goroutines publish, and checks every subscriber sees exactly the
// matching sequences from its starting point on: no gap, no duplicate, in
// order. Buffers are large enough that nothing is dropped.
func TestReplayThenLiveConcurrent(t *testing.T) {
	const publishers, perPublisher, subscribers = 4, 500, 16
	const total = publishers * perPublisher
	b := NewBus(Options{BufferSize: total, SubscriberBuffer: total})

	var mu sync.Mutex
	workflow := make([]string, total+1) // by sequence
	var wg sync.WaitGroup
	for p := range publishers {
		wg.Go(func() {
			for i := range perPublisher {
				wf := fmt.Sprintf("wf%d", (p+i)%2)
				seq := b.Publish(obs(wf))
				mu.Lock()
				workflow[seq] = wf
				mu.Unlock()
			}
		})
	}

	type sub struct {
		s      *Subscription
		filter Filter
		after  *uint64
	}
	subs := make([]sub, subscribers)
	var swg sync.WaitGroup
	for i := range subscribers {
		swg.Go(func() {
			// Subscribe at staggered points while publishing goes on.
			for b.LastSequence() < uint64(i*total/(subscribers+1)) {
				runtime.Gosched()
			}
			var f Filter
			if i%2 == 1 {
				f.WorkflowID = "wf1"
			}
			var after *uint64
			if i%4 < 2 {
				last := b.LastSequence()
				after = seqp(last - min(last, uint64(i*7)))
			}
			s, err := b.Subscribe(f, after)
			if err != nil {
				t.Error(err)
				return
			}
			subs[i] = sub{s, f, after}
		})
	}
	wg.Wait()
	swg.Wait()
	if t.Failed() {
		return
	}
	if got := b.LastSequence(); got != total {
		t.Fatalf("LastSequence = %d, want %d", got, total)
	}
	for i, s := range subs {
		got := seqs(must(buffered(s.s)))
		if len(got) == 0 {
			if s.after != nil && *s.after < total {
				t.Errorf("subscriber %d (after %d) got nothing", i, *s.after)
			}
			continue
		}
		from := got[0]
		if s.after != nil {
			from = *s.after + 1
		}
		var want []uint64
		for seq := from; seq <= total; seq++ {
			if s.filter.WorkflowID == "" || workflow[seq] == s.filter.WorkflowID {
				want = append(want, seq)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("subscriber %d (after %v, filter %+v):\n got %v\nwant %v", i, s.after, s.filter, got, want)
		}
		if s.s.Dropped() != 0 {
			t.Errorf("subscriber %d dropped %d", i, s.s.Dropped())
		}
	}
}

func must(ds []Delivery, _ bool) []Delivery { return ds }

func TestSlowSubscriberNeverBlocksPublish(t *testing.T) {
	const buf = 8
	b := NewBus(Options{SubscriberBuffer: buf})
	all, err := b.Subscribe(Filter{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	odd, err := b.Subscribe(Filter{WorkflowID: "odd"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	closed, err := b.Subscribe(Filter{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()

	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 1; i <= 10*buf; i++ {
			wf := "even"
			if i%2 == 1 {
				wf = "odd"
			}
			b.Publish(obs(wf))
		}
	}()
	select {
	case <-done:
	case <-time.After(hangGuard):
		t.Fatal("Publish blocked on a subscriber that does not read")
	}

	// The first buf events are buffered; the rest were dropped.
	got, _ := buffered(all)
	if !slices.Equal(seqs(got), span(1, buf)) {
		t.Fatalf("buffered %v, want 1..%d", seqs(got), buf)
	}
	if all.Dropped() != 9*buf {
		t.Fatalf("Dropped = %d, want %d", all.Dropped(), 9*buf)
	}
	gotOdd, _ := buffered(odd)
	if !slices.Equal(seqs(gotOdd), []uint64{1, 3, 5, 7, 9, 11, 13, 15}) {
		t.Fatalf("odd buffered %v", seqs(gotOdd))
	}
	// Only matching events count as dropped: 40 odd events, 8 delivered.
	if odd.Dropped() != 5*buf-buf {
		t.Fatalf("odd Dropped = %d, want %d", odd.Dropped(), 5*buf-buf)
	}

	// The next delivery reports the drops, the one after none.
	b.Publish(obs("odd"))
	b.Publish(obs("odd"))
	next, _ := buffered(all)
	if len(next) != 2 || next[0].Event.GetSequence() != 10*buf+1 || next[0].Dropped != 9*buf || next[1].Dropped != 0 {
		t.Fatalf("after catching up: %+v", next)
	}
	nextOdd, _ := buffered(odd)
	if len(nextOdd) != 2 || nextOdd[0].Dropped != 4*buf || nextOdd[1].Dropped != 0 {
		t.Fatalf("odd after catching up: %+v", nextOdd)
	}
	// The per-delivery counts sum to the total.
	var sum uint64
	for _, d := range slices.Concat(got, next) {
		sum += d.Dropped
	}
	if sum != all.Dropped() {
		t.Fatalf("sum of Delivery.Dropped %d, total %d", sum, all.Dropped())
	}
}

func TestPublishAllocatesOnlyTheClone(t *testing.T) {
	b := NewBus(Options{BufferSize: 16, SubscriberBuffer: 1})
	for i := range 8 { // some full, some filtered out
		f := Filter{}
		if i%2 == 1 {
			f.WorkflowID = "other"
		}
		if _, err := b.Subscribe(f, nil); err != nil {
			t.Fatal(err)
		}
	}
	ev := obs("wf")
	ev.Time = timestamppb.Now()
	clone := testing.AllocsPerRun(100, func() { _ = proto.Clone(ev) })
	publish := testing.AllocsPerRun(100, func() { b.Publish(ev) })
	if publish > clone {
		t.Fatalf("Publish allocates %.0f times, the clone alone %.0f", publish, clone)
	}
}

// PublishOwned keeps the event it is given, with no copy: a subscriber
// receives that very event, sequenced and timed, and publishing
// allocates nothing, whoever subscribes.
func TestPublishOwned(t *testing.T) {
	b := NewBus(Options{BufferSize: 16, SubscriberBuffer: 4})
	s, err := b.Subscribe(Filter{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ev := obs("wf")
	seq := b.PublishOwned(ev)
	d := recv(t, s)
	if d.Event != ev || ev.GetSequence() != seq || seq == 0 || ev.GetTime() == nil {
		t.Fatalf("delivered %p (sequence %d, time %v), published %p as %d; want that event, sequenced and timed", d.Event, ev.GetSequence(), ev.GetTime(), ev, seq)
	}
	if b.PublishOwned(nil) != 0 {
		t.Error("PublishOwned(nil) was sequenced")
	}
	s.Close()
	quiet := NewBus(Options{BufferSize: 16})
	evs := make([]*lifecyclev1.LifecycleEvent, 200)
	for i := range evs {
		evs[i] = obs("wf")
		evs[i].Time = timestamppb.Now()
	}
	i := 0
	if n := testing.AllocsPerRun(100, func() { quiet.PublishOwned(evs[i]); i++ }); n != 0 {
		t.Errorf("PublishOwned with no subscriber allocates %.0f times; want none", n)
	}
}

func TestClose(t *testing.T) {
	b := NewBus(Options{})
	s1, err := b.Subscribe(Filter{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := b.Subscribe(Filter{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b.Subscribers() != 2 {
		t.Fatalf("Subscribers = %d", b.Subscribers())
	}

	b.Publish(obs("wf"))
	s1.Close()
	s1.Close() // idempotent
	if b.Subscribers() != 1 {
		t.Fatalf("Subscribers after Close = %d, want 1", b.Subscribers())
	}
	// What was buffered is still read, then the channel is closed.
	if got, open := buffered(s1); len(got) != 1 || open {
		t.Fatalf("closed subscription: %d deliveries, open %v", len(got), open)
	}
	b.Publish(obs("wf")) // no send on a closed channel

	b.Close()
	b.Close() // idempotent
	if got, open := buffered(s2); !slices.Equal(seqs(got), []uint64{1, 2}) || open {
		t.Fatalf("after bus Close: %v, open %v; want 1, 2 then closed", seqs(got), open)
	}
	s2.Close() // after the bus closed: no double close
	if b.Subscribers() != 0 {
		t.Fatalf("Subscribers after bus Close = %d", b.Subscribers())
	}
	if seq := b.Publish(obs("wf")); seq != 0 {
		t.Fatalf("Publish after Close = %d, want 0", seq)
	}
	if b.LastSequence() != 2 {
		t.Fatalf("LastSequence after Close = %d, want 2", b.LastSequence())
	}
	if _, err := b.Subscribe(Filter{}, nil); !errors.Is(err, errs.Unavailable) {
		t.Fatalf("Subscribe after Close = %v, want UNAVAILABLE", err)
	}
}

// TestCloseConcurrent races subscription and bus closes against
// publishers (for the race detector: no send on a closed channel, no
// double close).
func TestCloseConcurrent(t *testing.T) {
	b := NewBus(Options{SubscriberBuffer: 4})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 200 {
				b.Publish(obs("wf"))
			}
		})
	}
	for range 8 {
		wg.Go(func() {
			for range 50 {
				s, err := b.Subscribe(Filter{}, nil)
				if err != nil {
					return // the bus closed
				}
				for range s.C() {
					s.Close() // close while deliveries may still arrive
				}
			}
		})
	}
	wg.Go(func() {
		for b.LastSequence() < 400 {
			runtime.Gosched()
		}
		b.Close()
	})
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(hangGuard):
		t.Fatal("hang")
	}
	if b.Subscribers() != 0 {
		t.Fatalf("Subscribers = %d after Close", b.Subscribers())
	}
}

// padded is an observable event of workflow wf whose payload is n bytes,
// at a fixed time: events of one n have one encoded size.
func padded(wf string, n int) *lifecyclev1.LifecycleEvent {
	ev := Observable(srcOrch, "test.padded", wf, "", map[string]any{"pad": strings.Repeat("x", n)})
	ev.Time = timestamppb.New(time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC))
	return ev
}

// TestSubscriberBufferBytes checks the byte bound of a subscriber's
// buffer: live events are taken while their encoded size stays within
// SubscriberBufferBytes, one event larger than the bound is taken by an
// empty buffer, and the replay counts towards neither bound.
func TestSubscriberBufferBytes(t *testing.T) {
	size := proto.Size(mustPublished(t, padded("wf", 300)))
	b := NewBus(Options{SubscriberBuffer: 100, SubscriberBufferBytes: 3 * size})
	sub, err := b.Subscribe(Filter{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 4 {
		b.Publish(padded("wf", 300))
	}
	got, _ := buffered(sub)
	if !slices.Equal(seqs(got), span(1, 3)) || sub.Dropped() != 1 {
		t.Fatalf("took %v, dropped %d; want 1..3 (three events of %d B fill %d B) and 1 dropped", seqs(got), sub.Dropped(), size, 3*size)
	}
	// Read one at a time: there is room again for one event.
	b.Publish(padded("wf", 300))
	b.Publish(padded("wf", 300))
	got, _ = buffered(sub)
	if !slices.Equal(seqs(got), span(5, 6)) {
		t.Fatalf("after reading: took %v, want 5, 6", seqs(got))
	}
	// An event larger than the bound on its own: taken by the empty
	// buffer, not by one that holds anything.
	b.Publish(padded("wf", 4*size))
	b.Publish(padded("wf", 4*size))
	got, _ = buffered(sub)
	if !slices.Equal(seqs(got), []uint64{7}) {
		t.Fatalf("large events: took %v, want 7 only", seqs(got))
	}

	// A replay of more than the bound, then a live event: all taken.
	replayed, err := b.Subscribe(Filter{}, seqp(0))
	if err != nil {
		t.Fatal(err)
	}
	b.Publish(padded("wf", 300))
	got, _ = buffered(replayed)
	if !slices.Equal(seqs(got), span(1, 9)) || replayed.Dropped() != 0 {
		t.Fatalf("replay and a live event: %v, dropped %d; want 1..9 and none dropped", seqs(got), replayed.Dropped())
	}
}

// mustPublished is ev as the bus stores it: with a sequence and a time,
// whose encoded size is what the bus counts.
func mustPublished(t *testing.T, ev *lifecyclev1.LifecycleEvent) *lifecyclev1.LifecycleEvent {
	t.Helper()
	b := NewBus(Options{StartSequence: 1})
	b.Publish(ev)
	sub, err := b.Subscribe(Filter{}, seqp(1))
	if err != nil {
		t.Fatal(err)
	}
	return recv(t, sub).Event
}

// TestUntilFull checks that a subscription made with UntilFull ends,
// instead of missing events, when an event does not fit its buffer
// (bound by count or by bytes): it keeps the events before that one,
// takes nothing more, and says why.
func TestUntilFull(t *testing.T) {
	size := proto.Size(mustPublished(t, padded("wf", 300)))
	for _, tt := range []struct {
		name      string
		opts      Options
		kept      uint64
		maxEvents int
		maxBytes  int
	}{
		{"count", Options{SubscriberBuffer: 3}, 3, 3, DefaultSubscriberBufferBytes},
		{"bytes", Options{SubscriberBuffer: 100, SubscriberBufferBytes: 2*size + size/2}, 2, 100, 2*size + size/2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := NewBus(tt.opts)
			b.Publish(padded("wf", 300)) // before the subscription
			sub, err := b.Subscribe(Filter{}, nil, UntilFull())
			if err != nil {
				t.Fatal(err)
			}
			if sub.After() != 1 || sub.Err() != nil {
				t.Fatalf("After %d, Err %v; want 1 and nil", sub.After(), sub.Err())
			}
			for range 10 {
				b.Publish(padded("wf", 300))
			}
			select {
			case <-sub.Done():
			default:
				t.Fatal("the subscription did not end")
			}
			got, open := buffered(sub)
			if !slices.Equal(seqs(got), span(2, 1+tt.kept)) || open {
				t.Fatalf("kept %v, open %v; want %v then the channel closed", seqs(got), open, span(2, 1+tt.kept))
			}
			var full *OverflowError
			if err := sub.Err(); !errors.As(err, &full) || !errors.Is(err, errs.ResourceExhausted) {
				t.Fatalf("Err = %v; want an *OverflowError, RESOURCE_EXHAUSTED", err)
			}
			want := OverflowError{Sequence: 2 + tt.kept, Size: size, Events: int(tt.kept), Bytes: int64(tt.kept) * int64(size), MaxEvents: tt.maxEvents, MaxBytes: tt.maxBytes}
			if *full != want {
				t.Fatalf("overflow %+v, want %+v", *full, want)
			}
			if !strings.Contains(full.Error(), fmt.Sprintf("did not keep up: %d events", tt.kept)) {
				t.Fatalf("message %q", full.Error())
			}
			if b.Subscribers() != 0 || sub.Dropped() != 0 {
				t.Fatalf("Subscribers %d, Dropped %d after the overflow; want 0, 0", b.Subscribers(), sub.Dropped())
			}
			sub.Close() // no double close
			if !errors.As(sub.Err(), &full) {
				t.Fatalf("Close replaced the reason: %v", sub.Err())
			}
		})
	}
	t.Run("ends", func(t *testing.T) {
		b := NewBus(Options{})
		for range 5 {
			b.Publish(obs("wf"))
		}
		replayed, err := b.Subscribe(Filter{}, seqp(2), UntilFull())
		if err != nil {
			t.Fatal(err)
		}
		beyond, err := b.Subscribe(Filter{}, seqp(100), UntilFull())
		if err != nil {
			t.Fatal(err)
		}
		if replayed.After() != 2 || beyond.After() != 5 {
			t.Fatalf("After: %d with a replay from 2, %d from beyond the last; want 2 and 5", replayed.After(), beyond.After())
		}
		replayed.Close()
		if replayed.Err() != nil {
			t.Fatalf("Err after Close = %v, want nil", replayed.Err())
		}
		b.Close()
		<-beyond.Done()
		if err := beyond.Err(); !errors.Is(err, errs.Unavailable) {
			t.Fatalf("Err after the bus closed = %v, want UNAVAILABLE", err)
		}
	})
}

// TestSubscriberBufferBytesBoundsMemory checks what the byte bound is
// for: subscribers that do not read pin at most SubscriberBufferBytes of
// events each beyond the ring, whatever the events' size. Each of the
// subscribers follows a workflow of its own, and the ring is small, so
// the events they hold are theirs alone. Without the byte bound they
// would hold SubscriberBuffer (256) events of 16 KiB each: 4 MiB each,
// 128 MiB in all.
func TestSubscriberBufferBytesBoundsMemory(t *testing.T) {
	const subscribers, events, pad = 32, 300, 16 << 10
	b := NewBus(Options{BufferSize: 16})
	subs := make([]*Subscription, subscribers)
	for i := range subs {
		var err error
		if subs[i], err = b.Subscribe(Filter{WorkflowID: fmt.Sprint(i)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	before := memory()
	for range events {
		for i := range subscribers {
			b.Publish(padded(fmt.Sprint(i), pad))
		}
	}
	after := memory()
	// Each holds at most the bound, and the ring 16 events more; the
	// events are about twice their encoded size in memory.
	bound := int64(subscribers*DefaultSubscriberBufferBytes+16*pad) * 2
	grew := int64(after.heap) - int64(before.heap)
	t.Logf("%d subscribers that do not read, %d events of %d KiB each: the heap in use grew by %d KiB (bound %d KiB)",
		subscribers, events, pad>>10, grew>>10, bound>>10)
	if grew > bound {
		t.Errorf("the heap in use grew by %d KiB; want less than %d KiB", grew>>10, bound>>10)
	}
	for i, s := range subs {
		if s.Dropped() == 0 {
			t.Errorf("subscriber %d dropped nothing", i)
		}
	}
	runtime.KeepAlive(subs)
}

// BenchmarkPublish measures Publish of a 200-byte event to subscribers
// that read: the clone, the size the byte bound needs, and the fan-out.
func BenchmarkPublish(b *testing.B) {
	for _, n := range []int{1, 64, 1024} {
		b.Run(fmt.Sprintf("subscribers=%d", n), func(b *testing.B) {
			bus := NewBus(Options{})
			var wg sync.WaitGroup
			for range n {
				s, err := bus.Subscribe(Filter{}, nil)
				if err != nil {
					b.Fatal(err)
				}
				wg.Go(func() {
					for range s.C() {
					}
				})
			}
			ev := padded("wf", 200)
			b.ReportAllocs()
			for b.Loop() {
				bus.Publish(ev)
			}
			bus.Close()
			wg.Wait()
		})
	}
}
