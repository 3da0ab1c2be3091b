// Package vecsynth makes seeded synthetic embeddings for the recall
// tests and benchmarks of the vector index.
//
// The vectors are clustered, with a low intrinsic dimension, as real
// text embeddings are: each cluster has a centre and a few directions of
// its own, and a vector is its cluster's centre plus a random mix of
// those directions plus a little noise, normalized. (Uniform or
// isotropic Gaussian noise in 768 dimensions puts every point nearly
// equally far from every other, which no embedding model produces, and
// makes "the 10 nearest" meaningless.)
package vecsynth

import (
	"math"
	"math/rand/v2"
)

// Set draws vectors from one seeded distribution.
type Set struct {
	dims    int
	rng     *rand.Rand
	centres [][]float32
	bases   [][][]float32
}

// Parameters of the distribution.
const (
	// directions is the intrinsic dimension of a cluster.
	directions = 16
	// spread scales the directions against the centre (norm 1).
	spread = 0.35
	// noise is the norm of the isotropic noise.
	noise = 0.1
)

// New returns a distribution of dims-dimension vectors in clusters
// clusters, seeded by seed.
func New(seed uint64, dims, clusters int) *Set {
	s := &Set{dims: dims, rng: rand.New(rand.NewPCG(seed, 0x73796e7468))}
	for range clusters {
		s.centres = append(s.centres, s.gauss(1))
		var basis [][]float32
		for range directions {
			basis = append(basis, s.gauss(spread))
		}
		s.bases = append(s.bases, basis)
	}
	return s
}

// gauss returns a random vector of about norm n.
func (s *Set) gauss(n float64) []float32 {
	v := make([]float32, s.dims)
	f := n / math.Sqrt(float64(s.dims))
	for i := range v {
		v[i] = float32(s.rng.NormFloat64() * f)
	}
	return v
}

// Next returns a new normalized vector of a random cluster.
func (s *Set) Next() []float32 {
	c := s.rng.IntN(len(s.centres))
	v := s.gauss(noise)
	for i, x := range s.centres[c] {
		v[i] += x
	}
	for _, b := range s.bases[c] {
		a := float32(s.rng.NormFloat64())
		for i, x := range b {
			v[i] += a * x
		}
	}
	var sum float64
	for _, x := range v {
		sum += float64(x) * float64(x)
	}
	inv := float32(1 / math.Sqrt(sum))
	for i := range v {
		v[i] *= inv
	}
	return v
}

// Vectors returns n vectors from Next.
func (s *Set) Vectors(n int) [][]float32 {
	out := make([][]float32, n)
	for i := range out {
		out[i] = s.Next()
	}
	return out
}
