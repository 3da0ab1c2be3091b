package state

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/services/state/internal/vecsynth"
)

// The vector benchmarks build indexes of up to 100k x 768 dimensions
// (about a minute of CPU), so they run only when NEURON_BENCH_VECTORS is
// set, as scripts/bench-state.sh (make bench) sets it.
func needVectorBench(b *testing.B) {
	if os.Getenv("NEURON_BENCH_VECTORS") == "" {
		b.Skip("set NEURON_BENCH_VECTORS=1 (scripts/bench-state.sh does) to build 100k-vector indexes")
	}
}

const benchDims = 768

// annFixture is a vector index of n clustered vectors in one scope, with
// queries drawn from the same clusters.
type annFixture struct {
	x       *vectorIndex
	queries [][]float32
	build   time.Duration // wall
	cpu     time.Duration // process CPU (user and system) of the build
	bytes   float64       // heap the index adds per vector, beyond the vector
	recall  float64       // recall@10 against exact search
}

var (
	annFixturesMu sync.Mutex
	annFixtures   = map[int]*annFixture{}
)

// annFixtureOf builds (once per process) the fixture of n vectors.
func annFixtureOf(b *testing.B, n int) *annFixture {
	annFixturesMu.Lock()
	defer annFixturesMu.Unlock()
	if f := annFixtures[n]; f != nil {
		return f
	}
	data := vecsynth.New(11, benchDims, 100)
	vecs := data.Vectors(n)
	f := &annFixture{x: newVectorIndex(), queries: data.Vectors(200)}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start, cpu0 := time.Now(), processCPU()
	for i, v := range vecs {
		f.x.set("scope", fmt.Sprintf("k%07d", i), uint64(i+1), v)
	}
	f.x.settle() // the graph is built in the background
	f.build, f.cpu = time.Since(start), processCPU()-cpu0
	runtime.GC()
	runtime.ReadMemStats(&after)
	f.bytes = float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
	f.recall = annRecall(b, f.x, "scope", f.queries[:100], 10)
	annFixtures[n] = f
	return f
}

// processCPU is the process's CPU time so far (user and system).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportLatency reports the median and 99th percentile of ds in ms.
func reportLatency(b *testing.B, ds []time.Duration) {
	slices.Sort(ds)
	b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(ds[len(ds)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkVectorANN: one top-10 vector search in a scope of n clustered
// 768-dimension vectors, through the HNSW graph (hnsw) and exactly
// (exact); hnsw also reports recall@10 against exact search over 100
// queries, the time to build the index from nothing (as at open: wall
// and process CPU), and the heap the index adds per vector beyond the
// vector itself (4 bytes a dimension).
// Run: NEURON_BENCH_VECTORS=1 go test -run '^$' -bench BenchmarkVectorANN -benchtime 200x ./services/state/
func BenchmarkVectorANN(b *testing.B) {
	needVectorBench(b)
	for _, n := range []int{10_000, 100_000} {
		for _, mode := range []string{"hnsw", "exact"} {
			b.Run(fmt.Sprintf("n=%d/%s", n, mode), func(b *testing.B) {
				f := annFixtureOf(b, n)
				search := f.x.search
				if mode == "exact" {
					search = f.x.searchExact
				}
				var ds []time.Duration
				i := 0
				b.ResetTimer()
				for b.Loop() {
					q := f.queries[i%len(f.queries)]
					i++
					start := time.Now()
					hits, err := search(b.Context(), "scope", q, 10)
					ds = append(ds, time.Since(start))
					if err != nil || len(hits) != 10 {
						b.Fatal(len(hits), err)
					}
				}
				reportLatency(b, ds)
				if mode == "hnsw" {
					b.ReportMetric(f.recall, "recall@10")
					b.ReportMetric(f.build.Seconds(), "build-s")
					b.ReportMetric(f.cpu.Seconds(), "build-cpu-s")
					b.ReportMetric(f.bytes, "index-B/vector")
				}
			})
		}
	}
}

// BenchmarkHybridSearch: a top-10 Search of three words through the
// Server (its search, without gRPC) on bbolt holding 10k values of 20
// words with 768-dimension embeddings in one scope: keyword-only (bleve
// BM25), vector (HNSW) and hybrid (both, 50 candidates each, fused).
// Run: NEURON_BENCH_VECTORS=1 go test -run '^$' -bench BenchmarkHybridSearch -benchtime 200x ./services/state/
func BenchmarkHybridSearch(b *testing.B) {
	needVectorBench(b)
	const n = 10_000
	st, err := OpenBolt(filepath.Join(b.TempDir(), "state.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	sc := scope.Session("bench")
	data := vecsynth.New(12, benchDims, 100)
	vecs := data.Vectors(n)
	rng := rand.New(rand.NewPCG(12, 12))
	words := make([]string, 2000)
	for i := range words {
		words[i] = fmt.Sprintf("w%dx", i)
	}
	text := func(k int) string {
		var sb strings.Builder
		for range k {
			sb.WriteString(words[rng.IntN(len(words))] + " ")
		}
		return sb.String()
	}
	texts := make([]string, n)
	for i := range texts {
		texts[i] = text(20)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				if _, err := st.Write(ctx, sc, fmt.Sprintf("k%05d", i), str(texts[i]), Guard{Embedding: vecs[i]}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	st.index.vectors.settle() // the scope's graph is built in the background
	srv := NewServer(st)
	queries := make([]*statev1.SearchRequest, 200)
	for i := range queries {
		queries[i] = &statev1.SearchRequest{Scope: sc, Query: text(3), QueryEmbedding: data.Next()}
	}
	for _, mode := range []statev1.SearchMode{statev1.SearchMode_SEARCH_MODE_KEYWORD, statev1.SearchMode_SEARCH_MODE_VECTOR, statev1.SearchMode_SEARCH_MODE_HYBRID} {
		name := strings.ToLower(strings.TrimPrefix(mode.String(), "SEARCH_MODE_"))
		b.Run(fmt.Sprintf("n=%d/%s", n, name), func(b *testing.B) {
			var ds []time.Duration
			i := 0
			for b.Loop() {
				q := queries[i%len(queries)]
				i++
				q.Mode = mode
				start := time.Now()
				hits, err := srv.search(b.Context(), q, 10)
				ds = append(ds, time.Since(start))
				if err != nil || len(hits) == 0 {
					b.Fatal(len(hits), err)
				}
			}
			reportLatency(b, ds)
		})
	}
}
