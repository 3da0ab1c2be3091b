package gateway

import (
	"fmt"
	"sync"

	"github.com/secbear/neuron/pkg/errs"
)

// DefaultLaneDepth is how many messages may wait in one lane behind the
// one being processed.
const DefaultLaneDepth = 16

// Lanes runs jobs one at a time per key, in the order they were
// submitted, and jobs of different keys in parallel. A key is a user or a
// session: its messages never overtake each other. Each lane holds at
// most depth waiting jobs; Submit refuses one more with
// RESOURCE_EXHAUSTED instead of dropping it. A lane with nothing to do
// holds no goroutine and no memory.
type Lanes struct {
	depth int
	mu    sync.Mutex
	lanes map[string]*lane
}

type lane struct {
	queue   []func()
	running bool
}

// NewLanes returns lanes holding at most depth waiting jobs each (0:
// DefaultLaneDepth).
func NewLanes(depth int) *Lanes {
	if depth <= 0 {
		depth = DefaultLaneDepth
	}
	return &Lanes{depth: depth, lanes: map[string]*lane{}}
}

// Submit queues job on key's lane. It runs after every job submitted
// earlier on the same key has returned. Submit fails, wrapping
// errs.ResourceExhausted, when the lane already holds depth waiting jobs;
// the job is then not queued at all.
func (l *Lanes) Submit(key string, job func()) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	ln := l.lanes[key]
	if ln == nil {
		ln = &lane{}
		l.lanes[key] = ln
	}
	if len(ln.queue) >= l.depth {
		return fmt.Errorf("lane %q already holds %d waiting messages (the gateway's --lane-depth); retry once an answer has come back: %w",
			key, l.depth, errs.ResourceExhausted)
	}
	ln.queue = append(ln.queue, job)
	if !ln.running {
		ln.running = true
		go l.run(key, ln)
	}
	return nil
}

// Waiting returns how many jobs wait on key's lane (not counting the one
// running).
func (l *Lanes) Waiting(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ln := l.lanes[key]; ln != nil {
		return len(ln.queue)
	}
	return 0
}

// run works through ln's queue and removes the lane once it is empty.
func (l *Lanes) run(key string, ln *lane) {
	for {
		l.mu.Lock()
		if len(ln.queue) == 0 {
			ln.running = false
			delete(l.lanes, key)
			l.mu.Unlock()
			return
		}
		job := ln.queue[0]
		ln.queue[0] = nil
		ln.queue = ln.queue[1:]
		l.mu.Unlock()
		job()
	}
}
