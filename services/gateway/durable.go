package gateway

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/secbear/neuron/pkg/errs"
)

// Durable lanes. With a State service (--state-addr) a session's lane is
// a record in the State service (scope StateScope, key
// lanePrefix+session) holding the messages accepted and not yet
// settled, in arrival order; every change is a compare-and-set on the
// record's revision. A message is acknowledged only once it is in that
// record. A worker per lane (in any gateway process: the one that
// accepted the message, or any one that starts later) takes the head,
// starts its workflow under the message's id (so a second start, after
// a crash or by another replica, answers ALREADY_EXISTS and is the same
// workflow), follows it until it ends or waits for a person, and only
// then removes it from the record. A gateway killed at any point loses
// nothing acknowledged and starts nothing twice: at start it drains
// every lane it finds.

// lanePrefix is the State key prefix of the durable lanes.
const lanePrefix = "lane/"

// casAttempts bounds the compare-and-set retries of one change.
const casAttempts = 32

// laneEntry is one accepted message in a durable lane.
type laneEntry struct {
	ID         string         `json:"id"`
	Agent      string         `json:"agent"`
	Text       string         `json:"text"`
	Metadata   map[string]any `json:"metadata,omitempty"`
	Canceled   bool           `json:"canceled,omitempty"`
	AcceptedAt string         `json:"accepted_at,omitempty"`
}

// laneRecord is a durable lane as stored, with the replica that works
// it (Owner) and until when its lease lasts unless renewed (lease.go).
type laneRecord struct {
	Messages   []laneEntry `json:"messages"`
	Owner      string      `json:"owner,omitempty"`
	LeaseUntil string      `json:"lease_until,omitempty"`
}

// durableLanes are lanes kept in the State service.
type durableLanes struct {
	g     *Gateway
	kv    *kv
	depth int
	// owner names this process in the lanes it holds; lease is how long
	// a hold lasts unless renewed.
	owner string
	lease time.Duration

	mu      sync.Mutex
	workers map[string]*laneWorker // session → its running worker
	waiters map[string]*laneWaiter // message id → its local submitter
}

type laneWorker struct{ again bool }

// laneWaiter is a message accepted by this process, waited on by its
// submitter.
type laneWaiter struct {
	m         Message
	started   chan struct{}
	startOnce sync.Once
	settled   chan Settled
	startErr  error
	// watched: a goroutine follows it while another replica holds its
	// lane (awaitElsewhere).
	watched bool
}

// markStarted closes w.started once, with err as the start's error.
func (w *laneWaiter) markStarted(err error) {
	w.startOnce.Do(func() {
		w.startErr = err
		close(w.started)
	})
}

func newDurableLanes(g *Gateway, store *kv, depth int, lease time.Duration) *durableLanes {
	if depth <= 0 {
		depth = DefaultLaneDepth
	}
	if lease <= 0 {
		lease = DefaultLaneLease
	}
	return &durableLanes{g: g, kv: store, depth: depth, owner: "gw-" + randomHex(8), lease: lease,
		workers: map[string]*laneWorker{}, waiters: map[string]*laneWaiter{}}
}

// settle hands s to the local submitter of message id, once; false when
// none waits here (or it was told already).
func (d *durableLanes) settle(id string, s Settled) bool {
	d.mu.Lock()
	w := d.waiters[id]
	delete(d.waiters, id)
	d.mu.Unlock()
	if w == nil {
		return false
	}
	w.markStarted(s.Err)
	w.settled <- s
	close(w.settled)
	return true
}

// submit appends m (checked) to its session's durable lane.
func (d *durableLanes) submit(ctx context.Context, m Message) (*Accepted, error) {
	id := NewTaskID(m.Session)
	w := &laneWaiter{m: m, started: make(chan struct{}), settled: make(chan Settled, 1)}
	acc := &Accepted{ID: id, Started: w.started, Settled: w.settled, startErr: &w.startErr}
	d.mu.Lock()
	d.waiters[id] = w
	d.mu.Unlock()
	e := laneEntry{ID: id, Agent: m.Agent, Text: m.Text, Metadata: m.Metadata, AcceptedAt: time.Now().UTC().Format(time.RFC3339Nano)}
	err := d.update(ctx, m.Session, func(r *laneRecord) error {
		if len(r.Messages) > d.depth {
			return fmt.Errorf("lane %q already holds %d waiting messages (the gateway's --lane-depth); retry once an answer has come back: %w",
				"session:"+m.Session, d.depth, errs.ResourceExhausted)
		}
		r.Messages = append(r.Messages, e)
		d.take(r, time.Now()) // a free lane is this process's to work, in the same write
		return nil
	})
	if err != nil {
		d.mu.Lock()
		delete(d.waiters, id)
		d.mu.Unlock()
		return nil, err
	}
	d.kick(m.Session)
	return acc, nil
}

// update applies change to session's lane record with compare-and-set,
// retrying when another writer moved it; an empty record is deleted.
func (d *durableLanes) update(ctx context.Context, session string, change func(*laneRecord) error) error {
	key := lanePrefix + session
	for range casAttempts {
		var r laneRecord
		rev, err := d.kv.get(ctx, key, &r)
		if err != nil {
			return err
		}
		if err := change(&r); err != nil {
			return err
		}
		var ok bool
		if len(r.Messages) == 0 {
			if rev == 0 {
				return nil
			}
			ok, err = d.kv.del(ctx, key, rev)
		} else {
			ok, err = d.kv.put(ctx, key, r, rev)
		}
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
	}
	return fmt.Errorf("lane %q changed %d times while this change waited; send again: %w", session, casAttempts, errs.Retryable)
}

// kick makes sure a worker drains session's lane.
func (d *durableLanes) kick(session string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if w := d.workers[session]; w != nil {
		w.again = true
		return
	}
	w := &laneWorker{}
	d.workers[session] = w
	go d.run(session, w)
}

// resume starts a worker for every lane in the State service: what an
// earlier run (or another replica) accepted and did not finish.
func (d *durableLanes) resume(ctx context.Context) error {
	items, err := d.kv.list(ctx, lanePrefix)
	if err != nil {
		return err
	}
	for _, it := range items {
		d.kick(strings.TrimPrefix(it.key, lanePrefix))
	}
	if len(items) > 0 {
		d.g.log.Info("resuming durable lanes", "lanes", len(items))
	}
	return nil
}

// run works through session's lane until it is empty.
func (d *durableLanes) run(session string, w *laneWorker) {
	ctx := d.g.ctx
	key := lanePrefix + session
	defer func() {
		d.mu.Lock()
		if d.workers[session] == w {
			delete(d.workers, session)
		}
		d.mu.Unlock()
	}()
	for pause := time.Duration(0); ; {
		if !sleepCtx(ctx, pause) {
			return
		}
		var r laneRecord
		if _, err := d.kv.get(ctx, key, &r); err != nil {
			pause = backoff(pause)
			d.g.log.Warn("reading a lane", "session", session, "err", err)
			continue
		}
		if len(r.Messages) > 0 && !d.fresh(&r, time.Now()) {
			held, err := d.hold(ctx, session)
			if err != nil {
				pause = backoff(pause)
				d.g.log.Warn("taking a lane's lease", "session", session, "err", err)
				continue
			}
			if !held { // a live replica works it; it posts the chat answers
				d.awaitElsewhere(session)
				return
			}
		}
		if len(r.Messages) == 0 {
			d.mu.Lock()
			if w.again {
				w.again = false
				d.mu.Unlock()
				continue
			}
			delete(d.workers, session)
			d.mu.Unlock()
			return
		}
		e := r.Messages[0]
		stopRenew := d.renew(ctx, session)
		done := d.process(ctx, session, e)
		stopRenew()
		if !done {
			d.release(session) // the gateway stops: the message stays for the next holder
			return
		}
		if err := d.update(ctx, session, func(r *laneRecord) error {
			if len(r.Messages) > 0 && r.Messages[0].ID == e.ID {
				r.Messages = r.Messages[1:]
			}
			return nil
		}); err != nil {
			d.g.log.Warn("removing a settled message from its lane", "session", session, "id", e.ID, "err", err)
			pause = backoff(pause)
			continue
		}
		pause = 0
	}
}

// process starts e's workflow (once: a second start of the same id is
// the same workflow) and follows it until it ends or waits for a person,
// telling a local submitter. It returns false only when the gateway
// stops first.
func (d *durableLanes) process(ctx context.Context, session string, e laneEntry) bool {
	d.mu.Lock()
	w := d.waiters[e.ID]
	d.mu.Unlock()
	finish := func(s Settled) {
		if d.g.chatSettled != nil && d.g.chatSettled(e.Metadata, s) {
			s.posted = true
		}
		d.settle(e.ID, s)
	}
	if e.Canceled {
		finish(Settled{Err: fmt.Errorf("the message was canceled before it started: %w", errs.Canceled)})
		return true
	}
	m := Message{Agent: e.Agent, Session: session, Text: e.Text, Metadata: e.Metadata}
	for pause := time.Duration(0); ; pause = backoff(pause) {
		if !sleepCtx(ctx, pause) {
			return false
		}
		err := d.g.start(e.ID, m)
		if status.Code(err) == codes.AlreadyExists {
			err = nil // started before a crash, or by another replica
		}
		if err == nil {
			break
		}
		if retryable(err) && ctx.Err() == nil {
			d.g.log.Warn("starting a queued message's workflow", "id", e.ID, "err", err)
			continue
		}
		if ctx.Err() != nil {
			return false
		}
		finish(Settled{Err: err})
		return true
	}
	if w != nil {
		w.markStarted(nil)
	}
	for pause := time.Duration(0); ; pause = backoff(pause) {
		if !sleepCtx(ctx, pause) {
			return false
		}
		wf, err := d.g.WaitSettled(ctx, e.ID)
		if ctx.Err() != nil {
			return false
		}
		if err != nil && retryable(err) {
			continue
		}
		finish(Settled{Workflow: wf, Err: err})
		// A chat answer the gateway's stop kept from being posted is
		// posted by the next run: the message stays in its lane.
		return ctx.Err() == nil
	}
}

// queued returns the message of task id while it waits in its lane.
func (d *durableLanes) queued(id string) (Message, bool) {
	d.mu.Lock()
	if w := d.waiters[id]; w != nil {
		d.mu.Unlock()
		select {
		case <-w.started: // its workflow exists (or could not be started)
			return Message{}, false
		default: // until the workflow exists, the task reads as queued
			return w.m, true
		}
	}
	d.mu.Unlock()
	session := SessionOf(id)
	if session == "" {
		return Message{}, false
	}
	ctx, cancel := context.WithTimeout(d.g.ctx, 5*time.Second)
	defer cancel()
	var r laneRecord
	if _, err := d.kv.get(ctx, lanePrefix+session, &r); err != nil {
		return Message{}, false
	}
	for i, e := range r.Messages {
		if e.ID == id && i > 0 && !e.Canceled { // the head may have started
			return Message{Agent: e.Agent, Session: session, Text: e.Text, Metadata: e.Metadata}, true
		}
	}
	return Message{}, false
}

// cancelQueued marks task id canceled in its lane unless it is the
// head (then being started: its workflow is to be canceled instead).
func (d *durableLanes) cancelQueued(id string) bool {
	session := SessionOf(id)
	if session == "" {
		return false
	}
	ctx, cancel := context.WithTimeout(d.g.ctx, 10*time.Second)
	defer cancel()
	found, head := false, false
	err := d.update(ctx, session, func(r *laneRecord) error {
		found, head = false, false
		for i := range r.Messages {
			if r.Messages[i].ID != id {
				continue
			}
			if i == 0 {
				head = true
				return nil
			}
			found = true
			r.Messages[i].Canceled = true
		}
		return nil
	})
	if head {
		d.mu.Lock()
		w := d.waiters[id]
		d.mu.Unlock()
		if w != nil {
			select {
			case <-w.started:
			case <-ctx.Done():
			}
		}
		return false
	}
	return err == nil && found
}

// retryable reports whether err is worth trying again: the orchestrator
// or State service could not be reached.
func retryable(err error) bool {
	switch errs.Code(errs.FromGRPC(err)) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	return errors.Is(err, errs.Retryable)
}

// backoff is the pause after one of pause: 50 ms doubling to 5 s.
func backoff(pause time.Duration) time.Duration {
	switch {
	case pause <= 0:
		return 50 * time.Millisecond
	case pause >= 5*time.Second/2:
		return 5 * time.Second
	}
	return 2 * pause
}

// sleepCtx waits d (0: not at all); false when ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if ctx.Err() != nil {
		return false
	}
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// resumeUntil resumes the durable lanes, retrying until the State
// service answers or ctx ends.
func (d *durableLanes) resumeUntil(ctx context.Context) {
	for pause := time.Duration(0); sleepCtx(ctx, pause); pause = backoff(pause) {
		err := d.resume(ctx)
		if err == nil {
			return
		}
		d.g.log.Warn("resuming the durable lanes", "err", err)
	}
}
