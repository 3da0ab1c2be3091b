package state

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/scope"
)

// Memory is a Backend that keeps everything in process memory, with the
// same semantics as the bbolt backend (one shared test suite checks
// both). It is NOT durable: everything is lost when the process exits.
// Use it in tests and as the conformance suite's second implementation.
//
// Its Search is a small BM25 over lower-cased words of the values' text
// (no stemming or stop words), computed per query over the scope's
// indexed keys (unindexed ones are left out, as if absent): fine for
// tests, not for large stores.
type Memory struct {
	core

	mu        sync.RWMutex
	closed    bool
	docs      map[string]*memDoc // by scope+key
	keys      []string           // the keys of docs, sorted
	seq       uint64             // the revision counter
	idems     map[string]idemRecord
	idemOrder []idemEntry     // idempotency records in insertion order, for pruning
	marks     []retentionMark // the retention sweeper's notes (retention_memory.go)
}

type memDoc struct {
	rev        uint64
	vec        []float32 // normalized embedding; nil: none
	raw        []byte
	unindexed  bool // then text and the tokens are empty
	text       string
	textTokens []token
	keyTokens  []token
}

type idemEntry struct {
	ik      string
	created time.Time
}

var _ Backend = (*Memory)(nil)

// NewMemory returns an empty in-memory store.
func NewMemory(opts ...Option) *Memory {
	secret := make([]byte, tokenSecretLen)
	_, _ = rand.Read(secret) // crypto/rand.Read never fails
	return &Memory{
		core:  core{opts: applyOptions(opts), tokens: tokenSigner{secret: secret}},
		docs:  make(map[string]*memDoc),
		idems: make(map[string]idemRecord),
	}
}

// Read implements Backend.
func (m *Memory) Read(ctx context.Context, s *typesv1.Scope, key string) (Item, error) {
	enc, err := m.target(ctx, s, key)
	if err != nil {
		return Item{}, err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return Item{}, errClosed
	}
	d, ok := m.docs[string(enc)+key]
	if !ok {
		return Item{}, notFound(s, key)
	}
	v, err := unmarshalValue(d.raw)
	if err != nil {
		return Item{}, err
	}
	return Item{Value: v, Revision: d.rev}, nil
}

// Write implements Backend.
func (m *Memory) Write(ctx context.Context, s *typesv1.Scope, key string, v *structpb.Value, g Guard) (WriteResult, error) {
	mu, err := m.prepareWrite(ctx, s, key, v, g)
	if err != nil {
		return WriteResult{}, err
	}
	out, err := m.mutate(mu)
	if err != nil {
		return WriteResult{}, err
	}
	return WriteResult{Revision: out.revision, Replayed: out.replayed}, nil
}

// Delete implements Backend.
func (m *Memory) Delete(ctx context.Context, s *typesv1.Scope, key string, g Guard) (DeleteResult, error) {
	mu, err := m.prepareDelete(ctx, s, key, g)
	if err != nil {
		return DeleteResult{}, err
	}
	out, err := m.mutate(mu)
	if err != nil {
		return DeleteResult{}, err
	}
	return DeleteResult{Existed: out.existed, Replayed: out.replayed}, nil
}

func (m *Memory) mutate(mu *mutation) (outcome, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return outcome{}, errClosed
	}
	m.pruneIdem(mu.now)
	// apply checks everything before it changes anything, and memTxn
	// cannot fail, so there is nothing to roll back.
	return apply(memTxn{m}, mu, m.opts.retention)
}

// pruneIdem drops idempotency records older than the retention.
func (m *Memory) pruneIdem(now time.Time) {
	cut := 0
	for _, e := range m.idemOrder {
		if now.Sub(e.created) < m.opts.retention {
			break
		}
		if r, ok := m.idems[e.ik]; ok && r.created.Equal(e.created) {
			delete(m.idems, e.ik)
		}
		cut++
	}
	m.idemOrder = m.idemOrder[cut:]
}

// List implements Backend.
func (m *Memory) List(ctx context.Context, s *typesv1.Scope, prefix, pageToken string, pageSize int) (ListPage, error) {
	return m.Scan(ctx, s, ListQuery{Prefix: prefix, PageToken: pageToken, PageSize: pageSize})
}

// Scan implements Backend.
func (m *Memory) Scan(ctx context.Context, s *typesv1.Scope, q ListQuery) (ListPage, error) {
	enc, after, hasAfter, err := m.listStart(ctx, s, q)
	if err != nil {
		return ListPage{}, err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return ListPage{}, errClosed
	}
	full := string(enc) + q.Prefix
	// i is the first key of the page (it may lack the prefix: then the
	// page is empty); step the direction.
	var i, step int
	switch {
	case !q.Reverse && hasAfter:
		i, _ = slices.BinarySearch(m.keys, string(enc)+after)
		if i < len(m.keys) && m.keys[i] == string(enc)+after {
			i++
		}
		step = 1
	case !q.Reverse:
		i, _ = slices.BinarySearch(m.keys, full)
		step = 1
	case hasAfter:
		i, _ = slices.BinarySearch(m.keys, string(enc)+after)
		i, step = i-1, -1
	default:
		i = len(m.keys)
		if end := prefixEnd([]byte(full)); end != nil {
			i, _ = slices.BinarySearch(m.keys, string(end))
		}
		i, step = i-1, -1
	}
	p := &pager{q: q}
	for ; i >= 0 && i < len(m.keys) && strings.HasPrefix(m.keys[i], full); i += step {
		d := m.docs[m.keys[i]]
		ok, err := p.add(m.keys[i][len(enc):], d.rev, d.raw)
		if err != nil {
			return ListPage{}, err
		}
		if !ok {
			break
		}
	}
	return m.finishPage(enc, p), nil
}

// BM25 parameters, as bleve uses them.
const (
	bm25K1 = 1.2
	bm25B  = 0.75
	// keyWeight scales matches in the key against matches in the value.
	keyWeight = 0.5
)

// Search implements Backend.
func (m *Memory) Search(ctx context.Context, s *typesv1.Scope, query string, limit int) ([]SearchHit, error) {
	enc, err := m.scopeOnly(ctx, s)
	if err != nil {
		return nil, err
	}
	if err := checkSearch(query, limit); err != nil {
		return nil, err
	}
	terms := map[string]bool{}
	for _, t := range tokenize(query) {
		terms[t.term] = true
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, errClosed
	}
	var docs []string
	i, _ := slices.BinarySearch(m.keys, string(enc))
	for ; i < len(m.keys) && strings.HasPrefix(m.keys[i], string(enc)); i++ {
		if !m.docs[m.keys[i]].unindexed {
			docs = append(docs, m.keys[i])
		}
	}
	textScore := bm25(docs, terms, func(ck string) []token { return m.docs[ck].textTokens })
	keyScore := bm25(docs, terms, func(ck string) []token { return m.docs[ck].keyTokens })
	var hits []SearchHit
	for _, ck := range docs {
		score := textScore[ck] + keyWeight*keyScore[ck]
		if score <= 0 {
			continue
		}
		d := m.docs[ck]
		hits = append(hits, SearchHit{Key: ck[len(enc):], Score: score, Revision: d.rev})
	}
	slices.SortFunc(hits, func(a, b SearchHit) int {
		if c := cmp.Compare(b.Score, a.Score); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	if len(hits) > limit {
		hits = hits[:limit]
	}
	if snippetsWanted(ctx) {
		for i, h := range hits {
			d := m.docs[string(enc)+h.Key]
			var spans []span
			for _, t := range d.textTokens {
				if terms[t.term] {
					spans = append(spans, t.span)
				}
			}
			hits[i].Snippet = snippet(d.text, spans)
		}
	}
	return hits, nil
}

// VectorSearch implements VectorBackend, by comparing the query with
// every embedding of the scope.
func (m *Memory) VectorSearch(ctx context.Context, s *typesv1.Scope, vec []float32, limit int) ([]SearchHit, error) {
	enc, err := m.scopeOnly(ctx, s)
	if err != nil {
		return nil, err
	}
	q, err := checkVectorSearch(vec, limit)
	if err != nil {
		return nil, err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, errClosed
	}
	var entries []vecEntry
	i, _ := slices.BinarySearch(m.keys, string(enc))
	for ; i < len(m.keys) && strings.HasPrefix(m.keys[i], string(enc)); i++ {
		if d := m.docs[m.keys[i]]; d.vec != nil && !d.unindexed {
			entries = append(entries, vecEntry{key: m.keys[i][len(enc):], rev: d.rev, vec: d.vec})
		}
	}
	ranked, err := rankVectors(ctx, entries, q, limit)
	if err != nil {
		return nil, err
	}
	hits := make([]SearchHit, len(ranked))
	wantSnippets := snippetsWanted(ctx)
	for i, h := range ranked {
		hits[i] = SearchHit{Key: h.key, Score: float64(h.score), Revision: h.rev}
		if wantSnippets {
			hits[i].Snippet = snippet(m.docs[string(enc)+h.key].text, nil)
		}
	}
	return hits, nil
}

// bm25 scores each doc's field (given by field) against terms.
func bm25(docs []string, terms map[string]bool, field func(string) []token) map[string]float64 {
	if len(docs) == 0 || len(terms) == 0 {
		return nil
	}
	tf := make(map[string]map[string]int, len(docs))
	df := map[string]int{}
	total := 0
	for _, ck := range docs {
		toks := field(ck)
		total += len(toks)
		counts := map[string]int{}
		for _, t := range toks {
			if terms[t.term] {
				counts[t.term]++
			}
		}
		for t := range counts {
			df[t]++
		}
		tf[ck] = counts
	}
	avg := math.Max(1, float64(total)/float64(len(docs)))
	n := float64(len(docs))
	scores := make(map[string]float64, len(docs))
	for _, ck := range docs {
		dl := float64(len(field(ck)))
		for t, f := range tf[ck] {
			idf := math.Log(1 + (n-float64(df[t])+0.5)/(float64(df[t])+0.5))
			ff := float64(f)
			scores[ck] += idf * ff * (bm25K1 + 1) / (ff + bm25K1*(1-bm25B+bm25B*dl/avg))
		}
	}
	return scores
}

// Close implements Backend.
func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	m.docs, m.keys, m.idems, m.idemOrder = nil, nil, nil, nil
	return nil
}

// memTxn is the txn of the memory backend; the caller holds m.mu.
type memTxn struct{ m *Memory }

func (t memTxn) revision(ck []byte) (uint64, bool, error) {
	d, ok := t.m.docs[string(ck)]
	if !ok {
		return 0, false, nil
	}
	return d.rev, true, nil
}

func (t memTxn) put(ck []byte, rev uint64, raw []byte, unindexed bool, vec []float32) error {
	d := &memDoc{rev: rev, raw: bytes.Clone(raw), unindexed: unindexed, vec: vec}
	if !unindexed {
		v, err := unmarshalValue(raw)
		if err != nil {
			return err
		}
		_, key, err := scope.Split(ck)
		if err != nil {
			return err
		}
		d.text = valueText(v)
		d.textTokens, d.keyTokens = tokenize(d.text), tokenize(string(key))
	}
	k := string(ck)
	if _, ok := t.m.docs[k]; !ok {
		i, _ := slices.BinarySearch(t.m.keys, k)
		t.m.keys = slices.Insert(t.m.keys, i, k)
	}
	t.m.docs[k] = d
	return nil
}

func (t memTxn) del(ck []byte, _ uint64) error {
	k := string(ck)
	if _, ok := t.m.docs[k]; !ok {
		return nil
	}
	delete(t.m.docs, k)
	if i, found := slices.BinarySearch(t.m.keys, k); found {
		t.m.keys = slices.Delete(t.m.keys, i, i+1)
	}
	return nil
}

func (t memTxn) nextRevision() (uint64, error) {
	t.m.seq++
	return t.m.seq, nil
}

func (t memTxn) idem(ik []byte) (idemRecord, bool, error) {
	r, ok := t.m.idems[string(ik)]
	return r, ok, nil
}

func (t memTxn) putIdem(ik []byte, r idemRecord, _ *idemRecord) error {
	t.m.idems[string(ik)] = r
	t.m.idemOrder = append(t.m.idemOrder, idemEntry{ik: string(ik), created: r.created})
	return nil
}
