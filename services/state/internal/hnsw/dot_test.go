package hnsw

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/secbear/neuron/pkg/embed"
)

// TestDot: the fast dot product agrees with embed.Dot at every length
// (the 16-float steps and the tail), up to float32 rounding.
func TestDot(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	for n := range 70 {
		a, b := make([]float32, n), make([]float32, n+3)
		for i := range a {
			a[i] = float32(rng.NormFloat64())
		}
		for i := range b {
			b[i] = float32(rng.NormFloat64())
		}
		got, want := Dot(a, b), embed.Dot(a, b)
		if math.Abs(float64(got-want)) > 1e-4*float64(max(1, n)) {
			t.Errorf("n=%d: Dot %v, embed.Dot %v", n, got, want)
		}
	}
}

func BenchmarkDot(b *testing.B) {
	x, y := make([]float32, 768), make([]float32, 768)
	for i := range x {
		x[i], y[i] = float32(i%7), float32(i%5)
	}
	b.Run("fast", func(b *testing.B) {
		for b.Loop() {
			Dot(x, y)
		}
	})
	b.Run("embed", func(b *testing.B) {
		for b.Loop() {
			embed.Dot(x, y)
		}
	})
}
