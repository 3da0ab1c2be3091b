package state

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/types/known/structpb"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/boltcheck"
	"github.com/secbear/neuron/pkg/errs"
)

// ErrLocked is returned by OpenBolt when another process holds the
// database file.
var ErrLocked = errors.New("another process holds the lock on this file")

// Bolt is the durable Backend: a bbolt file (the source of truth) and a
// bleve full-text index beside it (path + ".bleve"), kept in step as
// described in index.go.
//
// Every acknowledged Write and Delete is fsynced before it returns;
// concurrent ones share a transaction (see groupCommit). The index is
// updated after the reply, in batches, by a background indexer; Search
// first catches it up with every committed change, so a Search sees
// every write acknowledged before it started.
type Bolt struct {
	core
	path  string
	db    *bolt.DB
	group *groupCommit
	index *searchIndex

	// committed is the highest revision known committed, so Search can
	// tell whether the index is behind.
	committed atomic.Uint64

	life   sync.RWMutex // operations hold it shared; Close exclusively
	closed bool
}

var _ Backend = (*Bolt)(nil)

// Housekeeping budgets per transaction, so pruning never makes one write
// slow.
const (
	pruneIdemPerTx    = 256
	pruneChangesPerTx = 1024
)

// OpenBolt opens (creating if needed) the store at path and its search
// index at path + ".bleve", rebuilding or catching up the index from the
// file when it is missing, unreadable or behind. It waits up to the lock
// timeout (WithLockTimeout, default 1s) for another process to release
// the file and then fails with an error wrapping ErrLocked.
//
// A damaged file (cut short, both meta pages invalid, a page overwritten)
// is refused with an error wrapping boltcheck.ErrDamaged that says what
// to do, before bbolt maps it; one invalid meta page is logged at ERROR
// and the file opened at the other (see pkg/boltcheck and the README).
func OpenBolt(path string, opts ...Option) (*Bolt, error) {
	o := applyOptions(opts)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("open state database: %w", err)
	}
	checked, err := boltcheck.Check(path, o.lockTimeout)
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, fmt.Errorf("open state database %s: %w (waited %s)", path, ErrLocked, o.lockTimeout)
	}
	if err != nil {
		return nil, fmt.Errorf("open state database %s: %w", path, err)
	}
	checked.Log(o.logger, path)
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: o.lockTimeout})
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, fmt.Errorf("open state database %s: %w (waited %s)", path, ErrLocked, o.lockTimeout)
	}
	if err != nil {
		return nil, fmt.Errorf("open state database %s: %w", path, err)
	}
	b := &Bolt{core: core{opts: o}, path: path, db: db}
	dbID, seq, err := b.initMeta()
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open state database %s: %w", path, err)
	}
	b.committed.Store(seq)
	b.index, err = openIndex(path+".bleve", db, dbID, o.logger)
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open search index %s.bleve: %w", path, err)
	}
	b.group = &groupCommit{db: db, housekeeping: b.housekeeping}
	b.index.start()
	return b, nil
}

// initMeta creates the buckets and meta keys of a new file, checks the
// schema version of an existing one (upgrading an older one that this
// build reads, see schemaVersion), and loads the token secret.
func (b *Bolt) initMeta() (dbID string, seq uint64, err error) {
	err = b.db.Update(func(tx *bolt.Tx) error {
		for _, name := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		if v := meta.Get(metaSchemaVersion); v == nil {
			if err := meta.Put(metaSchemaVersion, u64(schemaVersion)); err != nil {
				return err
			}
		} else if got := readU64(v); got < minSchemaVersion || got > schemaVersion {
			return fmt.Errorf("schema version is %d; this build reads versions %d to %d", got, minSchemaVersion, schemaVersion)
		} else if got < schemaVersion {
			if err := meta.Put(metaSchemaVersion, u64(schemaVersion)); err != nil {
				return err
			}
		}
		if meta.Get(metaDBID) == nil {
			if err := meta.Put(metaDBID, []byte(hex.EncodeToString(randomBytes(16)))); err != nil {
				return err
			}
		}
		if meta.Get(metaTokenSecret) == nil {
			if err := meta.Put(metaTokenSecret, randomBytes(tokenSecretLen)); err != nil {
				return err
			}
		}
		dbID = string(meta.Get(metaDBID))
		seq = readU64(meta.Get(metaSeq))
		b.tokens = tokenSigner{secret: bytes.Clone(meta.Get(metaTokenSecret))}
		return nil
	})
	return dbID, seq, err
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return b
}

// begin holds the store open for one operation.
func (b *Bolt) begin() (func(), error) {
	b.life.RLock()
	if b.closed {
		b.life.RUnlock()
		return nil, errClosed
	}
	return b.life.RUnlock, nil
}

// Read implements Backend.
func (b *Bolt) Read(ctx context.Context, s *typesv1.Scope, key string) (Item, error) {
	enc, err := b.target(ctx, s, key)
	if err != nil {
		return Item{}, err
	}
	end, err := b.begin()
	if err != nil {
		return Item{}, err
	}
	defer end()
	var rec []byte
	err = b.db.View(func(tx *bolt.Tx) error {
		rec = bytes.Clone(tx.Bucket(bucketKV).Get(append(enc, key...)))
		return nil
	})
	if err != nil {
		return Item{}, err
	}
	if rec == nil {
		return Item{}, notFound(s, key)
	}
	rev, _, raw, err := decodeRecord(rec)
	if err != nil {
		return Item{}, err
	}
	v, err := unmarshalValue(raw)
	if err != nil {
		return Item{}, err
	}
	return Item{Value: v, Revision: rev}, nil
}

// Write implements Backend.
func (b *Bolt) Write(ctx context.Context, s *typesv1.Scope, key string, v *structpb.Value, g Guard) (WriteResult, error) {
	m, err := b.prepareWrite(ctx, s, key, v, g)
	if err != nil {
		return WriteResult{}, err
	}
	out, err := b.mutate(m)
	if err != nil {
		return WriteResult{}, err
	}
	return WriteResult{Revision: out.revision, Replayed: out.replayed}, nil
}

// Delete implements Backend.
func (b *Bolt) Delete(ctx context.Context, s *typesv1.Scope, key string, g Guard) (DeleteResult, error) {
	m, err := b.prepareDelete(ctx, s, key, g)
	if err != nil {
		return DeleteResult{}, err
	}
	if b.deleteIsNoop(m) {
		return DeleteResult{}, nil
	}
	out, err := b.mutate(m)
	if err != nil {
		return DeleteResult{}, err
	}
	return DeleteResult{Existed: out.existed, Replayed: out.replayed}, nil
}

// deleteIsNoop reports whether m, a Delete without idempotency key, finds
// nothing to delete and no condition to fail, so that it needs no write
// transaction (and no fsync).
func (b *Bolt) deleteIsNoop(m *mutation) bool {
	if m.guard.IdempotencyKey != "" || (m.guard.ExpectedRevision != nil && *m.guard.ExpectedRevision != 0) {
		return false
	}
	end, err := b.begin()
	if err != nil {
		return false // mutate reports it
	}
	defer end()
	missing := false
	_ = b.db.View(func(tx *bolt.Tx) error {
		missing = tx.Bucket(bucketKV).Get(m.ck()) == nil
		return nil
	})
	return missing
}

// mutate commits m (durably, possibly sharing the transaction with
// concurrent writers) and, when the change log took an entry, wakes the
// background indexer. Search catches the index up itself, so the index
// need not be current when mutate returns.
func (b *Bolt) mutate(m *mutation) (outcome, error) {
	end, err := b.begin()
	if err != nil {
		return outcome{}, err
	}
	defer end()
	var (
		out    outcome
		outErr error
		logged bool
	)
	err = b.group.run(func(tx *bolt.Tx) error {
		out, outErr, logged = outcome{}, nil, false // this may be a re-run
		o, err := apply(boltTxn{tx: tx, logged: &logged}, m, b.opts.retention)
		var kind *errs.Kind
		if errors.As(err, &kind) {
			outErr = err // a refusal: nothing was changed; let the others commit
			return nil
		}
		if err != nil {
			return err
		}
		out = o
		return nil
	})
	if err != nil {
		return outcome{}, fmt.Errorf("commit: %w", err)
	}
	if outErr != nil {
		return outcome{}, outErr
	}
	if out.seq > 0 {
		storeMax(&b.committed, out.seq)
	}
	if logged {
		b.index.notify()
	}
	return out, nil
}

func storeMax(a *atomic.Uint64, v uint64) {
	for {
		cur := a.Load()
		if v <= cur || a.CompareAndSwap(cur, v) {
			return
		}
	}
}

// housekeeping prunes expired idempotency records and change-log entries
// the index has persisted, a bounded number per transaction.
func (b *Bolt) housekeeping(tx *bolt.Tx) error {
	if err := pruneIdem(tx, b.opts.now(), b.opts.retention); err != nil {
		return err
	}
	return pruneChanges(tx, b.index.durable.Load())
}

func pruneIdem(tx *bolt.Tx, now time.Time, retention time.Duration) error {
	at, idem := tx.Bucket(bucketIdemAt), tx.Bucket(bucketIdem)
	var dead [][]byte
	c := at.Cursor()
	for k, _ := c.First(); k != nil && len(dead) < pruneIdemPerTx; k, _ = c.Next() {
		if len(k) < 8 || now.Sub(time.Unix(0, int64(readU64(k[:8])))) < retention {
			break
		}
		dead = append(dead, bytes.Clone(k))
	}
	for _, k := range dead {
		ik := k[8:]
		if r, err := decodeIdem(idem.Get(ik)); err == nil && uint64(r.created.UnixNano()) == readU64(k[:8]) {
			if err := idem.Delete(ik); err != nil {
				return err
			}
		}
		if err := at.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

func pruneChanges(tx *bolt.Tx, durable uint64) error {
	changes, meta := tx.Bucket(bucketChanges), tx.Bucket(bucketMeta)
	var dead [][]byte
	c := changes.Cursor()
	for k, _ := c.First(); k != nil && len(dead) < pruneChangesPerTx && readU64(k) <= durable; k, _ = c.Next() {
		dead = append(dead, bytes.Clone(k))
	}
	if len(dead) == 0 {
		return nil
	}
	for _, k := range dead {
		if err := changes.Delete(k); err != nil {
			return err
		}
	}
	last := readU64(dead[len(dead)-1])
	if readU64(meta.Get(metaChangesPruned)) >= last {
		return nil
	}
	return meta.Put(metaChangesPruned, u64(last))
}

// List implements Backend.
func (b *Bolt) List(ctx context.Context, s *typesv1.Scope, prefix, pageToken string, pageSize int) (ListPage, error) {
	return b.Scan(ctx, s, ListQuery{Prefix: prefix, PageToken: pageToken, PageSize: pageSize})
}

// Scan implements Backend. The page comes from one read transaction.
func (b *Bolt) Scan(ctx context.Context, s *typesv1.Scope, q ListQuery) (ListPage, error) {
	enc, after, hasAfter, err := b.listStart(ctx, s, q)
	if err != nil {
		return ListPage{}, err
	}
	end, err := b.begin()
	if err != nil {
		return ListPage{}, err
	}
	defer end()
	full := append(bytes.Clone(enc), q.Prefix...)
	p := &pager{q: q}
	err = b.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketKV).Cursor()
		var k, v []byte
		next := c.Next
		switch {
		case !q.Reverse && hasAfter:
			start := append(bytes.Clone(enc), after...)
			if k, v = c.Seek(start); bytes.Equal(k, start) {
				k, v = c.Next()
			}
		case !q.Reverse:
			k, v = c.Seek(full)
		default:
			next = c.Prev
			// The first key at or past the end of the range, then the
			// one before it.
			var bound []byte
			if hasAfter {
				bound = append(bytes.Clone(enc), after...)
			} else {
				bound = prefixEnd(full)
			}
			if bound == nil {
				k, v = c.Last()
			} else if k, _ = c.Seek(bound); k == nil {
				k, v = c.Last()
			} else {
				k, v = c.Prev()
			}
		}
		for ; k != nil && bytes.HasPrefix(k, full); k, v = next() {
			rev, _, raw, err := decodeRecord(v)
			if err != nil {
				return err
			}
			ok, err := p.add(string(k[len(enc):]), rev, raw)
			if err != nil || !ok {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return ListPage{}, err
	}
	return b.finishPage(enc, p), nil
}

// Search implements Backend. It first catches the index up with every
// committed change (those the background indexer has not applied yet),
// so it sees every Write and Delete acknowledged before it started.
func (b *Bolt) Search(ctx context.Context, s *typesv1.Scope, query string, limit int) ([]SearchHit, error) {
	enc, err := b.scopeOnly(ctx, s)
	if err != nil {
		return nil, err
	}
	if err := checkSearch(query, limit); err != nil {
		return nil, err
	}
	end, err := b.begin()
	if err != nil {
		return nil, err
	}
	defer end()
	if err := b.index.sync(b.committed.Load()); err != nil {
		b.opts.logger.Error("search index catch-up failed", "err", err)
		return nil, fmt.Errorf("search index is behind and cannot catch up; try again: %w", errs.Unavailable)
	}
	return b.index.search(ctx, enc, query, limit)
}

// VectorSearch implements VectorBackend. Like Search, it first catches
// the indexes up with every committed change; snippets come from the
// current values, read in one transaction (a key deleted since is left
// out).
func (b *Bolt) VectorSearch(ctx context.Context, s *typesv1.Scope, vec []float32, limit int) ([]SearchHit, error) {
	enc, err := b.scopeOnly(ctx, s)
	if err != nil {
		return nil, err
	}
	q, err := checkVectorSearch(vec, limit)
	if err != nil {
		return nil, err
	}
	end, err := b.begin()
	if err != nil {
		return nil, err
	}
	defer end()
	if err := b.index.sync(b.committed.Load()); err != nil {
		b.opts.logger.Error("search index catch-up failed", "err", err)
		return nil, fmt.Errorf("search index is behind and cannot catch up; try again: %w", errs.Unavailable)
	}
	ranked, err := b.index.vectors.search(ctx, string(enc), q, limit)
	if err != nil || len(ranked) == 0 {
		return nil, err
	}
	hits := make([]SearchHit, 0, len(ranked))
	wantSnippets := snippetsWanted(ctx)
	err = b.db.View(func(tx *bolt.Tx) error {
		kv := tx.Bucket(bucketKV)
		for _, h := range ranked {
			rec := kv.Get(append(bytes.Clone(enc), h.key...))
			if rec == nil {
				continue
			}
			if !wantSnippets {
				hits = append(hits, SearchHit{Key: h.key, Score: float64(h.score), Revision: h.rev})
				continue
			}
			_, _, raw, err := decodeRecord(rec)
			if err != nil {
				return err
			}
			v, err := unmarshalValue(raw)
			if err != nil {
				return err
			}
			hits = append(hits, SearchHit{Key: h.key, Score: float64(h.score), Snippet: snippet(valueText(v), nil), Revision: h.rev})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return hits, nil
}

// Close implements Backend. It waits for operations in flight, then
// brings the index up to date and waits (bounded) until bleve has
// persisted it.
func (b *Bolt) Close() error {
	b.life.Lock()
	defer b.life.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	return errors.Join(b.index.close(), b.db.Close())
}

// boltTxn is the txn of the bbolt backend. It records a change in the
// change log only when the index must see it: when the key's new value
// is indexed, or when its old value was (a Delete, or an unindexed value
// replacing it, removes the document). So a key written only unindexed
// never costs the index anything. This keeps the invariant the catch-up
// relies on: every key whose current value is unindexed or absent has
// either no document in the index or a change-log entry after the
// index's sequence (whose catch-up reads the current value and removes
// the document).
type boltTxn struct {
	tx *bolt.Tx
	// logged is set when the change log took an entry.
	logged *bool
}

func (t boltTxn) revision(ck []byte) (uint64, bool, error) {
	v := t.tx.Bucket(bucketKV).Get(ck)
	if v == nil {
		return 0, false, nil
	}
	rev, _, _, err := decodeRecord(v)
	return rev, err == nil, err
}

func (t boltTxn) put(ck []byte, rev uint64, raw []byte, unindexed bool, vec []float32) error {
	kv := t.tx.Bucket(bucketKV)
	vectors := t.tx.Bucket(bucketVectors)
	if vec != nil && !unindexed {
		if err := vectors.Put(ck, encodeVector(vec)); err != nil {
			return err
		}
	} else if vectors.Get(ck) != nil {
		if err := vectors.Delete(ck); err != nil {
			return err
		}
	}
	var flags byte
	logIt := true
	if unindexed {
		flags = recordUnindexed
		logIt = isIndexed(kv.Get(ck))
	}
	if err := kv.Put(ck, encodeRecord(rev, flags, raw)); err != nil {
		return err
	}
	return t.logChange(rev, ck, logIt)
}

func (t boltTxn) del(ck []byte, seq uint64) error {
	kv := t.tx.Bucket(bucketKV)
	logIt := isIndexed(kv.Get(ck))
	if err := kv.Delete(ck); err != nil {
		return err
	}
	if err := t.tx.Bucket(bucketVectors).Delete(ck); err != nil {
		return err
	}
	return t.logChange(seq, ck, logIt)
}

// logChange records seq -> ck in the change log when logIt.
func (t boltTxn) logChange(seq uint64, ck []byte, logIt bool) error {
	if !logIt {
		return nil
	}
	if t.logged != nil {
		*t.logged = true
	}
	return t.tx.Bucket(bucketChanges).Put(u64(seq), ck)
}

// isIndexed reports whether the kv record rec (nil when absent) may have
// a document in the index. An undecodable record counts as indexed, so
// its document is removed.
func isIndexed(rec []byte) bool {
	if rec == nil {
		return false
	}
	_, flags, _, err := decodeRecord(rec)
	return err != nil || flags&recordUnindexed == 0
}

func (t boltTxn) nextRevision() (uint64, error) {
	meta := t.tx.Bucket(bucketMeta)
	n := readU64(meta.Get(metaSeq)) + 1
	return n, meta.Put(metaSeq, u64(n))
}

func (t boltTxn) idem(ik []byte) (idemRecord, bool, error) {
	v := t.tx.Bucket(bucketIdem).Get(ik)
	if v == nil {
		return idemRecord{}, false, nil
	}
	r, err := decodeIdem(v)
	return r, err == nil, err
}

func (t boltTxn) putIdem(ik []byte, r idemRecord, prev *idemRecord) error {
	at := t.tx.Bucket(bucketIdemAt)
	if prev != nil {
		if err := at.Delete(idemAtKey(prev.created, ik)); err != nil {
			return err
		}
	}
	if err := t.tx.Bucket(bucketIdem).Put(ik, encodeIdem(r)); err != nil {
		return err
	}
	return at.Put(idemAtKey(r.created, ik), []byte{})
}
