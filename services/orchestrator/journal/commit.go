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
type committer struct {
	db     *bolt.DB
	mu     sync.RWMutex
	closed bool
	reqs   chan commitReq
	done   chan struct{}
}

type commitReq struct {
	fn  func(*bolt.Tx) error
	err chan error
}

// maxCommitBatch bounds the writes of one transaction.
const maxCommitBatch = 256

var (
	errJournalClosed = errors.New("the journal is closed")
	errFnFailed      = errors.New("a batched write failed")
)

func newCommitter(db *bolt.DB) *committer {
	c := &committer{db: db, reqs: make(chan commitReq, maxCommitBatch), done: make(chan struct{})}
	go c.loop()
	return c
}

// do runs fn in a write transaction and returns when it is durable. An
// error from fn rolls back fn's writes (and only fn's: the others are
// committed without it).
func (c *committer) do(fn func(*bolt.Tx) error) error {
	c.mu.RLock()
	if c.closed {
		c.mu.RUnlock()
		return errJournalClosed
	}
	r := commitReq{fn: fn, err: make(chan error, 1)}
	c.reqs <- r
	c.mu.RUnlock()
	return <-r.err
}

func (c *committer) close() {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		close(c.reqs)
	}
	c.mu.Unlock()
	<-c.done
}

func (c *committer) loop() {
	defer close(c.done)
	for first := range c.reqs {
		batch := []commitReq{first}
	drain:
		for len(batch) < maxCommitBatch {
			select {
			case r, ok := <-c.reqs:
				if !ok {
					break drain
				}
				batch = append(batch, r)
			default:
				break drain
			}
		}
		c.run(batch)
	}
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
