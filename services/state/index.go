package state

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blevesearch/bleve/v2"
	"github.com/blevesearch/bleve/v2/analysis/analyzer/keyword"
	"github.com/blevesearch/bleve/v2/analysis/analyzer/standard"
	"github.com/blevesearch/bleve/v2/analysis/lang/en"
	"github.com/blevesearch/bleve/v2/index/scorch"
	"github.com/blevesearch/bleve/v2/mapping"
	blevesearch "github.com/blevesearch/bleve/v2/search"
	index "github.com/blevesearch/bleve_index_api"
	bolt "go.etcd.io/bbolt"
)

// The search index is a bleve (scorch) index beside the bbolt file. bbolt
// is the source of truth; the index is derived from it and may lag:
//
//   - Every applied Write or Delete takes a sequence number (its revision
//     counter value). When the index must see the change (the key's new
//     value is indexed, or its old value was), the same transaction
//     records it in the bbolt change log (bucket changes: seq ->
//     scope+key). A value written unindexed over an unindexed or absent
//     one leaves no entry, and costs the index nothing (see boltTxn).
//   - The Write is acknowledged after the commit (fsynced), before the
//     index sees it. The writer only wakes the background indexer, which
//     waits indexGather for more writes to arrive and then catches up:
//     under one lock, it reads the change log after the index's last
//     sequence and the current value of each changed key in one read
//     transaction, and applies them in one bleve batch that also stores
//     the new last sequence (or, when no entry needs the index, only
//     advances the sequence in memory). So the index always reflects a
//     prefix of the change log, and a burst of writes, serial or
//     concurrent, shares one batch and one bleve segment.
//   - Search first catches up the same way, to the last committed
//     sequence, under the same lock: a Search sees every Write and Delete
//     acknowledged before it started.
//   - bleve persists batches asynchronously; once it reports a sequence
//     persisted, later write transactions prune the change log up to it.
//   - Close stops the indexer, catches up and waits (bounded) until bleve
//     has persisted everything.
//   - On open, the index is rebuilt from the kv bucket (leaving out
//     unindexed values) when it is missing, unreadable, built for another
//     file or mapping, or older than the pruned change log; otherwise it
//     catches up from the change log (the crash-between-commit-and-index
//     case: a crash loses at most what the indexer had not persisted,
//     never a committed write).
//   - The vector index (vector.go) lives beside the bleve index, in
//     memory: it is built from the vectors bucket at every open (so after
//     a crash too), and every catch-up applies the same changed keys to
//     it (the key's current embedding, or its removal) before the bleve
//     batch. So vector search sees exactly what keyword search sees.
//   - If a catch-up fails, the write still succeeds (it is durable); the
//     next wake of the indexer or Search retries it (a Search that cannot
//     catch up is UNAVAILABLE, never an answer that misses a write).

// Internal keys stored in the index.
var (
	internalSeq     = []byte("neuron.seq")
	internalDBID    = []byte("neuron.db_id")
	internalMapping = []byte("neuron.mapping")
)

// mappingVersion changes whenever indexMapping changes, forcing a rebuild.
const mappingVersion = "1"

// Index field names.
const (
	fieldScope = "scope"
	fieldKey   = "key"
	fieldText  = "text"
	fieldRev   = "rev"
)

// indexBatchDocs bounds the documents of one bleve batch.
const indexBatchDocs = 1000

// indexGather is how long the background indexer lets writes gather
// after a wake before it indexes them in one batch: long enough that a
// serial writer's writes share batches (each batch is a bleve segment,
// with a fixed cost to build, persist and merge: in process at 1,000
// writes a second, 25 ms cost an indexed write about twice the CPU of
// 100 ms; at 250 a second, 300 ms and 1 s saved only another 10-25%),
// short enough that a Search rarely has much left to index itself (it
// does not wait for the indexer).
const indexGather = 100 * time.Millisecond

// runtimeConfig makes bleve batches return once searchable, persisting in
// the background; durability comes from bbolt and the change log. It is a
// fresh map per call: bleve writes into the map it is given (the store
// path), so a shared map would point every index at the first one's files.
//
// scorch's merge and persister options stay at their defaults. Measured
// on serial indexed writes (README, "Performance (issue 19)"): neither
// MaxSegmentsPerTier 30, FloorSegmentSize 200, nor ReclaimDeletesWeight
// 0 changed their CPU measurably, and FloorSegmentSize 20000 made it 5x
// worse; a persister nap (PersisterNapTimeMSec 1000) saved about a tenth,
// but delays persistence by the nap, and so every Close, which waits
// for it.
func runtimeConfig() map[string]any { return map[string]any{"unsafe_batch": true} }

// indexMapping indexes the text of values with English analysis (BM25
// scoring, stemming, stop words), keys with standard analysis, and the
// encoded scope as one exact term.
func indexMapping() mapping.IndexMapping {
	scopeField := bleve.NewKeywordFieldMapping()
	scopeField.Analyzer = keyword.Name
	scopeField.Store = false
	scopeField.IncludeInAll = false
	scopeField.IncludeTermVectors = false
	scopeField.DocValues = false

	textField := bleve.NewTextFieldMapping()
	textField.Analyzer = en.AnalyzerName
	textField.Store = true // for snippets
	textField.IncludeTermVectors = true
	textField.IncludeInAll = false
	textField.DocValues = false

	keyField := bleve.NewTextFieldMapping()
	keyField.Analyzer = standard.Name
	keyField.Store = false
	keyField.IncludeTermVectors = false
	keyField.IncludeInAll = false
	keyField.DocValues = false

	revField := bleve.NewTextFieldMapping()
	revField.Index = false
	revField.Store = true
	revField.IncludeInAll = false
	revField.IncludeTermVectors = false
	revField.DocValues = false

	doc := bleve.NewDocumentStaticMapping()
	doc.AddFieldMappingsAt(fieldScope, scopeField)
	doc.AddFieldMappingsAt(fieldText, textField)
	doc.AddFieldMappingsAt(fieldKey, keyField)
	doc.AddFieldMappingsAt(fieldRev, revField)

	m := bleve.NewIndexMapping()
	m.DefaultMapping = doc
	m.ScoringModel = index.BM25Scoring
	m.IndexDynamic = false
	m.StoreDynamic = false
	m.DocValuesDynamic = false
	return m
}

type searchIndex struct {
	path string
	db   *bolt.DB
	dbID string
	log  *slog.Logger

	mu  sync.Mutex // serialises updates
	idx bleve.Index
	// vectors is the vector index, updated with idx.
	vectors *vectorIndex
	// indexed: every change up to this sequence is searchable.
	indexed atomic.Uint64
	// durable: every change up to this sequence is persisted by bleve.
	durable atomic.Uint64
	// batches counts commits; persisted is the last one bleve persisted.
	batches   atomic.Uint64
	persisted atomic.Uint64
	// opened says how openIndex got the index (for logs and tests).
	opened string

	// The background indexer (start, notify, stopIndexer).
	wake     chan struct{} // capacity 1: a pending wake
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

// openIndex opens the index at path for the bbolt file db, rebuilding or
// catching it up as needed.
func openIndex(path string, db *bolt.DB, dbID string, log *slog.Logger) (*searchIndex, error) {
	s := &searchIndex{path: path, db: db, dbID: dbID, log: log, vectors: newVectorIndex(),
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	if err := s.loadVectors(); err != nil {
		return nil, fmt.Errorf("load embeddings: %w", err)
	}
	idx, seq, reason := s.tryOpen()
	if idx != nil {
		s.idx = idx
		s.indexed.Store(seq)
		s.durable.Store(seq)
		n, err := s.catchUp()
		if err == nil {
			s.opened = fmt.Sprintf("opened, caught up %d changes", n)
			if n > 0 {
				log.Info("search index caught up from the database", "path", path, "changes", n)
			}
			return s, nil
		}
		_ = idx.Close()
		reason = fmt.Sprintf("catch-up failed: %v", err)
	}
	log.Warn("rebuilding search index from the database", "path", path, "reason", reason)
	if err := s.rebuild(); err != nil {
		return nil, err
	}
	s.opened = "rebuilt: " + reason
	return s, nil
}

// tryOpen opens an existing index that can be caught up, or says why it
// must be rebuilt.
func (s *searchIndex) tryOpen() (idx bleve.Index, seq uint64, reason string) {
	if _, err := os.Stat(s.path); errors.Is(err, os.ErrNotExist) {
		return nil, 0, "index missing"
	}
	idx, err := openBleve(s.path)
	if err != nil {
		return nil, 0, fmt.Sprintf("index unreadable: %v", err)
	}
	seq, reason = s.check(idx)
	if reason != "" {
		_ = idx.Close()
		return nil, 0, reason
	}
	return idx, seq, ""
}

// openBleve opens the index, turning a panic on a damaged index into an
// error.
func openBleve(path string) (idx bleve.Index, err error) {
	defer func() {
		if r := recover(); r != nil {
			idx, err = nil, fmt.Errorf("panic opening index: %v", r)
		}
	}()
	return bleve.OpenUsing(path, runtimeConfig())
}

// check compares the index's bookkeeping with the database.
func (s *searchIndex) check(idx bleve.Index) (seq uint64, reason string) {
	get := func(k []byte) string {
		v, err := idx.GetInternal(k)
		if err != nil {
			return ""
		}
		return string(v)
	}
	if got := get(internalDBID); got != s.dbID {
		return 0, "index belongs to another database (or was never completed)"
	}
	if got := get(internalMapping); got != mappingVersion {
		return 0, fmt.Sprintf("index mapping is version %q; this build uses %q", got, mappingVersion)
	}
	seq, err := strconv.ParseUint(get(internalSeq), 10, 64)
	if err != nil {
		return 0, "index has no sequence number"
	}
	var last, pruned uint64
	_ = s.db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		last, pruned = readU64(meta.Get(metaSeq)), readU64(meta.Get(metaChangesPruned))
		return nil
	})
	switch {
	case seq > last:
		return 0, fmt.Sprintf("index is at change %d, ahead of the database at %d", seq, last)
	case seq < pruned:
		return 0, fmt.Sprintf("index is at change %d, older than the change log (pruned to %d)", seq, pruned)
	}
	return seq, ""
}

// rebuild replaces the index with one built from every key in the
// database.
func (s *searchIndex) rebuild() error {
	if err := os.RemoveAll(s.path); err != nil {
		return err
	}
	idx, err := bleve.NewUsing(s.path, indexMapping(), scorch.Name, scorch.Name, runtimeConfig())
	if err != nil {
		return err
	}
	s.idx = idx
	var last uint64
	batch := idx.NewBatch()
	err = s.db.View(func(tx *bolt.Tx) error {
		last = readU64(tx.Bucket(bucketMeta).Get(metaSeq))
		return tx.Bucket(bucketKV).ForEach(func(ck, rec []byte) error {
			d, err := makeDoc(ck, rec)
			if err != nil {
				return err
			}
			if d == nil {
				return nil // unindexed
			}
			if err := batch.Index(docID(ck), d); err != nil {
				return err
			}
			if batch.Size() >= indexBatchDocs {
				if err := idx.Batch(batch); err != nil {
					return err
				}
				batch.Reset()
			}
			return nil
		})
	})
	if err == nil {
		batch.SetInternal(internalDBID, []byte(s.dbID))
		batch.SetInternal(internalMapping, []byte(mappingVersion))
		err = s.commit(batch, last)
	}
	if err != nil {
		_ = idx.Close()
		return fmt.Errorf("rebuild: %w", err)
	}
	// Wait until the new index is on disk, so a crash now cannot leave a
	// half-written index behind (it would be rebuilt again, but bleve
	// handles some half-written indexes badly).
	if !s.waitPersisted(closeFlushTimeout) {
		s.log.Warn("rebuilt search index is not yet persisted", "path", s.path)
	}
	return nil
}

// commit applies batch and records that the index now holds every change
// up to seq.
// Commits are serialised (by s.mu, or by openIndex running alone).
func (s *searchIndex) commit(batch *bleve.Batch, seq uint64) error {
	gen := s.batches.Load() + 1
	batch.SetInternal(internalSeq, []byte(strconv.FormatUint(seq, 10)))
	batch.SetPersistedCallback(func(err error) {
		if err == nil {
			storeMax(&s.persisted, gen)
			storeMax(&s.durable, seq)
		}
	})
	if err := s.idx.Batch(batch); err != nil {
		return err
	}
	s.batches.Store(gen)
	s.indexed.Store(seq)
	return nil
}

// waitPersisted waits up to timeout for bleve to persist every committed
// batch and reports whether it did.
func (s *searchIndex) waitPersisted(timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for s.persisted.Load() < s.batches.Load() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
	return true
}

// start starts the background indexer.
func (s *searchIndex) start() { go s.run() }

// notify wakes the background indexer: the change log has new entries.
// It never blocks.
func (s *searchIndex) notify() {
	select {
	case s.wake <- struct{}{}:
	default: // a wake is already pending
	}
}

// stopIndexer stops the background indexer (started by start) and waits
// for it. It is safe to call more than once.
func (s *searchIndex) stopIndexer() {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.done
}

// run is the background indexer: on each wake, it waits indexGather for
// more writes, then catches the index up with the change log.
func (s *searchIndex) run() {
	defer close(s.done)
	gather := time.NewTimer(0)
	<-gather.C
	for {
		select {
		case <-s.stop:
			return
		case <-s.wake:
		}
		gather.Reset(indexGather)
		select {
		case <-s.stop:
			gather.Stop()
			return
		case <-gather.C:
		}
		s.mu.Lock()
		n, err := s.catchUp()
		s.mu.Unlock()
		if err != nil {
			// The writes are durable; the next wake or Search retries.
			s.log.Error("search index update failed; will retry", "err", err, "changes", n)
		}
	}
}

// sync makes every change up to seq searchable.
func (s *searchIndex) sync(seq uint64) error {
	if s.indexed.Load() >= seq {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.indexed.Load() >= seq {
		return nil // a concurrent writer's batch covered it
	}
	_, err := s.catchUp()
	return err
}

// catchUp applies every change after the index's sequence, returning how
// many keys it updated. The caller holds s.mu (or is openIndex).
func (s *searchIndex) catchUp() (int, error) {
	from := s.indexed.Load()
	var last uint64
	changed := map[string]indexDoc{} // by doc id; nil means deleted
	var vecs []vecChange
	err := s.db.View(func(tx *bolt.Tx) error {
		last = readU64(tx.Bucket(bucketMeta).Get(metaSeq))
		if last <= from {
			return nil
		}
		kv, vectors := tx.Bucket(bucketKV), tx.Bucket(bucketVectors)
		c := tx.Bucket(bucketChanges).Cursor()
		for k, ck := c.Seek(u64(from + 1)); k != nil; k, ck = c.Next() {
			id := docID(ck)
			if _, seen := changed[id]; seen {
				continue
			}
			rec := kv.Get(ck)
			vc, err := readVecChange(ck, rec, vectors.Get(ck))
			if err != nil {
				s.log.Error("stored embedding unreadable; the key is left out of vector search", "err", err)
			}
			vecs = append(vecs, vc)
			if rec == nil {
				changed[id] = nil
				continue
			}
			d, err := makeDoc(ck, rec)
			if err != nil {
				return err
			}
			changed[id] = d
		}
		return nil
	})
	if err != nil || last <= from {
		return 0, err
	}
	for _, vc := range vecs {
		s.vectors.set(vc.enc, vc.key, vc.rev, vc.vec)
	}
	if len(changed) == 0 {
		// Only changes the index need not see (unindexed writes over
		// unindexed values): nothing to apply, and nothing to persist.
		// The persisted sequence stays where it is; catching up again
		// from it after a restart finds the same nothing.
		s.indexed.Store(last)
		return 0, nil
	}
	batch := s.idx.NewBatch()
	for id, d := range changed {
		if d == nil {
			batch.Delete(id)
		} else if err := batch.Index(id, d); err != nil {
			return 0, err
		}
		if batch.Size() >= indexBatchDocs {
			if err := s.idx.Batch(batch); err != nil {
				return 0, err
			}
			batch.Reset()
		}
	}
	return len(changed), s.commit(batch, last)
}

// indexDoc is the document indexed for one key: fieldScope, fieldKey,
// fieldText and fieldRev, all strings.
type indexDoc = map[string]any

// docID is the index id of the key at ck (scope + key).
func docID(ck []byte) string { return base64.RawURLEncoding.EncodeToString(ck) }

// scopeTerm is the indexed scope field of an encoded scope.
func scopeTerm(enc []byte) string { return base64.RawURLEncoding.EncodeToString(enc) }

// makeDoc builds the document of a kv record, or returns nil for an
// unindexed one. It copies everything out of ck and rec.
func makeDoc(ck, rec []byte) (indexDoc, error) {
	rev, flags, raw, err := decodeRecord(rec)
	if err != nil {
		return nil, err
	}
	if flags&recordUnindexed != 0 {
		return nil, nil
	}
	enc, key, err := splitKey(ck)
	if err != nil {
		return nil, err
	}
	v, err := unmarshalValue(raw)
	if err != nil {
		return nil, err
	}
	return indexDoc{
		fieldScope: scopeTerm(enc),
		fieldKey:   key,
		fieldText:  valueText(v),
		fieldRev:   strconv.FormatUint(rev, 10),
	}, nil
}

// search runs query in the scope encoded as enc.
func (s *searchIndex) search(ctx context.Context, enc []byte, query string, limit int) ([]SearchHit, error) {
	inScope := bleve.NewTermQuery(scopeTerm(enc))
	inScope.SetField(fieldScope)
	inText := bleve.NewMatchQuery(query)
	inText.SetField(fieldText)
	inKey := bleve.NewMatchQuery(query)
	inKey.SetField(fieldKey)
	inKey.SetBoost(keyWeight)
	q := bleve.NewConjunctionQuery(inScope, bleve.NewDisjunctionQuery(inText, inKey))

	req := bleve.NewSearchRequestOptions(q, limit, 0, false)
	wantSnippets := snippetsWanted(ctx)
	req.Fields = []string{fieldRev}
	if wantSnippets {
		req.Fields = append(req.Fields, fieldText)
		req.IncludeLocations = true
	}
	req.SortBy([]string{"-_score", "_id"})
	res, err := s.idx.SearchInContext(ctx, req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("search index: %w", err)
	}
	hits := make([]SearchHit, 0, len(res.Hits))
	prefix := scopeTerm(enc)
	for _, h := range res.Hits {
		ck, err := base64.RawURLEncoding.DecodeString(h.ID)
		if err != nil || !strings.HasPrefix(string(ck), string(enc)) {
			return nil, fmt.Errorf("search index: document %q is not in scope %s", h.ID, prefix)
		}
		revText, _ := h.Fields[fieldRev].(string)
		rev, _ := strconv.ParseUint(revText, 10, 64)
		hit := SearchHit{Key: string(ck[len(enc):]), Score: h.Score, Revision: rev}
		if wantSnippets {
			text, _ := h.Fields[fieldText].(string)
			hit.Snippet = snippet(text, hitSpans(h.Locations[fieldText]))
		}
		hits = append(hits, hit)
	}
	return hits, nil
}

// hitSpans are the match locations of a bleve hit's field.
func hitSpans(locs blevesearch.TermLocationMap) []span {
	var spans []span
	for _, ls := range locs {
		for _, l := range ls {
			spans = append(spans, span{int(l.Start), int(l.End)})
		}
	}
	return spans
}

// vecChange is the vector index's update for one changed key.
type vecChange struct {
	enc, key string
	rev      uint64
	vec      []float32 // nil: remove
}

// readVecChange reads the embedding of the key at ck: its kv record rec
// (nil when absent) and stored vector raw (nil when none). An unreadable
// vector removes the key (with the error, for the log).
func readVecChange(ck, rec, raw []byte) (vecChange, error) {
	enc, key, err := splitKey(ck)
	if err != nil {
		return vecChange{}, err
	}
	vc := vecChange{enc: string(enc), key: key}
	if rec == nil || raw == nil {
		return vc, nil
	}
	rev, flags, _, err := decodeRecord(rec)
	if err != nil || flags&recordUnindexed != 0 {
		return vc, err
	}
	vec, err := decodeVector(raw)
	if err != nil {
		return vc, fmt.Errorf("key %q: %w", truncate(key), err)
	}
	vc.rev, vc.vec = rev, vec
	return vc, nil
}

// loadVectors builds the vector index from the vectors bucket.
func (s *searchIndex) loadVectors() error {
	err := s.db.View(func(tx *bolt.Tx) error {
		kv := tx.Bucket(bucketKV)
		return tx.Bucket(bucketVectors).ForEach(func(ck, raw []byte) error {
			vc, err := readVecChange(ck, kv.Get(ck), raw)
			if err != nil {
				s.log.Error("stored embedding unreadable; the key is left out of vector search", "err", err)
			}
			if vc.vec != nil {
				s.vectors.set(vc.enc, vc.key, vc.rev, vc.vec)
			}
			return nil
		})
	})
	if n := s.vectors.size(); n > 0 {
		s.log.Info("vector index loaded from the database", "path", s.path, "vectors", n)
	}
	return err
}

// closeFlushTimeout bounds how long close waits for bleve to persist.
const closeFlushTimeout = 10 * time.Second

// close stops the background indexer, applies what it had not, and
// waits (bounded) until bleve has persisted every applied batch, as
// bleve's Close drops unpersisted ones, then closes the index. Whatever
// is not persisted is caught up from the change log on the next open.
func (s *searchIndex) close() error {
	s.stopIndexer()
	defer s.vectors.close()
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.catchUp(); err != nil {
		s.log.Warn("search index catch-up at close failed; it will catch up on next open", "err", err)
	}
	if !s.waitPersisted(closeFlushTimeout) {
		s.log.Warn("closing search index before it persisted; it will catch up on next open",
			"persisted", s.durable.Load(), "indexed", s.indexed.Load())
	}
	return s.idx.Close()
}
