package embed

import (
	"context"
	"fmt"
	"math"

	"github.com/secbear/neuron/pkg/errs"
)

// Purpose says what a text is embedded for; providers that distinguish
// the two (Gemini's task types) embed queries and documents differently.
type Purpose int

const (
	// Document is a stored value, to be found later.
	Document Purpose = iota
	// Query is a search query.
	Query
)

// Embedder turns texts into vectors.
type Embedder interface {
	// Embed returns one vector per text, in order, all of the same
	// dimensions. texts holds 1..MaxBatch non-empty strings.
	Embed(ctx context.Context, texts []string, p Purpose) ([][]float32, error)
	// Name names the provider and model, such as "openai:text-embedding-3-small",
	// for logs and errors.
	Name() string
}

// Limits of one Embed call.
const (
	// MaxBatch is the most texts of one call.
	MaxBatch = 96
	// MaxDimensions is the most dimensions of a vector (State's limit).
	MaxDimensions = 4096
)

// checkTexts validates the texts of an Embed call.
func checkTexts(texts []string) error {
	if len(texts) == 0 || len(texts) > MaxBatch {
		return fmt.Errorf("embed %d texts: a call embeds 1 to %d: %w", len(texts), MaxBatch, errs.InvalidArgument)
	}
	for i, t := range texts {
		if t == "" {
			return fmt.Errorf("text %d is empty; there is nothing to embed: %w", i, errs.InvalidArgument)
		}
	}
	return nil
}

// checkVectors checks that a provider answered n vectors of one size, at
// most MaxDimensions, with finite values.
func checkVectors(name string, vecs [][]float32, n int) error {
	if len(vecs) != n {
		return fmt.Errorf("%s answered %d embeddings for %d texts: %w", name, len(vecs), n, errs.Unavailable)
	}
	for i, v := range vecs {
		if len(v) == 0 || len(v) > MaxDimensions {
			return fmt.Errorf("%s answered an embedding of %d dimensions (1 to %d are usable): %w", name, len(v), MaxDimensions, errs.Unavailable)
		}
		if len(v) != len(vecs[0]) {
			return fmt.Errorf("%s answered embeddings of %d and %d dimensions in one call: %w", name, len(vecs[0]), len(v), errs.Unavailable)
		}
		for _, x := range v {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return fmt.Errorf("%s answered embedding %d with a value that is not finite: %w", name, i, errs.Unavailable)
			}
		}
	}
	return nil
}

// Normalize scales v to unit length in place and returns it; a zero
// vector is returned unchanged.
func Normalize(v []float32) []float32 {
	var sum float64
	for _, x := range v {
		sum += float64(x) * float64(x)
	}
	if sum == 0 {
		return v
	}
	inv := float32(1 / math.Sqrt(sum))
	for i := range v {
		v[i] *= inv
	}
	return v
}

// Dot returns the dot product of a and b, which have the same length: the
// cosine similarity when both are normalized.
func Dot(a, b []float32) float32 {
	var s0, s1, s2, s3 float32
	n := len(a)
	b = b[:n]
	i := 0
	for ; i+4 <= n; i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < n; i++ {
		s0 += a[i] * b[i]
	}
	return s0 + s1 + s2 + s3
}
