package operator

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
)

// Publisher receives the lifecycle events the loop emits (compaction).
// Publishing is best effort: it never blocks the loop and never fails it.
type Publisher interface {
	Publish(ev *lifecyclev1.LifecycleEvent)
}

// LogPublisher logs events; the default when no LifecycleService is
// configured.
type LogPublisher struct{ Log *slog.Logger }

// Publish implements Publisher.
func (p LogPublisher) Publish(ev *lifecyclev1.LifecycleEvent) {
	if p.Log != nil {
		p.Log.Info("lifecycle event", "workflow_id", ev.GetWorkflowId(), "agent_id", ev.GetAgentId(), "event", ev.String())
	}
}

// LifecyclePublisher sends events to a LifecycleService (the
// orchestrator's) from a background goroutine through a bounded queue.
// When the queue is full, events are dropped and counted rather than
// slowing the loop; each drop is logged.
type LifecyclePublisher struct {
	client  lifecyclev1.LifecycleServiceClient
	log     *slog.Logger
	queue   chan *lifecyclev1.LifecycleEvent
	dropped atomic.Uint64
	done    chan struct{}
	once    sync.Once
	timeout time.Duration
}

// NewLifecyclePublisher starts the background sender. Close stops it
// after sending what is queued.
func NewLifecyclePublisher(client lifecyclev1.LifecycleServiceClient, log *slog.Logger, queue int) *LifecyclePublisher {
	if queue <= 0 {
		queue = 256
	}
	p := &LifecyclePublisher{
		client: client, log: log, queue: make(chan *lifecyclev1.LifecycleEvent, queue),
		done: make(chan struct{}), timeout: 5 * time.Second,
	}
	go p.loop()
	return p
}

// Publish implements Publisher.
func (p *LifecyclePublisher) Publish(ev *lifecyclev1.LifecycleEvent) {
	select {
	case p.queue <- ev:
	default:
		n := p.dropped.Add(1)
		p.log.Warn("lifecycle event dropped: queue full", "dropped_total", n)
	}
}

// Dropped is how many events were dropped so far.
func (p *LifecyclePublisher) Dropped() uint64 { return p.dropped.Load() }

// Close sends the queued events and stops.
func (p *LifecyclePublisher) Close() {
	p.once.Do(func() { close(p.queue) })
	<-p.done
}

func (p *LifecyclePublisher) loop() {
	defer close(p.done)
	for ev := range p.queue {
		ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
		_, err := p.client.Publish(ctx, &lifecyclev1.PublishRequest{Event: ev})
		cancel()
		if err != nil {
			p.log.Warn("publishing lifecycle event failed", "err", err)
		}
	}
}
