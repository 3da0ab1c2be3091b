package journal

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/services/orchestrator"
)

// Retention bounds the finished workflows (COMPLETED, FAILED, CANCELED)
// a journal keeps. RUNNING and SUSPENDED workflows are never deleted,
// whatever their age: they are not in the ended index, and a deletion
// checks the status again.
type Retention struct {
	// MaxAge deletes a finished workflow once it ended this long ago;
	// zero: any age.
	MaxAge time.Duration
	// MaxWorkflows deletes the finished workflows that ended first
	// beyond this many; zero: any number. Workflows that ended less than
	// MinRetention ago are kept even beyond it.
	MaxWorkflows int
	// Interval is the time between Retain's passes; zero:
	// DefaultPruneInterval.
	Interval time.Duration
}

const (
	// MinRetention is the least time a finished workflow is kept: its
	// Dispatch caller, a retry of that Dispatch and a subscriber of its
	// event log read it just after it ends. A MaxAge below it is refused
	// by the binary.
	MinRetention = time.Minute
	// DefaultPruneInterval is the time between Retain's passes.
	DefaultPruneInterval = time.Minute
	// pruneBatch bounds the workflows one transaction deletes: 64
	// trivial workflows take about 1.7 ms (p50; 11 ms p99 with the
	// fsyncs) on the benchmark machine, about 40 us each.
	pruneBatch = 64
	// pruneYield is how many times as long as a batch Prune waits after
	// it. With 4, steps of running workflows were about 30% slower while
	// a backlog was pruned; with 9, about 20% (BenchmarkJournalStepWhilePruning).
	pruneYield = 9
)

func (r Retention) bounded() bool { return r.MaxAge > 0 || r.MaxWorkflows > 0 }

// Prune deletes the finished workflows beyond r, the oldest end first,
// until none is left or ctx ends, and returns how many it deleted. It
// deletes at most pruneBatch workflows per transaction, and after each
// waits pruneYield times as long as the transaction took, so that the
// workflows that run have the journal at least 90% of the time: a
// backlog is worked off slowly (40000 trivial workflows in about 18 s
// on an idle journal). Deleting a workflow deletes everything it owns:
// its bucket (record, steps, effects, signals and their keys, registry
// lookups, event log) and its entries in the status indexes.
func (j *Journal) Prune(ctx context.Context, r Retention) (int, error) {
	return j.prune(ctx, r, time.Now)
}

func (j *Journal) prune(ctx context.Context, r Retention, now func() time.Time) (int, error) {
	if !r.bounded() {
		return 0, nil
	}
	total := 0
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		t0 := time.Now()
		n, more, err := j.pruneOnce(r, now(), pruneBatch)
		total += n
		if err != nil || !more {
			return total, err
		}
		if err := orchestrator.Sleep(ctx, pruneYield*time.Since(t0)); err != nil {
			return total, err
		}
	}
}

// due lists up to limit ended entries beyond r at now, oldest first,
// and says whether more are due after them.
func due(tx *bolt.Tx, r Retention, now time.Time, limit int) (keys [][]byte, more bool, err error) {
	kept := getU64(tx.Bucket(bucketMeta), keyFinished)
	c := tx.Bucket(bucketEnded).Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		if len(k) < 8 {
			return nil, false, fmt.Errorf("ended entry %x is corrupt", k)
		}
		age := now.Sub(time.Unix(0, int64(binary.BigEndian.Uint64(k[:8]))))
		old := r.MaxAge > 0 && age >= r.MaxAge
		over := r.MaxWorkflows > 0 && kept > uint64(r.MaxWorkflows)
		if age < MinRetention || !old && !over {
			break
		}
		if len(keys) == limit {
			return keys, true, nil
		}
		keys = append(keys, bytes.Clone(k))
		if kept > 0 {
			kept--
		}
	}
	return keys, false, nil
}

// pruneOnce deletes up to limit finished workflows beyond r at now, in
// one transaction, and says whether more are due. It looks first in a
// read transaction, so a pass with nothing to delete writes nothing.
func (j *Journal) pruneOnce(r Retention, now time.Time, limit int) (n int, more bool, err error) {
	var found bool
	if err := j.db.View(func(tx *bolt.Tx) error {
		keys, _, err := due(tx, r, now, 1)
		found = len(keys) > 0
		return err
	}); err != nil || !found {
		return 0, false, err
	}
	err = j.update(func(tx *bolt.Tx) error {
		keys, m, err := due(tx, r, now, limit)
		if err != nil {
			return err
		}
		n, more = 0, m
		for _, k := range keys {
			deleted, err := deleteFinished(tx, k)
			if err != nil {
				return err
			}
			if deleted {
				n++
			}
		}
		meta := tx.Bucket(bucketMeta)
		kept := getU64(meta, keyFinished)
		return meta.Put(keyFinished, u64(kept-min(uint64(len(keys)), kept)))
	})
	if err != nil {
		return 0, false, err
	}
	return n, more, nil
}

// deleteFinished deletes ended entry k, and the workflow it names with
// everything the workflow owns. A workflow the status index says is
// unfinished is kept (deleted=false), whatever ended says.
func deleteFinished(tx *bolt.Tx, k []byte) (deleted bool, err error) {
	ended := tx.Bucket(bucketEnded)
	created := ended.Get(k)
	if len(created) != 8 {
		return false, fmt.Errorf("ended entry %x is corrupt", k)
	}
	id := k[8:]
	ikey := append(bytes.Clone(created), id...)
	idx := tx.Bucket(bucketIndex)
	if v := idx.Get(ikey); len(v) == 1 && !orchestrator.Terminal(orchestratorv1.WorkflowStatus(v[0])) {
		return false, ended.Delete(k)
	}
	switch err := tx.Bucket(bucketWorkflows).DeleteBucket(id); {
	case err == nil:
		deleted = true
	case !errors.Is(err, berrors.ErrBucketNotFound):
		return false, err
	}
	for _, b := range []*bolt.Bucket{idx, tx.Bucket(bucketLive)} {
		if err := b.Delete(ikey); err != nil {
			return false, err
		}
	}
	return deleted, ended.Delete(k)
}

// Finished is how many finished workflows the journal holds.
func (j *Journal) Finished() (uint64, error) {
	var n uint64
	err := j.db.View(func(tx *bolt.Tx) error {
		n = getU64(tx.Bucket(bucketMeta), keyFinished)
		return nil
	})
	return n, err
}

// retainer is the background pruning of a journal.
type retainer struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func (r *retainer) stop() {
	if r != nil {
		r.cancel()
		<-r.done
	}
}

// Retain prunes the journal in the background (Prune): one pass at
// once, then one every r.Interval, until Close. A pass that deletes
// workflows is logged at INFO, one that fails at ERROR (the next pass
// tries again). Without a bound it does nothing. Call it once, before
// Close.
func (j *Journal) Retain(r Retention, log *slog.Logger) {
	if !r.bounded() || j.retain != nil {
		return
	}
	if r.Interval <= 0 {
		r.Interval = DefaultPruneInterval
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ret := &retainer{cancel: cancel, done: make(chan struct{})}
	j.retain = ret
	go func() {
		defer close(ret.done)
		for {
			t0 := time.Now()
			n, err := j.Prune(ctx, r)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				log.Error("could not prune finished workflows from the journal; the next pass tries again", "deleted", n, "err", err)
			} else if n > 0 {
				kept, _ := j.Finished()
				log.Info("pruned finished workflows from the journal", "deleted", n, "finished_kept", kept,
					"took", time.Since(t0).String(), "max_age", r.MaxAge.String(), "max_workflows", r.MaxWorkflows)
			}
			if orchestrator.Sleep(ctx, r.Interval) != nil {
				return
			}
		}
	}()
}
