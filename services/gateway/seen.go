package gateway

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/secbear/neuron/pkg/errs"
)

// Chat deliveries seen, kept durably. With durable lanes every delivery
// id a channel hands over is claimed in the State service (key
// seenPrefix+"<channel>/<id>") before its message is queued, so a
// platform's retry that reaches another replica, or this one after a
// restart, does not run the agent again. A claim records when it was
// made and, once the message is queued (or refused with a reply), that
// it is done: a retry of a done delivery is dropped; one whose claim is
// not done and younger than seenStale is being queued by another
// replica and is asked to retry later; an older one was left by a
// replica that stopped before queueing, and is claimed again. The
// records are swept once older than seenTTL, and the oldest beyond
// seenMax (sweepSeen).

// seenPrefix is the State key prefix of the chat deliveries seen.
const seenPrefix = "seen/"

// Bounds of the deliveries seen.
const (
	// seenTTL is how long a delivery id is remembered (Slack retries
	// within minutes, Telegram within hours of an unanswered update at
	// most; both give up well before).
	seenTTL = time.Hour
	// seenMax bounds the ids remembered.
	seenMax = 100_000
	// seenStale is the age after which a claim that never got its
	// message queued is taken over.
	seenStale = 5 * submitTimeout
	// seenSweep is how often the records are swept.
	seenSweep = 5 * time.Minute
)

// seenRecord is a claimed delivery.
type seenRecord struct {
	At   string `json:"at"`
	Done bool   `json:"done,omitempty"`
}

func (r seenRecord) time() time.Time {
	t, _ := time.Parse(time.RFC3339Nano, r.At)
	return t
}

// claimSeen claims delivery key; false when it was seen (and handled)
// already. A claim in progress elsewhere is a retryable error.
func (c *Channels) claimSeen(ctx context.Context, key string) (bool, error) {
	now := time.Now().UTC()
	rec := seenRecord{At: now.Format(time.RFC3339Nano)}
	for range casAttempts {
		var old seenRecord
		rev, err := c.store.get(ctx, seenPrefix+key, &old)
		if err != nil {
			return false, err
		}
		switch {
		case rev == 0:
		case old.Done:
			return false, nil
		case now.Sub(old.time()) < seenStale:
			return false, fmt.Errorf("delivery %s is being queued by another gateway replica; deliver it again later: %w", key, errs.Retryable)
		}
		ok, err := c.store.put(ctx, seenPrefix+key, rec, rev)
		if err != nil || ok {
			return ok, err
		}
	}
	return false, fmt.Errorf("delivery %s changed %d times while it was claimed; deliver it again: %w", key, casAttempts, errs.Retryable)
}

// doneSeen records that ev's message was queued or answered: a retry of
// it is dropped.
func (c *Channels) doneSeen(ev ChatEvent, key string) {
	if c.store == nil || ev.ID == "" {
		return
	}
	ctx, cancel := context.WithTimeout(c.g.ctx, submitTimeout)
	defer cancel()
	var r seenRecord
	rev, err := c.store.get(ctx, seenPrefix+key, &r)
	if err == nil && rev != 0 && !r.Done {
		r.Done = true
		_, err = c.store.put(ctx, seenPrefix+key, r, rev)
	}
	if err != nil {
		// The claim stays; once stale, a retry is taken again.
		c.log.Warn("chat delivery not marked handled", "id", key, "err", err)
	}
}

// forgetSeen drops the claim of key: the platform's retry is handled.
func (c *Channels) forgetSeen(key string) {
	if c.store == nil {
		return
	}
	ctx, cancel := context.WithTimeout(c.g.ctx, submitTimeout)
	defer cancel()
	if _, err := c.store.delAny(ctx, seenPrefix+key); err != nil {
		c.log.Warn("chat delivery claim not dropped; a retry waits until it is stale", "id", key, "err", err)
	}
}

// sweepSeen deletes the deliveries seen older than ttl, and the oldest
// beyond max; it returns how many it deleted.
func (c *Channels) sweepSeen(ctx context.Context, now time.Time, ttl time.Duration, max int) (int, error) {
	items, err := c.store.list(ctx, seenPrefix)
	if err != nil {
		return 0, err
	}
	type aged struct {
		item kvItem
		at   time.Time
	}
	all := make([]aged, 0, len(items))
	for _, it := range items {
		var r seenRecord
		_ = decodeValue(it.value, &r) // unreadable: the zero time, swept first
		all = append(all, aged{it, r.time()})
	}
	slices.SortFunc(all, func(a, b aged) int { return a.at.Compare(b.at) })
	n := 0
	for i, a := range all {
		if now.Sub(a.at) < ttl && len(all)-i <= max {
			break
		}
		if ok, err := c.store.del(ctx, a.item.key, a.item.revision); err != nil {
			return n, err
		} else if ok {
			n++
		}
	}
	return n, nil
}

// sweepLoop sweeps the deliveries seen every seenSweep until ctx ends.
func (c *Channels) sweepLoop(ctx context.Context) {
	if c.store == nil {
		return
	}
	for sleepCtx(ctx, seenSweep) {
		if n, err := c.sweepSeen(ctx, time.Now(), seenTTL, seenMax); err != nil {
			c.log.Warn("sweeping the chat deliveries seen", "err", err)
		} else if n > 0 {
			c.log.Debug("chat deliveries forgotten", "count", n)
		}
	}
}

// settled posts the answer of a durable-lane message from a chat channel
// (Gateway.chatSettled); false for a message from elsewhere.
func (c *Channels) settled(meta map[string]any, s Settled) bool {
	str := func(k string) string { v, _ := meta[k].(string); return v }
	name := str("channel")
	if name == "" {
		return false
	}
	var ch Channel
	for _, x := range c.list {
		if x.Name() == name {
			ch = x
		}
	}
	if ch == nil {
		c.log.Warn("a queued chat message's channel is off; its answer is not posted", "channel", name)
		return false
	}
	ev := ChatEvent{Channel: name, ID: str("delivery"), Workspace: str("workspace"), Conversation: str("conversation"),
		User: str("user"), Thread: str("thread")}
	if err := c.answer(ch, ev, ev.Session(), s.Workflow, s.Err); err != nil && c.g.ctx.Err() == nil {
		c.log.Warn("chat answer dropped", "channel", name, "conversation", ev.Conversation, "err", strings.TrimSpace(err.Error()))
	}
	return true
}
