package lifecycle

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	"github.com/secbear/neuron/pkg/errs"
)

// Defaults of Options.
const (
	DefaultBufferSize       = 4096
	DefaultSubscriberBuffer = 256
)

// Options configure a Bus. Zero values take the defaults.
type Options struct {
	// BufferSize is how many of the latest events are kept for replay.
	BufferSize int
	// SubscriberBuffer is the capacity of each subscriber's channel; a
	// subscriber that falls further behind misses events.
	SubscriberBuffer int
	// StartSequence is the sequence before the first: the first event gets
	// StartSequence+1. Pass a persisted LastSequence to keep sequences
	// increasing across restarts.
	StartSequence uint64
	// Now is the clock for events published without a time.
	Now func() time.Time
}

// Bus is the in-process lifecycle event bus: a bounded ring of recent
// events and a non-blocking fan-out to filtered subscribers. It is safe
// for concurrent use. See the package documentation.
type Bus struct {
	subBuffer int
	start     uint64
	now       func() time.Time

	mu     sync.Mutex
	ring   []*lifecyclev1.LifecycleEvent // event of sequence s at s % len(ring)
	last   uint64                        // last sequence assigned
	subs   []*Subscription
	closed bool
}

// NewBus returns an empty bus.
func NewBus(opts Options) *Bus {
	if opts.BufferSize <= 0 {
		opts.BufferSize = DefaultBufferSize
	}
	if opts.SubscriberBuffer <= 0 {
		opts.SubscriberBuffer = DefaultSubscriberBuffer
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Bus{
		subBuffer: opts.SubscriberBuffer,
		start:     opts.StartSequence,
		now:       opts.Now,
		ring:      make([]*lifecyclev1.LifecycleEvent, opts.BufferSize),
		last:      opts.StartSequence,
	}
}

// Publish assigns ev the next sequence and, when ev has no time, the
// current time; keeps a clone in the ring; and offers the clone to every
// matching subscriber without blocking (a subscriber whose buffer is full
// misses it and its dropped count grows). ev itself is not modified. It
// returns the sequence, or 0 when ev is nil or the bus is closed.
func (b *Bus) Publish(ev *lifecyclev1.LifecycleEvent) uint64 {
	if ev == nil {
		return 0
	}
	return b.publish(proto.Clone(ev).(*lifecyclev1.LifecycleEvent))
}

// publish is Publish for an event the bus may keep and modify.
func (b *Bus) publish(ev *lifecyclev1.LifecycleEvent) uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0
	}
	b.last++
	ev.Sequence = b.last
	if ev.Time == nil {
		ev.Time = timestamppb.New(b.now())
	}
	b.ring[b.last%uint64(len(b.ring))] = ev
	// Under b.mu, so every subscriber sees events in sequence order and a
	// concurrent Subscribe's replay ends exactly where live delivery starts.
	for _, s := range b.subs {
		if !s.filter.Match(ev) {
			continue
		}
		select {
		case s.ch <- Delivery{Event: ev, Dropped: s.pending}:
			s.pending = 0
		default:
			s.pending++
			s.dropped.Add(1)
		}
	}
	return b.last
}

// LastSequence returns the last sequence assigned (StartSequence before
// the first Publish).
func (b *Bus) LastSequence() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.last
}

// Subscribers returns the number of open subscriptions.
func (b *Bus) Subscribers() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.subs)
}

// oldest is the oldest sequence in the ring, or last+1 when it is empty.
// Callers hold b.mu.
func (b *Bus) oldest() uint64 {
	n := min(b.last-b.start, uint64(len(b.ring)))
	return b.last - n + 1
}

// Subscribe registers a subscriber to the events that match f. With
// after set, the buffered matching events with a sequence greater than
// *after are delivered first, in order, then live events, with no gap
// and no duplicate; the subscription's channel then holds the replay on
// top of Options.SubscriberBuffer. An *after beyond LastSequence replays
// nothing.
//
// Errors: InvalidArgument for a filter with an unspecified or unknown
// kind or source; OutOfRange when events after *after were already evicted
// from the ring (the message names the oldest sequence kept); Unavailable
// after Close.
func (b *Bus) Subscribe(f Filter, after *uint64) (*Subscription, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	f = f.clone()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, fmt.Errorf("the lifecycle bus is closed: %w", errs.Unavailable)
	}
	var from uint64 // first sequence to replay; 0: none
	replay := 0
	if after != nil {
		oldest := b.oldest()
		if *after < oldest-1 {
			if oldest > b.last {
				return nil, fmt.Errorf("after_sequence %d: events %d to %d are no longer buffered and nothing is kept yet; the next sequence is %d: %w",
					*after, *after+1, oldest-1, oldest, errs.OutOfRange)
			}
			return nil, fmt.Errorf("after_sequence %d: events %d to %d are no longer buffered; the oldest sequence kept is %d: %w",
				*after, *after+1, oldest-1, oldest, errs.OutOfRange)
		}
		if *after < b.last {
			from = *after + 1
			for seq := from; seq <= b.last; seq++ {
				if f.Match(b.at(seq)) {
					replay++
				}
			}
		}
	}
	s := &Subscription{bus: b, filter: f, ch: make(chan Delivery, b.subBuffer+replay)}
	if replay > 0 {
		for seq := from; seq <= b.last; seq++ {
			if ev := b.at(seq); f.Match(ev) {
				s.ch <- Delivery{Event: ev} // never blocks: the channel has room for the replay
			}
		}
	}
	b.subs = append(b.subs, s)
	return s, nil
}

// at returns the buffered event of sequence seq; callers hold b.mu and
// check seq is in [oldest, last].
func (b *Bus) at(seq uint64) *lifecyclev1.LifecycleEvent {
	return b.ring[seq%uint64(len(b.ring))]
}

// Close ends every subscription (their channels close once drained) and
// releases the ring. Afterwards Publish does nothing and Subscribe fails
// with Unavailable. Close is idempotent.
func (b *Bus) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.closed = true
	for _, s := range b.subs {
		s.closed = true
		close(s.ch)
	}
	b.subs = nil
	b.ring = nil
}

// Delivery is one event for a subscriber.
type Delivery struct {
	// Event is shared with other subscribers: do not modify it.
	Event *lifecyclev1.LifecycleEvent
	// Dropped is how many matching events this subscriber missed since
	// its previous delivery because its buffer was full.
	Dropped uint64
}

// Subscription is one subscriber of a Bus.
type Subscription struct {
	bus     *Bus
	filter  Filter
	ch      chan Delivery
	dropped atomic.Uint64

	// Guarded by bus.mu.
	pending uint64 // dropped since the last delivery
	closed  bool
}

// C returns the deliveries. It is closed, after the deliveries already
// buffered, when the subscription or the bus closes.
func (s *Subscription) C() <-chan Delivery { return s.ch }

// Dropped returns how many matching events this subscriber missed in
// total.
func (s *Subscription) Dropped() uint64 { return s.dropped.Load() }

// Close unregisters the subscriber and closes its channel. It is
// idempotent and safe to call concurrently with Publish and Bus.Close.
func (s *Subscription) Close() {
	b := s.bus
	b.mu.Lock()
	defer b.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	close(s.ch)
	for i, o := range b.subs {
		if o == s {
			last := len(b.subs) - 1
			b.subs[i] = b.subs[last]
			b.subs[last] = nil
			b.subs = b.subs[:last]
			break
		}
	}
}
