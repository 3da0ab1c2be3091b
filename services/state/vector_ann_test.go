package state

import (
	"fmt"
	"slices"
	"testing"

	"github.com/secbear/neuron/services/state/internal/hnsw"
	"github.com/secbear/neuron/services/state/internal/vecsynth"
)

// annRecall is the share of the exact top k that x.search finds, over
// queries in scope enc.
func annRecall(t testing.TB, x *vectorIndex, enc string, queries [][]float32, k int) float64 {
	t.Helper()
	found, total := 0, 0
	for _, q := range queries {
		got, err := x.search(t.Context(), enc, q, k)
		if err != nil {
			t.Fatal(err)
		}
		want, err := x.searchExact(t.Context(), enc, q, k)
		if err != nil {
			t.Fatal(err)
		}
		keys := map[string]bool{}
		for _, h := range got {
			keys[h.key] = true
		}
		for _, h := range want {
			total++
			if keys[h.key] {
				found++
			}
		}
	}
	return float64(found) / float64(total)
}

// TestVectorRecall: a scope past annMin (lowered to 1000, to keep the
// test short under -race) is searched through its HNSW
// graph, whose recall@10 against exact search on clustered vectors is at
// least 0.95, also after deletes and overwrites; results carry current
// revisions and never a deleted key or another scope's key; a scope that
// shrinks goes back to exact search.
func TestVectorRecall(t *testing.T) {
	const dims, minRecall = 128, 0.95
	n := 1500
	data := vecsynth.New(7, dims, 40)
	x := newVectorIndex()
	x.annMin = 1000
	for i := range n {
		x.set("a", fmt.Sprintf("k%05d", i), uint64(i+1), data.Next())
		x.set("b", fmt.Sprintf("k%05d", i), uint64(i+1), data.Next())
	}
	x.set("small", "only", 1, data.Next())
	x.settle()
	if g := x.scopes["a"].graphs[dims]; g == nil || g.Len() != n {
		t.Fatalf("scope a (%d vectors, annMin %d) has no graph of them all", n, x.annMin)
	}
	queries := data.Vectors(100)
	if r := annRecall(t, x, "a", queries, 10); r < minRecall {
		t.Errorf("recall@10 at %d vectors: %.3f; want at least %v", n, r, minRecall)
	} else {
		t.Logf("recall@10 at %d vectors: %.3f", n, r)
	}

	// Delete a quarter and overwrite a quarter (new vectors, revisions).
	deleted := map[string]bool{}
	for i := 0; i < n; i += 2 {
		key := fmt.Sprintf("k%05d", i)
		if i%4 == 0 {
			x.set("a", key, 0, nil)
			deleted[key] = true
		} else {
			x.set("a", key, uint64(n+i), data.Next())
		}
	}
	if r := annRecall(t, x, "a", queries, 10); r < minRecall {
		t.Errorf("recall@10 after deletes and overwrites: %.3f; want at least %v", r, minRecall)
	}
	sc := x.scopes["a"]
	for _, q := range queries {
		hits, err := x.search(t.Context(), "a", q, 50)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range hits {
			i, ok := sc.pos[h.key]
			if deleted[h.key] || !ok {
				t.Fatalf("deleted key %q returned", h.key)
			}
			if e := sc.entries[i]; e.rev != h.rev {
				t.Fatalf("key %q returned at revision %d; it is at %d", h.key, h.rev, e.rev)
			}
		}
	}
	// A deleted key's own vector does not find it.
	x.set("a", "gone", 99, queries[0])
	x.set("a", "gone", 0, nil)
	if hits, _ := x.search(t.Context(), "a", queries[0], 10); slices.ContainsFunc(hits, func(h vecHit) bool { return h.key == "gone" }) {
		t.Error("a deleted key was found by its own vector")
	}
	// Scopes stay apart.
	if hits, _ := x.search(t.Context(), "small", queries[0], 10); len(hits) != 1 || hits[0].key != "only" {
		t.Errorf("scope small: %v; want its one key", hits)
	}

	// Shrink scope b below annMin/2: the graph goes, search is exact.
	for i := range n - x.annMin/2 + 1 {
		x.set("b", fmt.Sprintf("k%05d", i), 0, nil)
	}
	if x.scopes["b"].graphs[dims] != nil {
		t.Error("scope b kept its graph below annMin/2")
	}
	if r := annRecall(t, x, "b", queries[:10], 10); r != 1 {
		t.Errorf("recall of exact search: %v", r)
	}
}

// TestVectorSearchDuringBuild: a scope crossing annMin gets its graph
// built in the background; while the build is held (by the test's hook),
// searches answer at once, exactly, and writes and deletes go on; the
// graph then goes in with those changes applied (no deleted key, the
// overwritten keys' new vectors), and searches go through it. With the
// build made synchronous again (searches waiting for it), the search
// below would block on the held build and the test would time out.
func TestVectorSearchDuringBuild(t *testing.T) {
	const dims, n = 64, 300
	data := vecsynth.New(9, dims, 10)
	x := newVectorIndex()
	defer x.close()
	x.annMin = 200
	started, release := make(chan struct{}), make(chan struct{})
	x.buildHook = func() {
		started <- struct{}{}
		<-release
	}
	vecs := map[string][]float32{}
	set := func(key string, v []float32) {
		x.set("a", key, uint64(len(vecs)+1), v)
		if v == nil {
			delete(vecs, key)
		} else {
			vecs[key] = v
		}
	}
	for i := range x.annMin {
		set(fmt.Sprintf("k%04d", i), data.Next())
	}
	<-started // the build has its snapshot and waits for release
	for i := x.annMin; i < n; i++ {
		set(fmt.Sprintf("k%04d", i), data.Next())
	}
	set("k0000", nil)
	set("k0001", data.Next())
	queries := data.Vectors(20)
	for _, q := range queries {
		got, err := x.search(t.Context(), "a", q, 10)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := x.searchExact(t.Context(), "a", q, 10)
		if !slices.Equal(got, want) {
			t.Fatalf("search during the build: %v; exact search: %v", got, want)
		}
	}
	if x.scopes["a"].graphs[dims] != nil {
		t.Fatal("the graph is in before its build was released")
	}
	close(release)
	x.settle()
	g := x.scopes["a"].graphs[dims]
	if g == nil || g.Len() != len(vecs) {
		t.Fatalf("after the build: graph %v; want one of %d keys", g, len(vecs))
	}
	// The queued changes are in: every result is a current key at its
	// current vector, the deleted key is gone, and (the graph being
	// approximate, and built in parallel) nearly every key is found by
	// its own vector.
	missed := 0
	for key, v := range vecs {
		hits := g.Search(v, 10, 0)
		if !slices.ContainsFunc(hits, func(r hnsw.Result[string]) bool { return r.Key == key }) {
			missed++
		}
		for _, r := range hits {
			if cur, ok := vecs[r.Key]; !ok || hnsw.Dot(v, cur) != r.Score {
				t.Fatalf("the built graph returned %q (score %v), which is deleted or at an old vector", r.Key, r.Score)
			}
		}
	}
	if missed > len(vecs)/100 {
		t.Errorf("%d of %d keys not found by their own vector in the built graph", missed, len(vecs))
	}
	if r := annRecall(t, x, "a", queries, 10); r < 0.95 {
		t.Errorf("recall@10 through the built graph: %.3f", r)
	}
}
