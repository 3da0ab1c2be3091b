package state

import (
	"cmp"
	"container/heap"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/embed"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/state/internal/hnsw"
)

// Vector search. A Write may carry an embedding (Guard.Embedding, from
// WriteRequest.embedding or computed by the Server's embedder); it is
// stored normalized with the value, and VectorSearch ranks a scope's keys
// by cosine similarity (the dot product of normalized vectors) to a
// query vector. A scope with fewer than annMin vectors of the query's
// dimensions is searched exactly (every vector compared, split over the
// cores for large scopes); a larger one through an HNSW graph of its own
// (internal/hnsw), approximate: recall@10 against exact search is
// measured by BenchmarkVectorRecall and asserted by TestVectorRecall.
// Scope filtering is exact either way (one graph per scope), and a
// deleted or overwritten key's old vector is never returned.

// MaxVectorDims is the most dimensions of an embedding (the proto's
// max_items).
const MaxVectorDims = embed.MaxDimensions

// VectorBackend is a Backend with vector search. The Server serves
// vector and hybrid Search, and embedded Writes, only on such a backend;
// on another it answers UNIMPLEMENTED.
type VectorBackend interface {
	Backend
	// VectorSearch returns up to limit (1..MaxSearchLimit) keys of the
	// scope that have an embedding of len(vec) dimensions, ranked by
	// cosine similarity to vec, best first, each with a snippet of the
	// start of its value's text. It sees every Write and Delete
	// acknowledged before it started. FailedPrecondition when the scope
	// has embeddings but none of len(vec) dimensions.
	VectorSearch(ctx context.Context, s *typesv1.Scope, vec []float32, limit int) ([]SearchHit, error)
}

// checkVector validates an embedding and returns a normalized copy.
func checkVector(v []float32, what string) ([]float32, error) {
	if len(v) > MaxVectorDims {
		return nil, fmt.Errorf("%s has %d dimensions; the limit is %d: %w", what, len(v), MaxVectorDims, errs.InvalidArgument)
	}
	var sum float64
	for i, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return nil, fmt.Errorf("%s value %d is not a finite number: %w", what, i, errs.InvalidArgument)
		}
		sum += float64(x) * float64(x)
	}
	if sum == 0 {
		return nil, fmt.Errorf("%s is all zeros, which has no direction to compare: %w", what, errs.InvalidArgument)
	}
	return embed.Normalize(slices.Clone(v)), nil
}

// encodeVector is the stored form of a vector: float32s, little-endian.
func encodeVector(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// decodeVector reads encodeVector's output.
func decodeVector(b []byte) ([]float32, error) {
	if len(b)%4 != 0 || len(b) == 0 || len(b) > 4*MaxVectorDims {
		return nil, fmt.Errorf("stored embedding of %d bytes", len(b))
	}
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v, nil
}

// vectorIndex holds the embeddings of every indexed key, by scope, in
// memory. The bbolt backend rebuilds it from the file at every open and
// keeps it in step with the change log, beside the bleve index
// (index.go); the PostgreSQL backend keeps one per replica, checked
// against the database at each search (postgres_vector.go); the memory
// backend searches its documents exactly instead.
//
// Each scope keeps its entries (for exact search) and, once it holds
// annMin vectors of one dimension count, an HNSW graph of those, kept in
// step by set after. The graph is dropped when the scope falls below
// annMin/2 of them.
//
// Graphs are built in the background: set never waits for a build, nor
// does search, which answers exactly until the graph is ready. Crossing
// annMin starts a build goroutine from a snapshot of the scope's
// vectors of that dimension count (hnsw.Build, over the cores); changes
// made meanwhile are queued and applied to the new graph before it goes
// in (or, when they outnumber half the snapshot, as at open, the build
// starts again from a new snapshot). Once a graph's tombstones
// (overwritten and deleted keys) outnumber its live keys, a new graph is
// built the same way while the old one keeps answering. One build runs
// at a time; close stops them.
type vectorIndex struct {
	mu     sync.RWMutex
	scopes map[string]*vecScope // by encoded scope
	count  int
	// annMin is the fewest vectors of the query's dimensions for which a
	// scope is searched through its graph (annMin by default).
	annMin int
	closed bool
	builds sync.WaitGroup // build goroutines
	// buildSem lets one build run at a time (each uses every core).
	buildSem chan struct{}
	// buildHook, when set (by tests, before any set), is called by each
	// build goroutine before it builds.
	buildHook func()
}

type vecScope struct {
	entries []vecEntry
	pos     map[string]int // key -> index in entries
	dims    map[int]int    // dimension count -> entries with it
	graphs  map[int]*hnsw.Graph[string]
	builds  map[int]*graphBuild // in progress, by dimension count
}

// graphBuild is a graph being built in the background for one scope and
// dimension count.
type graphBuild struct {
	stop atomic.Bool
	// pending holds the changes to the scope's vectors of this dimension
	// count since the build's snapshot, in order (vec nil: removed).
	// Guarded by vectorIndex.mu.
	pending []vecChangeOf
}

type vecChangeOf struct {
	key string
	vec []float32
}

type vecEntry struct {
	key string
	rev uint64
	vec []float32 // normalized
}

// annMin is the scope size (vectors of the query's dimensions) from
// which vector search goes through the scope's HNSW graph: below it,
// exact search takes a few milliseconds at most (4096 x 768 dimensions:
// 12 MB scanned).
const annMin = 4096

// annEf is the HNSW candidate list size of a search (at least the
// limit): the measured recall@10 at 100k clustered vectors is in the
// README.
const annEf = hnsw.DefaultEfSearch

func newVectorIndex() *vectorIndex {
	return &vectorIndex{scopes: map[string]*vecScope{}, annMin: annMin, buildSem: make(chan struct{}, 1)}
}

// graphConfig is the configuration of every scope graph: the vector
// index rebuilds graphs itself, in the background.
func graphConfig(dims int) hnsw.Config {
	return hnsw.Config{Seed: uint64(dims), NoCompact: true}
}

// close stops the background builds and waits for them to return.
func (x *vectorIndex) close() {
	x.mu.Lock()
	x.closed = true
	for _, sc := range x.scopes {
		for d, b := range sc.builds {
			b.stop.Store(true)
			delete(sc.builds, d)
		}
	}
	x.mu.Unlock()
	x.builds.Wait()
}

// settle waits until no build is running (for tests and benchmarks,
// which then see the graphs the builds made).
func (x *vectorIndex) settle() { x.builds.Wait() }

// startBuild starts building scope sc's graph of its d-dimension vectors
// in the background. The caller holds x.mu for writing.
func (x *vectorIndex) startBuild(enc string, sc *vecScope, d int) {
	if x.closed || sc.builds[d] != nil {
		return
	}
	b := &graphBuild{}
	sc.builds[d] = b
	keys, vecs := sc.snapshot(d)
	x.builds.Add(1)
	go x.build(enc, sc, d, b, keys, vecs)
}

// snapshot returns the keys and vectors of sc's d-dimension entries.
func (sc *vecScope) snapshot(d int) ([]string, [][]float32) {
	keys, vecs := make([]string, 0, sc.dims[d]), make([][]float32, 0, sc.dims[d])
	for _, e := range sc.entries {
		if len(e.vec) == d {
			keys = append(keys, e.key)
			vecs = append(vecs, e.vec)
		}
	}
	return keys, vecs
}

// build is the goroutine of a graphBuild: it builds the graph of the
// snapshot, applies the changes queued meanwhile and puts the graph in
// the scope, unless the build was stopped (the scope shrank, the index
// closed) or the queue grew past half the snapshot (then it starts again
// from a new snapshot).
func (x *vectorIndex) build(enc string, sc *vecScope, d int, b *graphBuild, keys []string, vecs [][]float32) {
	defer x.builds.Done()
	if x.buildHook != nil {
		x.buildHook()
	}
	x.buildSem <- struct{}{}
	defer func() { <-x.buildSem }()
	for {
		g := hnsw.Build(graphConfig(d), keys, vecs, runtime.GOMAXPROCS(0), b.stop.Load)
		for g != nil {
			x.mu.Lock()
			if b.stop.Load() || sc.builds[d] != b {
				x.mu.Unlock()
				return
			}
			queued := b.pending
			b.pending = nil
			if len(queued) > max(64, len(keys)/2) {
				keys, vecs = sc.snapshot(d)
				x.mu.Unlock()
				break // build again from the new snapshot
			}
			if len(queued) <= 64 {
				applyQueued(g, queued)
				delete(sc.builds, d)
				sc.graphs[d] = g
				x.mu.Unlock()
				return
			}
			x.mu.Unlock()
			applyQueued(g, queued) // the graph is not in use yet
		}
		if g == nil {
			return // stopped
		}
	}
}

// applyQueued applies queued changes to g, in order.
func applyQueued(g *hnsw.Graph[string], queued []vecChangeOf) {
	for _, c := range queued {
		if c.vec == nil {
			g.Delete(c.key)
		} else {
			g.Set(c.key, c.vec)
		}
	}
}

// set stores key's vector (normalized), or removes the key when vec is
// nil.
func (x *vectorIndex) set(enc, key string, rev uint64, vec []float32) {
	x.mu.Lock()
	defer x.mu.Unlock()
	sc := x.scopes[enc]
	if vec == nil {
		if sc == nil {
			return
		}
		i, ok := sc.pos[key]
		if !ok {
			return
		}
		x.untrack(enc, sc, key, len(sc.entries[i].vec))
		last := len(sc.entries) - 1
		if i != last {
			sc.entries[i] = sc.entries[last]
			sc.pos[sc.entries[i].key] = i
		}
		sc.entries[last] = vecEntry{}
		sc.entries = sc.entries[:last]
		delete(sc.pos, key)
		x.count--
		if len(sc.entries) == 0 {
			for _, b := range sc.builds {
				b.stop.Store(true)
			}
			delete(x.scopes, enc)
		}
		return
	}
	if sc == nil {
		sc = &vecScope{pos: map[string]int{}, dims: map[int]int{}, graphs: map[int]*hnsw.Graph[string]{}, builds: map[int]*graphBuild{}}
		x.scopes[enc] = sc
	}
	if i, ok := sc.pos[key]; ok {
		x.untrack(enc, sc, key, len(sc.entries[i].vec))
		sc.entries[i] = vecEntry{key: key, rev: rev, vec: vec}
	} else {
		sc.pos[key] = len(sc.entries)
		sc.entries = append(sc.entries, vecEntry{key: key, rev: rev, vec: vec})
		x.count++
	}
	d := len(vec)
	sc.dims[d]++
	if b := sc.builds[d]; b != nil {
		b.pending = append(b.pending, vecChangeOf{key: key, vec: vec})
	}
	if g := sc.graphs[d]; g != nil {
		g.Set(key, vec)
		if g.NeedsCompaction() {
			x.startBuild(enc, sc, d)
		}
	} else if sc.dims[d] >= x.annMin {
		x.startBuild(enc, sc, d)
	}
}

// untrack takes key's vector of d dimensions out of scope sc's counts,
// graph and build, dropping (or stopping) the graph when it falls below
// half of annMin. The caller holds x.mu for writing.
func (x *vectorIndex) untrack(enc string, sc *vecScope, key string, d int) {
	sc.dims[d]--
	if sc.dims[d] == 0 {
		delete(sc.dims, d)
	}
	if sc.dims[d] < x.annMin/2 {
		delete(sc.graphs, d)
		if b := sc.builds[d]; b != nil {
			b.stop.Store(true)
			delete(sc.builds, d)
		}
		return
	}
	if b := sc.builds[d]; b != nil {
		b.pending = append(b.pending, vecChangeOf{key: key})
	}
	if g := sc.graphs[d]; g != nil {
		g.Delete(key)
		if g.NeedsCompaction() {
			x.startBuild(enc, sc, d)
		}
	}
}

// size is the number of vectors held.
func (x *vectorIndex) size() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.count
}

// vecHit is one result of vectorIndex.search.
type vecHit struct {
	key   string
	rev   uint64
	score float32
}

// parallelVectors is the scope size from which search splits the scan
// over the cores.
const parallelVectors = 8192

// search returns the limit keys of the scope enc most similar to q
// (normalized), best first, ties by key: through the scope's graph when
// it has one for len(q) dimensions and at least annMin vectors, else
// exactly.
func (x *vectorIndex) search(ctx context.Context, enc string, q []float32, limit int) ([]vecHit, error) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	sc := x.scopes[enc]
	if sc == nil {
		return nil, nil
	}
	g := sc.graphs[len(q)]
	if g == nil || sc.dims[len(q)] < x.annMin {
		return rankVectors(ctx, sc.entries, q, limit)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	found := g.Search(q, limit, max(annEf, limit))
	hits := make([]vecHit, len(found))
	for i, r := range found {
		hits[i] = vecHit{key: r.Key, rev: sc.entries[sc.pos[r.Key]].rev, score: r.Score}
	}
	return hits, nil
}

// searchExact is search without the graphs (for tests and benchmarks).
func (x *vectorIndex) searchExact(ctx context.Context, enc string, q []float32, limit int) ([]vecHit, error) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	sc := x.scopes[enc]
	if sc == nil {
		return nil, nil
	}
	return rankVectors(ctx, sc.entries, q, limit)
}

// rankVectors returns the limit entries most similar to q (normalized),
// best first, ties by key; FailedPrecondition when entries is not empty
// but none has len(q) dimensions.
func rankVectors(ctx context.Context, entries []vecEntry, q []float32, limit int) ([]vecHit, error) {
	if len(entries) == 0 {
		return nil, nil
	}
	parts := 1
	if len(entries) >= parallelVectors {
		parts = min(runtime.GOMAXPROCS(0), len(entries)/(parallelVectors/2))
	}
	tops := make([]topK, parts)
	matched := make([]bool, parts)
	var wg sync.WaitGroup
	for p := range parts {
		lo, hi := p*len(entries)/parts, (p+1)*len(entries)/parts
		scan := func() {
			t := topK{limit: limit}
			for i := lo; i < hi; i++ {
				e := &entries[i]
				if len(e.vec) != len(q) {
					continue
				}
				matched[p] = true
				t.offer(i, hnsw.Dot(q, e.vec), entries)
			}
			tops[p] = t
		}
		if parts == 1 {
			scan()
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); scan() }()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if !slices.Contains(matched, true) {
		return nil, fmt.Errorf("the query embedding has %d dimensions; this scope's embeddings have %d (embed the query with the model that embedded the values): %w",
			len(q), len(entries[0].vec), errs.FailedPrecondition)
	}
	var all []vecHit
	for _, t := range tops {
		for _, c := range t.items {
			e := entries[c.i]
			all = append(all, vecHit{key: e.key, rev: e.rev, score: c.score})
		}
	}
	slices.SortFunc(all, func(a, b vecHit) int {
		if c := cmp.Compare(b.score, a.score); c != 0 {
			return c
		}
		return strings.Compare(a.key, b.key)
	})
	if len(all) > limit {
		all = all[:limit]
	}
	return all, nil
}

// topK keeps the limit best candidates in a min-heap (worst on top).
type topK struct {
	limit   int
	items   []cand
	entries []vecEntry
}

type cand struct {
	i     int
	score float32
}

func (t *topK) offer(i int, score float32, entries []vecEntry) {
	t.entries = entries
	if len(t.items) < t.limit {
		heap.Push(t, cand{i, score})
		return
	}
	if t.less(cand{i, score}, t.items[0]) {
		return
	}
	t.items[0] = cand{i, score}
	heap.Fix(t, 0)
}

// less: a ranks below b (lower score, or equal score and a later key).
func (t *topK) less(a, b cand) bool {
	if a.score != b.score {
		return a.score < b.score
	}
	return t.entries[a.i].key > t.entries[b.i].key
}

func (t *topK) Len() int           { return len(t.items) }
func (t *topK) Less(i, j int) bool { return t.less(t.items[i], t.items[j]) }
func (t *topK) Swap(i, j int)      { t.items[i], t.items[j] = t.items[j], t.items[i] }
func (t *topK) Push(v any)         { t.items = append(t.items, v.(cand)) }
func (t *topK) Pop() any {
	n := len(t.items) - 1
	v := t.items[n]
	t.items = t.items[:n]
	return v
}

// checkVectorSearch validates the arguments of VectorSearch and returns
// the normalized query vector.
func checkVectorSearch(vec []float32, limit int) ([]float32, error) {
	if len(vec) == 0 {
		return nil, fmt.Errorf("the query embedding is empty: %w", errs.InvalidArgument)
	}
	if limit < 1 || limit > MaxSearchLimit {
		return nil, fmt.Errorf("limit is %d; it must be between 1 and %d: %w", limit, MaxSearchLimit, errs.InvalidArgument)
	}
	return checkVector(vec, "query embedding")
}
