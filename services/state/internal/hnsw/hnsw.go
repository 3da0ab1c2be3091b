// Package hnsw is an approximate nearest-neighbour index: a hierarchical
// navigable small world graph (Malkov and Yashunin, "Efficient and robust
// approximate nearest neighbor search using Hierarchical Navigable Small
// World graphs", 2018) over normalized float32 vectors of one dimension
// count, ranked by dot product (cosine similarity).
//
// Each vector is a node with a random top level (geometric, mean 1/ln M
// levels above 0); on each of its levels it links to up to M nodes (2M
// on level 0) chosen by the paper's heuristic (a candidate is kept when
// it is nearer the new node than every neighbour already kept, which
// keeps links across clusters). A search descends greedily from the top
// level's entry node, then explores level 0 keeping the ef best nodes
// seen.
//
// Set replaces a key's vector and Delete removes a key. A removed or
// replaced node stays in the graph as a tombstone, still followed by
// searches (so the graph stays connected) but never returned nor linked
// to by new nodes; once tombstones outnumber live nodes, the graph is
// rebuilt from the live ones (an amortized cost of one insert per
// delete). Results are therefore always live keys with their current
// vectors; what is approximate is only which of them are found.
//
// A Graph is safe for concurrent use: Set and Delete take its lock;
// Searches run concurrently with each other.
//
// Build makes a graph of many vectors at once, inserting from several
// goroutines: each node's links then have a lock of their own, taken
// only while Build runs (a parallel build is not deterministic; a graph
// grown by Set is).
package hnsw

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
)

// Default parameters.
const (
	// DefaultM is the number of links per node per level (2M on level 0).
	DefaultM = 16
	// DefaultEfConstruction is the candidate list size when inserting.
	DefaultEfConstruction = 100
	// DefaultEfSearch is the candidate list size when searching (at
	// least the number of results asked for).
	DefaultEfSearch = 96
	// maxLevel bounds the random level of a node.
	maxLevel = 16
	// compactMin is the fewest tombstones that trigger a rebuild.
	compactMin = 64
	// pruneSlack: a node's links on a level may grow a 1/pruneSlack past
	// their bound before the heuristic prunes them back to it, so that
	// one pruning (the pairwise similarities of all its links, most of
	// an insert's cost) serves several new links.
	pruneSlack = 4
)

// Config holds a Graph's parameters; zero fields take the defaults.
type Config struct {
	M              int
	EfConstruction int
	EfSearch       int
	// Seed seeds the level generator, so that a graph built from the
	// same operations is the same graph.
	Seed uint64
	// NoCompact leaves tombstones in the graph however many there are:
	// the caller rebuilds it (with Build, from its live keys) when
	// NeedsCompaction says so, instead of Set or Delete rebuilding it
	// under the graph's lock.
	NoCompact bool
}

// Result is one key found by Search.
type Result[K cmp.Ordered] struct {
	Key   K
	Score float32 // dot product with the query
}

// Graph is an HNSW index of vectors by key.
type Graph[K cmp.Ordered] struct {
	mu       sync.RWMutex
	cfg      Config
	ml       float64
	rng      *rand.Rand
	nodes    []node[K]
	ids      map[K]uint32 // live keys
	entry    int          // top level's entry node; -1 when empty
	top      int          // entry's level
	deleted  int          // tombstones
	visitedP sync.Pool    // *bitset
	// building is set while Build inserts from several goroutines: links
	// are then read and written under their node's mu, and entry and top
	// under entryMu.
	building bool
	entryMu  sync.Mutex
}

type node[K cmp.Ordered] struct {
	key     K
	vec     []float32
	links   [][]uint32 // per level, 0..the node's level
	deleted bool
	mu      sync.Mutex // guards links while the graph is building
}

// New returns an empty graph.
func New[K cmp.Ordered](cfg Config) *Graph[K] {
	if cfg.M < 2 {
		cfg.M = DefaultM
	}
	if cfg.EfConstruction < 1 {
		cfg.EfConstruction = DefaultEfConstruction
	}
	if cfg.EfSearch < 1 {
		cfg.EfSearch = DefaultEfSearch
	}
	g := &Graph[K]{cfg: cfg, ml: 1 / math.Log(float64(cfg.M))}
	g.reset()
	return g
}

func (g *Graph[K]) reset() {
	g.rng = rand.New(rand.NewPCG(g.cfg.Seed, 0x686e7377))
	g.nodes, g.ids, g.entry, g.top, g.deleted = nil, map[K]uint32{}, -1, 0, 0
}

// Len is the number of live keys.
func (g *Graph[K]) Len() int {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return len(g.ids)
}

// Tombstones is the number of removed or replaced nodes still in the
// graph.
func (g *Graph[K]) Tombstones() int {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.deleted
}

// Set stores vec (normalized; the graph keeps the slice, which the
// caller must not change) as key's vector, replacing any earlier one.
// Every vector of a graph must have the same length.
func (g *Graph[K]) Set(key K, vec []float32) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.remove(key)
	g.insert(key, vec)
	g.maybeCompact()
}

// Delete removes key; it does nothing when key is absent.
func (g *Graph[K]) Delete(key K) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.remove(key) {
		g.maybeCompact()
	}
}

// remove makes key's node a tombstone.
func (g *Graph[K]) remove(key K) bool {
	id, ok := g.ids[key]
	if !ok {
		return false
	}
	delete(g.ids, key)
	g.nodes[id].deleted = true
	g.deleted++
	return true
}

// NeedsCompaction reports whether tombstones outnumber the live keys
// (and are at least a few dozen): the point from which a graph made
// with NoCompact should be rebuilt.
func (g *Graph[K]) NeedsCompaction() bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.deleted >= compactMin && g.deleted > len(g.ids)
}

// maybeCompact rebuilds the graph from its live nodes once tombstones
// outnumber them.
func (g *Graph[K]) maybeCompact() {
	if g.deleted < compactMin || g.deleted <= len(g.ids) || g.cfg.NoCompact {
		if len(g.ids) == 0 && g.deleted > 0 {
			g.reset()
		}
		return
	}
	old := g.nodes
	g.reset()
	for i := range old {
		if !old[i].deleted {
			g.insert(old[i].key, old[i].vec)
		}
	}
}

func (g *Graph[K]) randomLevel() int {
	l := int(-math.Log(1-g.rng.Float64()) * g.ml)
	return min(l, maxLevel)
}

func (g *Graph[K]) maxLinks(level int) int {
	if level == 0 {
		return 2 * g.cfg.M
	}
	return g.cfg.M
}

// insert adds a node for key (absent from g.ids).
func (g *Graph[K]) insert(key K, vec []float32) {
	id := uint32(len(g.nodes))
	level := g.randomLevel()
	g.nodes = append(g.nodes, node[K]{key: key, vec: vec, links: make([][]uint32, level+1)})
	g.ids[key] = id
	if g.entry < 0 {
		g.entry, g.top = int(id), level
		return
	}
	g.insertNode(id)
}

// entryPoint returns the top level's entry node and its level.
func (g *Graph[K]) entryPoint() (int, int) {
	if !g.building {
		return g.entry, g.top
	}
	g.entryMu.Lock()
	defer g.entryMu.Unlock()
	return g.entry, g.top
}

// insertNode links node id (in g.nodes, with its vector and levels, and
// not the entry node) into the graph.
func (g *Graph[K]) insertNode(id uint32) {
	vec := g.nodes[id].vec
	level := len(g.nodes[id].links) - 1
	entry, top := g.entryPoint()
	if g.building && level > top {
		// A node that will be the new entry is inserted alone (as
		// hnswlib does): inserted against a top level that another such
		// node raises meanwhile, it would miss links on the levels
		// between, which searches descend through.
		g.entryMu.Lock()
		defer g.entryMu.Unlock()
		entry, top = g.entry, g.top
	}
	ep := cand{id: uint32(entry), sim: dot(vec, g.nodes[entry].vec)}
	var buf []uint32
	for l := top; l > level; l-- {
		ep = g.greedy(vec, ep, l, &buf)
	}
	vis := g.getVisited()
	defer g.visitedP.Put(vis)
	for l := min(level, top); l >= 0; l-- {
		found := g.searchLayer(vec, ep, g.cfg.EfConstruction, l, vis, &buf)
		// In a parallel build, another insert may have linked to id
		// already: never link id to itself.
		found = slices.DeleteFunc(found, func(c cand) bool { return c.id == id })
		if len(found) > 0 {
			ep = found[0]
		}
		neigh := g.selectNeighbors(found, g.cfg.M)
		links := make([]uint32, len(neigh), g.maxLinks(l)+g.maxLinks(l)/pruneSlack)
		for i, c := range neigh {
			links[i] = c.id
		}
		g.setLinks(id, l, links)
		for _, c := range neigh {
			g.link(c.id, id, l)
		}
	}
	if level > top {
		// Building, the lock is held since the start (level > top).
		g.entry, g.top = int(id), level
	}
}

// setLinks sets node id's links on level l. In a parallel build,
// another insert may have linked id to itself already (it reached id
// from a level above): those links are kept too.
func (g *Graph[K]) setLinks(id uint32, l int, links []uint32) {
	n := &g.nodes[id]
	if g.building {
		n.mu.Lock()
		defer n.mu.Unlock()
	}
	early := n.links[l]
	n.links[l] = links
	for _, x := range early {
		if !slices.Contains(n.links[l], x) {
			g.addLink(n, x, l)
		}
	}
}

// linksOf returns node id's links on level l: the node's own slice, or,
// while building, a copy in *buf made under the node's lock.
func (g *Graph[K]) linksOf(id uint32, l int, buf *[]uint32) []uint32 {
	n := &g.nodes[id]
	if !g.building {
		return n.links[l]
	}
	n.mu.Lock()
	*buf = append((*buf)[:0], n.links[l]...)
	n.mu.Unlock()
	return *buf
}

// link adds a link from node `from` to node `to` on level l, pruning
// from's links with the heuristic when there are too many (tombstones go
// first).
func (g *Graph[K]) link(from, to uint32, l int) {
	n := &g.nodes[from]
	if g.building {
		n.mu.Lock()
		defer n.mu.Unlock()
	}
	g.addLink(n, to, l)
}

// addLink is link with n's lock held (when building).
func (g *Graph[K]) addLink(n *node[K], to uint32, l int) {
	if len(n.links[l]) < g.maxLinks(l)+g.maxLinks(l)/pruneSlack {
		n.links[l] = append(n.links[l], to)
		return
	}
	cands := make([]cand, 0, len(n.links[l])+1)
	for _, x := range append(n.links[l], to) {
		if !g.nodes[x].deleted {
			cands = append(cands, cand{id: x, sim: dot(n.vec, g.nodes[x].vec)})
		}
	}
	sortBest(cands)
	keep := g.selectNeighbors(cands, g.maxLinks(l))
	n.links[l] = n.links[l][:0]
	for _, c := range keep {
		n.links[l] = append(n.links[l], c.id)
	}
}

// selectNeighbors picks up to m of cands (sorted best first) by the
// paper's heuristic, filling up with the best of the rest.
func (g *Graph[K]) selectNeighbors(cands []cand, m int) []cand {
	if len(cands) <= m {
		return cands
	}
	out := make([]cand, 0, m)
	var rest []cand
	for _, c := range cands {
		if len(out) == m {
			break
		}
		good := true
		for _, r := range out {
			if dot(g.nodes[c.id].vec, g.nodes[r.id].vec) > c.sim {
				good = false
				break
			}
		}
		if good {
			out = append(out, c)
		} else {
			rest = append(rest, c)
		}
	}
	for i := 0; len(out) < m && i < len(rest); i++ {
		out = append(out, rest[i])
	}
	return out
}

// greedy walks level l from ep to the node most similar to q.
func (g *Graph[K]) greedy(q []float32, ep cand, l int, buf *[]uint32) cand {
	for changed := true; changed; {
		changed = false
		for _, x := range g.linksOf(ep.id, l, buf) {
			if s := dot(q, g.nodes[x].vec); s > ep.sim {
				ep, changed = cand{id: x, sim: s}, true
			}
		}
	}
	return ep
}

// searchLayer explores level l from ep and returns up to ef nodes most
// similar to q, best first. Tombstones are followed but not returned;
// vis is cleared first.
func (g *Graph[K]) searchLayer(q []float32, ep cand, ef, l int, vis *bitset, buf *[]uint32) []cand {
	vis.reset(len(g.nodes))
	vis.set(ep.id)
	var todo maxHeap
	var best minHeap
	todo.push(ep)
	if !g.nodes[ep.id].deleted {
		best.push(ep)
	}
	for len(todo) > 0 {
		c := todo.pop()
		if len(best) >= ef && c.sim < best[0].sim {
			break
		}
		for _, x := range g.linksOf(c.id, l, buf) {
			if vis.has(x) {
				continue
			}
			vis.set(x)
			s := dot(q, g.nodes[x].vec)
			if len(best) < ef || s > best[0].sim {
				todo.push(cand{id: x, sim: s})
				if !g.nodes[x].deleted {
					best.push(cand{id: x, sim: s})
					if len(best) > ef {
						best.pop()
					}
				}
			}
		}
	}
	out := []cand(best)
	sortBest(out)
	return out
}

// Search returns up to k live keys most similar to q (normalized, of the
// graph's vectors' length), best first, ties by key. ef is the candidate
// list size: 0 is the Config's EfSearch; it is at least k.
func (g *Graph[K]) Search(q []float32, k, ef int) []Result[K] {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.entry < 0 || k < 1 || len(g.ids) == 0 {
		return nil
	}
	if ef < 1 {
		ef = g.cfg.EfSearch
	}
	ef = max(ef, k)
	ep := cand{id: uint32(g.entry), sim: dot(q, g.nodes[g.entry].vec)}
	for l := g.top; l > 0; l-- {
		ep = g.greedy(q, ep, l, nil)
	}
	vis := g.getVisited()
	found := g.searchLayer(q, ep, ef, 0, vis, nil)
	g.visitedP.Put(vis)
	out := make([]Result[K], len(found))
	for i, c := range found {
		out[i] = Result[K]{Key: g.nodes[c.id].key, Score: c.sim}
	}
	slices.SortFunc(out, func(a, b Result[K]) int {
		if c := cmp.Compare(b.Score, a.Score); c != 0 {
			return c
		}
		return cmp.Compare(a.Key, b.Key)
	})
	if len(out) > k {
		out = out[:k]
	}
	return out
}

// Build returns a graph of keys[i] -> vecs[i] (distinct keys; vectors
// normalized, of one length, kept by the graph and never changed), with
// the levels Set would give them in this order, inserted by workers
// goroutines at once (fewer than 1: one). It gives up, returning nil,
// once stop (when not nil) returns true; stop is called before each
// insert, from any of the goroutines.
func Build[K cmp.Ordered](cfg Config, keys []K, vecs [][]float32, workers int, stop func() bool) *Graph[K] {
	g := New[K](cfg)
	if len(keys) == 0 {
		return g
	}
	g.nodes = make([]node[K], len(keys))
	for i, key := range keys {
		g.nodes[i].key, g.nodes[i].vec = key, vecs[i]
		g.nodes[i].links = make([][]uint32, g.randomLevel()+1)
		g.ids[key] = uint32(i)
	}
	g.entry, g.top = 0, len(g.nodes[0].links)-1
	g.building = true
	var next atomic.Int64
	next.Store(1)
	var stopped atomic.Bool
	var wg sync.WaitGroup
	for range max(1, workers) {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(len(keys)) {
					return
				}
				if stop != nil && stop() {
					stopped.Store(true)
					return
				}
				g.insertNode(uint32(i))
			}
		})
	}
	wg.Wait()
	g.building = false
	if stopped.Load() {
		return nil
	}
	return g
}

func (g *Graph[K]) getVisited() *bitset {
	if v, ok := g.visitedP.Get().(*bitset); ok {
		return v
	}
	return &bitset{}
}

// cand is a node and its similarity to the query.
type cand struct {
	id  uint32
	sim float32
}

// sortBest sorts by similarity, best first (ties by id, for a
// deterministic graph).
func sortBest(c []cand) {
	slices.SortFunc(c, func(a, b cand) int {
		if x := cmp.Compare(b.sim, a.sim); x != 0 {
			return x
		}
		return cmp.Compare(a.id, b.id)
	})
}

// bitset marks visited nodes.
type bitset struct{ w []uint64 }

func (b *bitset) reset(n int) {
	words := (n + 63) / 64
	if cap(b.w) < words {
		b.w = make([]uint64, words)
		return
	}
	b.w = b.w[:words]
	clear(b.w)
}

func (b *bitset) set(i uint32)      { b.w[i/64] |= 1 << (i % 64) }
func (b *bitset) has(i uint32) bool { return b.w[i/64]&(1<<(i%64)) != 0 }

// maxHeap pops the most similar candidate first.
type maxHeap []cand

func (h *maxHeap) push(c cand) {
	*h = append(*h, c)
	a := *h
	for i := len(a) - 1; i > 0; {
		p := (i - 1) / 2
		if a[p].sim >= a[i].sim {
			break
		}
		a[p], a[i] = a[i], a[p]
		i = p
	}
}

func (h *maxHeap) pop() cand {
	a := *h
	top := a[0]
	n := len(a) - 1
	a[0] = a[n]
	a = a[:n]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < n && a[l].sim > a[m].sim {
			m = l
		}
		if r < n && a[r].sim > a[m].sim {
			m = r
		}
		if m == i {
			break
		}
		a[i], a[m] = a[m], a[i]
		i = m
	}
	*h = a
	return top
}

// minHeap keeps the least similar candidate on top.
type minHeap []cand

func (h *minHeap) push(c cand) {
	*h = append(*h, c)
	a := *h
	for i := len(a) - 1; i > 0; {
		p := (i - 1) / 2
		if a[p].sim <= a[i].sim {
			break
		}
		a[p], a[i] = a[i], a[p]
		i = p
	}
}

func (h *minHeap) pop() cand {
	a := *h
	top := a[0]
	n := len(a) - 1
	a[0] = a[n]
	a = a[:n]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < n && a[l].sim < a[m].sim {
			m = l
		}
		if r < n && a[r].sim < a[m].sim {
			m = r
		}
		if m == i {
			break
		}
		a[i], a[m] = a[m], a[i]
		i = m
	}
	*h = a
	return top
}
