package state

import (
	"sync"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"

	"github.com/secbear/neuron/pkg/errs"
)

// groupCommit runs write functions in shared bbolt transactions, so that
// concurrent writers share one fsync and write throughput grows with
// concurrency.
//
// Unlike bolt.DB.Batch it adds no delay: a writer queues its function and
// takes the leader lock; if a previous leader already committed the
// function, the writer returns at once, otherwise it commits everything
// queued so far in one Update. While one leader commits, the next batch
// gathers. A lone writer pays one Update, nothing more.
//
// A function may run more than once (when a shared transaction fails it
// is rolled back and each function is re-run alone), so it must keep no
// state outside the transaction except results it overwrites on every
// run.
type groupCommit struct {
	db *bolt.DB
	// housekeeping runs first in every shared transaction (pruning); it
	// must be idempotent too.
	housekeeping func(*bolt.Tx) error

	mu     sync.Mutex // guards queue
	queue  []*commitOp
	leader sync.Mutex // held while committing a batch

	// transactions counts the write transactions run, for tests and stats.
	transactions atomic.Uint64
}

type commitOp struct {
	fn   func(*bolt.Tx) error
	err  error
	done bool // set under leader, read under leader
}

// run commits fn durably and returns its error or the commit's.
func (g *groupCommit) run(fn func(*bolt.Tx) error) error {
	op := &commitOp{fn: fn}
	g.mu.Lock()
	g.queue = append(g.queue, op)
	g.mu.Unlock()

	g.leader.Lock()
	defer g.leader.Unlock()
	if op.done {
		return op.err
	}
	g.mu.Lock()
	batch := g.queue
	g.queue = nil
	g.mu.Unlock()
	g.commit(batch)
	return op.err
}

func (g *groupCommit) commit(batch []*commitOp) {
	g.transactions.Add(1)
	err := g.db.Update(func(tx *bolt.Tx) error {
		if g.housekeeping != nil {
			if err := g.housekeeping(tx); err != nil {
				return err
			}
		}
		for _, op := range batch {
			if err := op.fn(tx); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil && len(batch) > 1 {
		// One function (or the commit) failed and everything was rolled
		// back: run each alone so one failure cannot fail the others.
		for _, op := range batch {
			g.transactions.Add(1)
			op.err, op.done = errs.FromStorage(g.db.Update(op.fn)), true
		}
		return
	}
	err = errs.FromStorage(err) // a full disk is StorageFull, not INTERNAL
	for _, op := range batch {
		op.err, op.done = err, true
	}
}
