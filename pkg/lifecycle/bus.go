package lifecycle

import (
	"fmt"
	"slices"
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
	DefaultBufferSize            = 4096
	DefaultSubscriberBuffer      = 256
	DefaultSubscriberBufferBytes = 256 << 10
)

// Options configure a Bus. Zero values take the defaults.
type Options struct {
	// BufferSize is how many of the latest events are kept for replay.
	BufferSize int
	// SubscriberBuffer is how many live events each subscriber's channel
	// holds; a subscriber that falls further behind misses events (or,
	// subscribed with UntilFull, is ended).
	SubscriberBuffer int
	// SubscriberBufferBytes bounds the encoded size (proto.Size) of the
	// live events waiting in each subscriber's channel: an event that
	// would take it over the bound is treated as one that finds the
	// channel full. An event larger than the bound on its own is still
	// taken by an empty channel, so a subscriber that keeps up receives
	// every event whatever its size.
	SubscriberBufferBytes int
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
	subBytes  int
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
	if opts.SubscriberBufferBytes <= 0 {
		opts.SubscriberBufferBytes = DefaultSubscriberBufferBytes
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Bus{
		subBuffer: opts.SubscriberBuffer,
		subBytes:  opts.SubscriberBufferBytes,
		start:     opts.StartSequence,
		now:       opts.Now,
		ring:      make([]*lifecyclev1.LifecycleEvent, opts.BufferSize),
		last:      opts.StartSequence,
	}
}

// Publish assigns ev the next sequence and, when ev has no time, the
// current time; keeps a clone in the ring; and offers the clone to every
// matching subscriber without blocking. A subscriber whose buffer is full
// (Options.SubscriberBuffer events or Options.SubscriberBufferBytes)
// misses it and its dropped count grows; one subscribed with UntilFull is
// ended instead. ev itself is not modified. It returns the sequence, or 0
// when ev is nil or the bus is closed.
func (b *Bus) Publish(ev *lifecyclev1.LifecycleEvent) uint64 {
	if ev == nil {
		return 0
	}
	return b.publish(proto.Clone(ev).(*lifecyclev1.LifecycleEvent))
}

// PublishOwned is Publish for an event the caller hands over: the bus
// keeps ev itself, without a copy, and sets its Sequence (and its Time,
// when it has none) as Publish sets the copy's. The caller must neither
// read nor change ev afterwards: subscribers read it concurrently. With
// no subscriber, publishing is a sequence and a slot of the ring.
func (b *Bus) PublishOwned(ev *lifecyclev1.LifecycleEvent) uint64 {
	if ev == nil {
		return 0
	}
	return b.publish(ev)
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
	size, ended := -1, false
	for _, s := range b.subs {
		if !s.filter.Match(ev) {
			continue
		}
		if size < 0 {
			size = proto.Size(ev)
		}
		if s.offer(ev, size) {
			continue
		}
		if s.untilFull {
			s.overflow(ev.Sequence, size)
			ended = true
			continue
		}
		s.pending++
		s.dropped.Add(1)
	}
	if ended {
		b.subs = slices.DeleteFunc(b.subs, func(s *Subscription) bool { return s.closed })
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

// SubscribeOption configures one subscription.
type SubscribeOption func(*Subscription)

// UntilFull ends the subscription, instead of letting it miss events, the
// first time a live event does not fit its buffer: it takes nothing more,
// its channel closes after the events it holds (all of them before the
// one that did not fit, with no gap), and Err returns an *OverflowError.
// A subscriber that resubscribes with after set to the last sequence it
// received then misses nothing still in the ring. The gRPC Server
// subscribes this way.
func UntilFull() SubscribeOption {
	return func(s *Subscription) { s.untilFull = true }
}

// Subscribe registers a subscriber to the events that match f. With
// after set, the buffered matching events with a sequence greater than
// *after are delivered first, in order, then live events, with no gap
// and no duplicate; the subscription's channel then holds the replay on
// top of Options.SubscriberBuffer, and the replay counts towards neither
// bound of the buffer. An *after beyond LastSequence replays nothing.
//
// Errors: InvalidArgument for a filter with an unspecified or unknown
// kind or source; OutOfRange when events after *after were already evicted
// from the ring (the message names the oldest sequence kept); Unavailable
// after Close.
func (b *Bus) Subscribe(f Filter, after *uint64, opts ...SubscribeOption) (*Subscription, error) {
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
	start := b.last
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
			start = *after
			from = *after + 1
			for seq := from; seq <= b.last; seq++ {
				if f.Match(b.at(seq)) {
					replay++
				}
			}
		}
	}
	s := &Subscription{
		bus:      b,
		filter:   f,
		ch:       make(chan Delivery, b.subBuffer+replay),
		done:     make(chan struct{}),
		after:    start,
		maxBytes: b.subBytes,
		cum:      make([]uint64, b.subBuffer+1),
	}
	for _, o := range opts {
		o(s)
	}
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

// errBusClosed is Subscription.Err after Bus.Close.
var errBusClosed = fmt.Errorf("the lifecycle bus is closed: %w", errs.Unavailable)

// Close ends every subscription (their channels close once drained; Err
// is Unavailable) and releases the ring. Afterwards Publish does nothing
// and Subscribe fails with Unavailable. Close is idempotent.
func (b *Bus) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.closed = true
	for _, s := range b.subs {
		s.end(errBusClosed)
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
	bus       *Bus
	filter    Filter
	untilFull bool
	after     uint64
	maxBytes  int
	ch        chan Delivery
	done      chan struct{}
	dropped   atomic.Uint64

	// Guarded by bus.mu.
	pending uint64 // dropped since the last delivery
	closed  bool
	err     error // why it ended; set before done is closed
	// Live deliveries so far, and the running total of their encoded
	// sizes: cum[i%len(cum)] is the size of the first i. The channel is
	// FIFO and only the bus sends on it, so the deliveries it holds are
	// the last len(ch) sent; their size is a difference of two totals.
	live uint64
	cum  []uint64
}

// offer sends ev to the subscriber when it fits its buffer: fewer than
// SubscriberBuffer live events waiting, and their size plus ev's within
// SubscriberBufferBytes (or none waiting). Callers hold bus.mu.
func (s *Subscription) offer(ev *lifecyclev1.LifecycleEvent, size int) bool {
	n, bytes := s.waiting()
	if n >= len(s.cum)-1 || (n > 0 && bytes+uint64(size) > uint64(s.maxBytes)) {
		return false
	}
	select {
	case s.ch <- Delivery{Event: ev, Dropped: s.pending}:
	default: // never: the channel has room for the replay and SubscriberBuffer live events
		return false
	}
	s.pending = 0
	s.live++
	s.cum[s.live%uint64(len(s.cum))] = s.cum[(s.live-1)%uint64(len(s.cum))] + uint64(size)
	return true
}

// waiting is how many live events are in the channel and their encoded
// size. len(ch) only falls while the caller holds bus.mu (the consumer
// takes), so this is an upper bound of what the channel holds by the time
// it is used. Callers hold bus.mu.
func (s *Subscription) waiting() (events int, bytes uint64) {
	n := uint64(len(s.ch))
	// The channel holds the last n deliveries: live ones after the replay.
	n = min(n, s.live)
	l := uint64(len(s.cum))
	return int(n), s.cum[s.live%l] - s.cum[(s.live-n)%l]
}

// overflow ends an UntilFull subscription: event seq, of size bytes, did
// not fit. Callers hold bus.mu and remove s from bus.subs.
func (s *Subscription) overflow(seq uint64, size int) {
	n, bytes := s.waiting()
	s.end(&OverflowError{
		Sequence: seq, Size: size, Events: n, Bytes: int64(bytes),
		MaxEvents: len(s.cum) - 1, MaxBytes: s.maxBytes,
	})
}

// end closes the channel and done with the reason err; callers hold
// bus.mu and remove s from bus.subs.
func (s *Subscription) end(err error) {
	if s.closed {
		return
	}
	s.closed = true
	s.err = err
	close(s.ch)
	close(s.done)
}

// C returns the deliveries. It is closed, after the deliveries already
// buffered, when the subscription ends: Close, Bus.Close, or an overflow
// of an UntilFull subscription.
func (s *Subscription) C() <-chan Delivery { return s.ch }

// Done is closed when the subscription ends, at once, while C may still
// hold deliveries.
func (s *Subscription) Done() <-chan struct{} { return s.done }

// Err says why the subscription ended: nil while it is open or after
// Close; an Unavailable error after Bus.Close; an *OverflowError (kind
// ResourceExhausted) when an UntilFull subscription fell behind.
func (s *Subscription) Err() error {
	select {
	case <-s.done: // closed after err was set
		return s.err
	default:
		return nil
	}
}

// After is the sequence this subscription's events follow: its after
// argument when that replayed events, else the last sequence assigned
// when it subscribed. A subscriber that received nothing resumes from
// here.
func (s *Subscription) After() uint64 { return s.after }

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
	s.end(nil)
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

// OverflowError is why an UntilFull subscription ended: a live event did
// not fit its buffer. It wraps errs.ResourceExhausted.
type OverflowError struct {
	// Sequence is the event that did not fit, Size its encoded size.
	Sequence uint64
	Size     int
	// Events and Bytes are the live events waiting in the buffer then,
	// and their encoded size.
	Events int
	Bytes  int64
	// MaxEvents and MaxBytes are the bounds (Options.SubscriberBuffer,
	// Options.SubscriberBufferBytes).
	MaxEvents, MaxBytes int
}

func (e *OverflowError) Error() string {
	return fmt.Sprintf("the subscriber did not keep up: %d events (%s) were waiting to be sent when event %d (%s) did not fit its buffer of %d events or %s",
		e.Events, byteSize(e.Bytes), e.Sequence, byteSize(e.Size), e.MaxEvents, byteSize(e.MaxBytes))
}

// Unwrap makes the error a ResourceExhausted kind.
func (e *OverflowError) Unwrap() error { return errs.ResourceExhausted }

// byteSize formats a size for people: 512 B, 1.5 KiB, 3.2 MiB.
type byteSize int64

func (n byteSize) String() string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d B", int64(n))
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	default:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
}
