package hnsw

import (
	"cmp"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"

	"github.com/secbear/neuron/pkg/embed"
	"github.com/secbear/neuron/services/state/internal/vecsynth"
)

// exact returns the k keys of vecs most similar to q, by brute force.
func exact(vecs map[string][]float32, q []float32, k int) []Result[string] {
	var all []Result[string]
	for key, v := range vecs {
		all = append(all, Result[string]{Key: key, Score: Dot(q, v)})
	}
	slices.SortFunc(all, func(a, b Result[string]) int {
		if c := cmp.Compare(b.Score, a.Score); c != 0 {
			return c
		}
		return cmp.Compare(a.Key, b.Key)
	})
	return all[:min(k, len(all))]
}

// recall is the share of the exact top k that the graph finds, over
// queries.
func recall(t *testing.T, g *Graph[string], vecs map[string][]float32, queries [][]float32, k int) float64 {
	t.Helper()
	found, total := 0, 0
	for _, q := range queries {
		got := g.Search(q, k, 0)
		keys := map[string]bool{}
		for _, r := range got {
			if _, live := vecs[r.Key]; !live {
				t.Fatalf("search returned %q, which is not a live key", r.Key)
			}
			if want := Dot(q, vecs[r.Key]); r.Score != want {
				t.Fatalf("key %q scored %v; its current vector scores %v", r.Key, r.Score, want)
			}
			keys[r.Key] = true
		}
		for _, r := range exact(vecs, q, k) {
			total++
			if keys[r.Key] {
				found++
			}
		}
	}
	return float64(found) / float64(total)
}

// minRecall is the recall@10 the index must reach on clustered data.
const minRecall = 0.95

// TestRecall: recall@10 against brute force on a seeded clustered set,
// after inserts only and after deletes and overwrites.
func TestRecall(t *testing.T) {
	n, dims := 5000, 256
	if testing.Short() || raceEnabled {
		n = 2000
	}
	data := vecsynth.New(1, dims, 50)
	g := New[string](Config{Seed: 1})
	vecs := map[string][]float32{}
	for i := range n {
		key := fmt.Sprintf("k%05d", i)
		vecs[key] = data.Next()
		g.Set(key, vecs[key])
	}
	queries := data.Vectors(200)
	if r := recall(t, g, vecs, queries, 10); r < minRecall {
		t.Errorf("recall@10 after %d inserts: %.3f; want at least %v", n, r, minRecall)
	} else {
		t.Logf("recall@10 after %d inserts: %.3f", n, r)
	}

	// Delete a third, overwrite a third with new vectors.
	for i := range n {
		key := fmt.Sprintf("k%05d", i)
		switch i % 3 {
		case 0:
			g.Delete(key)
			delete(vecs, key)
		case 1:
			vecs[key] = data.Next()
			g.Set(key, vecs[key])
		}
	}
	if g.Len() != len(vecs) {
		t.Fatalf("Len %d; %d keys are live", g.Len(), len(vecs))
	}
	if r := recall(t, g, vecs, queries, 10); r < minRecall {
		t.Errorf("recall@10 after deletes and overwrites: %.3f; want at least %v", r, minRecall)
	} else {
		t.Logf("recall@10 after deletes and overwrites: %.3f (tombstones %d)", r, g.Tombstones())
	}
}

// TestBuild: a graph made by Build from 4 goroutines at once reaches
// the recall of one grown by Set, holds every key, and then takes Set
// and Delete like any other; a Build whose stop says so gives up (run
// with -race: the parallel inserts share nodes).
func TestBuild(t *testing.T) {
	n, dims := 5000, 256
	if testing.Short() || raceEnabled {
		n = 2000
	}
	data := vecsynth.New(1, dims, 50)
	keys := make([]string, n)
	vecs := map[string][]float32{}
	all := make([][]float32, n)
	for i := range n {
		keys[i] = fmt.Sprintf("k%05d", i)
		all[i] = data.Next()
		vecs[keys[i]] = all[i]
	}
	g := Build(Config{Seed: 1}, keys, all, 4, nil)
	if g.Len() != n {
		t.Fatalf("Len %d; want %d", g.Len(), n)
	}
	queries := data.Vectors(200)
	if r := recall(t, g, vecs, queries, 10); r < minRecall {
		t.Errorf("recall@10 after a parallel build of %d: %.3f; want at least %v", n, r, minRecall)
	} else {
		t.Logf("recall@10 after a parallel build of %d: %.3f", n, r)
	}
	// Every key is reachable: a search for its own vector finds it.
	missed := 0
	for _, key := range keys {
		if got := g.Search(vecs[key], 1, 0); len(got) != 1 || got[0].Key != key {
			missed++
		}
	}
	if missed > n/100 {
		t.Errorf("%d of %d keys not found by their own vector", missed, n)
	}
	for i := 0; i < n; i += 2 {
		if i%4 == 0 {
			g.Delete(keys[i])
			delete(vecs, keys[i])
		} else {
			vecs[keys[i]] = data.Next()
			g.Set(keys[i], vecs[keys[i]])
		}
	}
	if r := recall(t, g, vecs, queries, 10); r < minRecall {
		t.Errorf("recall@10 after deletes and overwrites: %.3f; want at least %v", r, minRecall)
	}

	calls := 0
	var mu sync.Mutex
	stop := func() bool { mu.Lock(); defer mu.Unlock(); calls++; return calls > 100 }
	if g := Build(Config{Seed: 1}, keys, all, 2, stop); g != nil {
		t.Errorf("a stopped build returned a graph of %d keys", g.Len())
	}
}

// TestNoCompact: with NoCompact, Set and Delete leave tombstones for the
// caller, and NeedsCompaction says when to rebuild.
func TestNoCompact(t *testing.T) {
	data := vecsynth.New(3, 32, 4)
	g := New[string](Config{Seed: 3, NoCompact: true})
	for i := range 500 {
		g.Set(fmt.Sprint(i), data.Next())
	}
	if g.NeedsCompaction() {
		t.Fatal("a graph without tombstones needs compaction")
	}
	for i := range 500 {
		g.Set(fmt.Sprint(i), data.Next())
	}
	if g.Tombstones() != 500 || g.Len() != 500 {
		t.Fatalf("%d tombstones, %d live; want 500, 500", g.Tombstones(), g.Len())
	}
	g.Delete("0")
	if !g.NeedsCompaction() {
		t.Error("501 tombstones, 499 live: NeedsCompaction is false")
	}
}

// TestDeleted: a deleted key is never returned, even when the query is
// its own vector, and an overwritten key is found by its new vector only.
func TestDeleted(t *testing.T) {
	data := vecsynth.New(2, 64, 10)
	g := New[string](Config{Seed: 2})
	vecs := map[string][]float32{}
	for i := range 1000 {
		key := fmt.Sprintf("k%04d", i)
		vecs[key] = data.Next()
		g.Set(key, vecs[key])
	}
	for i := 0; i < 1000; i += 2 {
		key := fmt.Sprintf("k%04d", i)
		old := vecs[key]
		if i%4 == 0 {
			g.Delete(key)
			delete(vecs, key)
		} else {
			vecs[key] = data.Next()
			g.Set(key, vecs[key])
		}
		for _, r := range g.Search(old, 5, 0) {
			if r.Key == key && i%4 == 0 {
				t.Fatalf("deleted key %q returned", key)
			}
			if want := Dot(old, vecs[r.Key]); r.Score != want {
				t.Fatalf("key %q scored %v against the old vector; its current vector scores %v", r.Key, r.Score, want)
			}
		}
		if i%4 != 0 {
			if got := g.Search(vecs[key], 1, 0); len(got) != 1 || got[0].Key != key {
				t.Fatalf("overwritten key %q not found by its new vector: %v", key, got)
			}
		}
	}
	if g.Len() != 750 {
		t.Errorf("Len %d; want 750", g.Len())
	}
	// Delete everything: the graph empties.
	for key := range vecs {
		g.Delete(key)
	}
	if got := g.Search(data.Next(), 10, 0); len(got) != 0 || g.Len() != 0 || g.Tombstones() != 0 {
		t.Errorf("after deleting every key: results %v, Len %d, tombstones %d", got, g.Len(), g.Tombstones())
	}
}

// TestCompaction: tombstones never outnumber live nodes for long.
func TestCompaction(t *testing.T) {
	data := vecsynth.New(3, 32, 4)
	g := New[string](Config{Seed: 3})
	for i := range 500 {
		g.Set(fmt.Sprint(i), data.Next())
	}
	for round := range 10 {
		for i := range 500 {
			g.Set(fmt.Sprint(i), data.Next())
		}
		if g.Tombstones() > g.Len() {
			t.Fatalf("round %d: %d tombstones, %d live", round, g.Tombstones(), g.Len())
		}
	}
	if g.Len() != 500 {
		t.Errorf("Len %d; want 500", g.Len())
	}
}

// TestSmall: fewer keys than asked for returns them all, in order.
func TestSmall(t *testing.T) {
	g := New[string](Config{})
	if got := g.Search([]float32{1, 0}, 3, 0); got != nil {
		t.Errorf("empty graph: %v", got)
	}
	g.Set("a", []float32{1, 0})
	g.Set("b", []float32{0, 1})
	g.Set("c", embed.Normalize([]float32{1, 1}))
	got := g.Search([]float32{1, 0}, 10, 0)
	var keys []string
	for _, r := range got {
		keys = append(keys, r.Key)
	}
	if !slices.Equal(keys, []string{"a", "c", "b"}) {
		t.Errorf("got %v; want a, c, b", keys)
	}
}

// TestConcurrent: searches run while keys are set and deleted (run with
// -race).
func TestConcurrent(t *testing.T) {
	data := vecsynth.New(4, 32, 4)
	g := New[string](Config{Seed: 4})
	pre := data.Vectors(600)
	for i, v := range pre {
		g.Set(fmt.Sprint(i), v)
	}
	queries := data.Vectors(50)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for _, q := range queries {
				if got := g.Search(q, 10, 0); len(got) == 0 {
					t.Error("no results")
				}
			}
		})
	}
	wg.Go(func() {
		for i, v := range data.Vectors(300) {
			g.Set(fmt.Sprint(i), v)
			g.Delete(fmt.Sprint(i + 300))
		}
	})
	wg.Wait()
}

// BenchmarkBuild: inserting n clustered 768-dimension vectors (the time
// of a rebuild at open).
// Run: go test -run '^$' -bench BenchmarkBuild ./services/state/internal/hnsw/
func BenchmarkBuild(b *testing.B) {
	vecs := vecsynth.New(5, 768, 20).Vectors(2000)
	b.Run("set", func(b *testing.B) {
		for b.Loop() {
			g := New[int](Config{Seed: 5})
			for i, v := range vecs {
				g.Set(i, v)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(vecs)), "ns/insert")
	})
	keys := make([]int, len(vecs))
	for i := range keys {
		keys[i] = i
	}
	b.Run("build", func(b *testing.B) {
		for b.Loop() {
			Build(Config{Seed: 5}, keys, vecs, runtime.GOMAXPROCS(0), nil)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(vecs)), "ns/insert")
	})
}
