package orchestrator

import (
	"sync"

	"google.golang.org/protobuf/proto"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
)

// Hub holds the live progress of the operator calls this process makes
// (Recorder feeds it) for the WatchWorkflow streams of their workflows.
// Progress is not durable: the hub keeps only the calls running now, so
// that a watcher joining in the middle of a call gets that call's
// progress from its start, and forgets a call once it ends (the durable
// events and the transcript carry its outcome).
type Hub struct {
	mu       sync.Mutex
	calls    map[string]map[*liveCall]struct{} // by workflow id
	watchers map[string]map[*progressWatch]struct{}
}

// Bounds of the progress the hub keeps and queues.
const (
	// hubKeepEvents and hubKeepBytes bound the progress kept per call for
	// watchers that join late; beyond them a late watcher gets the start.
	hubKeepEvents = 4096
	hubKeepBytes  = 4 << 20
	// watchQueue is the progress queued per watcher; a watcher that falls
	// further behind is ended (it reconnects).
	watchQueue = 1024
)

// NewHub returns an empty hub.
func NewHub() *Hub {
	return &Hub{calls: map[string]map[*liveCall]struct{}{}, watchers: map[string]map[*progressWatch]struct{}{}}
}

// liveCall is one operator call in flight.
type liveCall struct {
	workflow string
	head     *orchestratorv1.StepProgress // step, dispatch, agent, depth
	n        uint64
	kept     []*orchestratorv1.StepProgress
	size     int
}

// progressWatch is one WatchWorkflow's queue of progress.
type progressWatch struct {
	ch       chan *orchestratorv1.StepProgress
	overflow chan struct{} // closed once the queue overflowed
	once     sync.Once
}

func (w *progressWatch) offer(p *orchestratorv1.StepProgress) {
	select {
	case w.ch <- p:
	default:
		w.once.Do(func() { close(w.overflow) })
	}
}

// begin registers a call of workflow wf.
func (h *Hub) begin(wf string, head *orchestratorv1.StepProgress) *liveCall {
	c := &liveCall{workflow: wf, head: head}
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.calls[wf]
	if m == nil {
		m = map[*liveCall]struct{}{}
		h.calls[wf] = m
	}
	m[c] = struct{}{}
	return c
}

// add records ev, a progress event of c, and hands it to c's watchers.
func (h *Hub) add(c *liveCall, ev *operatorv1.ExecuteStreamResponse) {
	if ev.GetOutput() != nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	c.n++
	p := proto.CloneOf(c.head)
	p.Index, p.Event = c.n, ev
	if size := proto.Size(ev); len(c.kept) < hubKeepEvents && c.size+size <= hubKeepBytes {
		c.kept = append(c.kept, p)
		c.size += size
	}
	for w := range h.watchers[c.workflow] {
		w.offer(p)
	}
}

// end forgets c.
func (h *Hub) end(c *liveCall) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.calls[c.workflow]
	delete(m, c)
	if len(m) == 0 {
		delete(h.calls, c.workflow)
	}
}

// watch subscribes to workflow wf's progress. It returns the progress
// kept of the calls running now (to send first) and the watch; cancel
// ends it.
func (h *Hub) watch(wf string) (kept []*orchestratorv1.StepProgress, w *progressWatch, cancel func()) {
	w = &progressWatch{ch: make(chan *orchestratorv1.StepProgress, watchQueue), overflow: make(chan struct{})}
	h.mu.Lock()
	defer h.mu.Unlock()
	for c := range h.calls[wf] {
		kept = append(kept, c.kept...)
	}
	m := h.watchers[wf]
	if m == nil {
		m = map[*progressWatch]struct{}{}
		h.watchers[wf] = m
	}
	m[w] = struct{}{}
	return kept, w, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.watchers[wf], w)
		if len(h.watchers[wf]) == 0 {
			delete(h.watchers, wf)
		}
	}
}
