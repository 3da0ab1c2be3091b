package state

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkVectorSearch: one exact vector search of the top 10 in a scope
// of n random 768-dimension embeddings (issue 25's sizes; the index is
// exact, so its recall@10 against exact search is 1 by construction).
// Run: go test -run '^$' -bench BenchmarkVectorSearch ./services/state/
func BenchmarkVectorSearch(b *testing.B) {
	const dims = 768
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("n=%d/d=%d", n, dims), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 2))
			random := func() []float32 {
				v := make([]float32, dims)
				for i := range v {
					v[i] = float32(rng.NormFloat64())
				}
				out, _ := checkVector(v, "v")
				return out
			}
			x := newVectorIndex()
			for i := range n {
				x.set("scope", fmt.Sprintf("k%07d", i), uint64(i+1), random())
			}
			q := random()
			b.ResetTimer()
			for b.Loop() {
				hits, err := x.search(b.Context(), "scope", q, 10)
				if err != nil || len(hits) != 10 {
					b.Fatal(len(hits), err)
				}
			}
		})
	}
}
