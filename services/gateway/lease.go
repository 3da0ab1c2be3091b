package gateway

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/secbear/neuron/pkg/errs"
)

// Lane leases. One replica at a time works a durable lane: the one whose
// lease the lane record names (Owner, LeaseUntil). A replica takes a free
// lane in the write that queues a message on it, or its worker takes it
// with a compare-and-set; the worker renews the lease while it follows a
// message (every third of the lease), and gives it up when the gateway
// stops. A replica that dies holds its lanes until the lease runs out;
// then the periodic rescan of every live replica (rescanLoop) finds them
// and one takes each over. A replica whose lane another live one holds
// does not work it: it follows its own submitters' messages there
// (awaitElsewhere), and the holder posts their chat answers.

// DefaultLaneLease is how long a replica's hold on a durable lane lasts
// unless renewed (Config.LaneLease).
const DefaultLaneLease = 10 * time.Second

// errHeldElsewhere: another live replica holds the lane.
var errHeldElsewhere = errors.New("the lane is held by another replica")

// holder is the replica whose lease on r has not run out at now; "" when
// none has.
func (r *laneRecord) holder(now time.Time) string {
	if r.Owner == "" {
		return ""
	}
	until, err := time.Parse(time.RFC3339Nano, r.LeaseUntil)
	if err != nil || !now.Before(until) {
		return ""
	}
	return r.Owner
}

// fresh says this process holds r with more than half its lease left.
func (d *durableLanes) fresh(r *laneRecord, now time.Time) bool {
	if r.holder(now) != d.owner {
		return false
	}
	until, _ := time.Parse(time.RFC3339Nano, r.LeaseUntil)
	return until.Sub(now) > d.lease/2
}

// take gives this process a fresh lease on r unless another live
// replica holds it.
func (d *durableLanes) take(r *laneRecord, now time.Time) bool {
	if h := r.holder(now); h != "" && h != d.owner {
		return false
	}
	r.Owner, r.LeaseUntil = d.owner, now.Add(d.lease).UTC().Format(time.RFC3339Nano)
	return true
}

// hold takes or renews this process's lease on session's lane; false
// when another live replica holds it.
func (d *durableLanes) hold(ctx context.Context, session string) (bool, error) {
	err := d.update(ctx, session, func(r *laneRecord) error {
		if len(r.Messages) > 0 && !d.take(r, time.Now()) {
			return errHeldElsewhere
		}
		return nil
	})
	if errors.Is(err, errHeldElsewhere) {
		return false, nil
	}
	return err == nil, err
}

// renew renews the lease on session's lane every third of the lease
// until stop is called.
func (d *durableLanes) renew(ctx context.Context, session string) (stop func()) {
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(d.lease / 3)
		defer t.Stop()
		for {
			select {
			case <-rctx.Done():
				return
			case <-t.C:
			}
			if held, err := d.hold(rctx, session); err != nil && rctx.Err() == nil {
				d.g.log.Warn("renewing a lane's lease", "session", session, "err", err)
			} else if !held && rctx.Err() == nil {
				d.g.log.Warn("another replica took over a lane this one works (its lease ran out)", "session", session)
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// release gives up this process's lease on session's lane, so that the
// next replica (or this one restarted) takes it over at once.
func (d *durableLanes) release(session string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(d.g.ctx), 2*time.Second)
	defer cancel()
	err := d.update(ctx, session, func(r *laneRecord) error {
		if r.Owner != d.owner {
			return errHeldElsewhere // nothing to write
		}
		r.Owner, r.LeaseUntil = "", ""
		return nil
	})
	if err != nil && !errors.Is(err, errHeldElsewhere) {
		d.g.log.Warn("giving up a lane's lease; it runs out by itself", "session", session, "err", err)
	}
}

// awaitElsewhere follows, for their local submitters, the messages this
// process queued on session's lane while another replica holds it.
func (d *durableLanes) awaitElsewhere(session string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for id, w := range d.waiters {
		if w.m.Session == session && !w.watched {
			w.watched = true
			go d.await(id, w)
		}
	}
}

// await waits for message id's workflow, started by the lane's holder,
// and tells its submitter how it settled. A message that left its lane
// without a workflow was canceled.
func (d *durableLanes) await(id string, w *laneWaiter) {
	ctx := d.g.ctx
	chat := false
	if ch, _ := w.m.Metadata["channel"].(string); ch != "" && d.g.chatSettled != nil {
		chat = true // the holder posts the answer
	}
	for pause := time.Duration(0); ; pause = min(backoff(pause), time.Second) {
		if !sleepCtx(ctx, pause) {
			return
		}
		_, err := d.g.getWorkflow(ctx, id)
		if status.Code(err) == codes.NotFound {
			var r laneRecord
			if _, err := d.kv.get(ctx, lanePrefix+w.m.Session, &r); err != nil {
				continue
			}
			if d.inLane(&r, id) {
				if r.holder(time.Now()) == "" { // its holder died: take the lane over
					d.kick(w.m.Session)
				}
				continue
			}
			if _, err := d.g.getWorkflow(ctx, id); status.Code(err) == codes.NotFound {
				d.settle(id, Settled{Err: fmt.Errorf("the message was canceled before it started: %w", errs.Canceled)})
				return
			}
		} else if err != nil {
			continue
		}
		if d.markStarted(id) {
			wf, err := d.g.WaitSettled(ctx, id)
			if ctx.Err() != nil {
				return
			}
			d.settle(id, Settled{Workflow: wf, Err: err, posted: chat})
		}
		return
	}
}

// inLane says whether r still holds message id.
func (d *durableLanes) inLane(r *laneRecord, id string) bool {
	for _, e := range r.Messages {
		if e.ID == id {
			return true
		}
	}
	return false
}

// markStarted tells message id's local submitter its workflow exists;
// false when none waits here any more.
func (d *durableLanes) markStarted(id string) bool {
	d.mu.Lock()
	w := d.waiters[id]
	d.mu.Unlock()
	if w == nil {
		return false
	}
	w.markStarted(nil)
	return true
}

// rescanLoop looks every half lease for lanes no live replica holds (their
// holder died) and works them, until ctx ends.
func (d *durableLanes) rescanLoop(ctx context.Context) {
	for sleepCtx(ctx, d.lease/2) {
		items, err := d.kv.list(ctx, lanePrefix)
		if err != nil {
			d.g.log.Warn("rescanning the durable lanes", "err", err)
			continue
		}
		now := time.Now()
		for _, it := range items {
			var r laneRecord
			if decodeValue(it.value, &r) != nil || len(r.Messages) == 0 || r.holder(now) != "" {
				continue
			}
			session := strings.TrimPrefix(it.key, lanePrefix)
			d.g.log.Info("taking over a durable lane no live replica holds", "session", session, "last_holder", r.Owner)
			d.kick(session)
		}
	}
}
