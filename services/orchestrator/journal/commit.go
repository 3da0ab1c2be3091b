package journal

import (
	"errors"
	"sync"

	bolt "go.etcd.io/bbolt"

	"github.com/secbear/neuron/pkg/errs"
)

// committer is a group commit over bbolt: writes that arrive while a
// commit is in flight are run together in the next transaction, so
// concurrent workflows share one fsync without any waiting when the
// journal is idle (bbolt's own Batch waits up to MaxBatchDelay first).
//
// There is no committing goroutine: a write that finds no commit in
// flight commits itself, in its caller's goroutine (one write alone, as
// on an idle journal, costs no hand-over between goroutines); one that
// arrives meanwhile queues, and when the commit in flight ends the first
// write queued is woken to commit everything queued by then.
type committer struct {
	db     *bolt.DB
	mu     sync.Mutex
	closed bool
	// leading: a write is committing; queue: the writes waiting for the
	// next commit; done is signalled when leading ends with nothing
	// queued.
	leading bool
	queue   []commitReq
	done    *sync.Cond
}

type commitReq struct {
	fn func(*bolt.Tx) error
	// err receives the write's outcome, or errLead: its turn to commit
	// what is queued.
	err chan error
}

// maxCommitBatch bounds the writes of one transaction.
const maxCommitBatch = 256

var (
	errJournalClosed = errors.New("the journal is closed")
	errFnFailed      = errors.New("a batched write failed")
	errLead          = errors.New("commit what is queued")
)

func newCommitter(db *bolt.DB) *committer {
	c := &committer{db: db}
	c.done = sync.NewCond(&c.mu)
	return c
}

// do runs fn in a write transaction and returns when it is durable. An
// error from fn rolls back fn's writes (and only fn's: the others are
// committed without it).
func (c *committer) do(fn func(*bolt.Tx) error) error {
	r := commitReq{fn: fn, err: make(chan error, 1)}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return errJournalClosed
	}
	c.queue = append(c.queue, r)
	if c.leading {
		c.mu.Unlock()
		if err := <-r.err; err != errLead {
			return err
		}
	} else {
		c.leading = true
		c.mu.Unlock()
	}
	c.lead()
	return <-r.err
}

// lead commits the writes queued (its own among them), then wakes the
// first write queued meanwhile to commit the next batch, or ends the
// lead.
func (c *committer) lead() {
	c.mu.Lock()
	n := min(len(c.queue), maxCommitBatch)
	batch := make([]commitReq, n)
	copy(batch, c.queue)
	c.queue = append(c.queue[:0], c.queue[n:]...)
	c.mu.Unlock()
	c.run(batch)
	c.mu.Lock()
	if len(c.queue) == 0 {
		c.leading = false
		c.done.Broadcast()
		c.mu.Unlock()
		return
	}
	next := c.queue[0]
	c.mu.Unlock()
	next.err <- errLead
}

// close refuses new writes and waits for those queued and in flight.
func (c *committer) close() {
	c.mu.Lock()
	c.closed = true
	for c.leading {
		c.done.Wait()
	}
	c.mu.Unlock()
}

// run commits batch. When one write fails, the transaction is rolled back,
// that write gets its error, and the rest are committed again without it.
func (c *committer) run(batch []commitReq) {
	for len(batch) > 0 {
		failed, ferr := -1, error(nil)
		err := c.db.Update(func(tx *bolt.Tx) error {
			for i, r := range batch {
				if err := r.fn(tx); err != nil {
					failed, ferr = i, err
					return errFnFailed
				}
			}
			return nil
		})
		if failed < 0 {
			err = errs.FromStorage(err) // a full disk is StorageFull, which heals
			for _, r := range batch {
				r.err <- err
			}
			return
		}
		batch[failed].err <- ferr
		batch = append(batch[:failed:failed], batch[failed+1:]...)
	}
}
