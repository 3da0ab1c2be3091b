package hnsw

import "github.com/secbear/neuron/pkg/embed"

// dot is the dot product of a and b (len(b) >= len(a)). On amd64 with
// AVX2 and FMA it runs 8 lanes at a time (dot_amd64.s); elsewhere it is
// embed.Dot. The two may differ in the last bits of a float32.
var dot = embed.Dot

// Dot is the dot product of a and b (len(b) >= len(a)), as the graph
// computes it.
func Dot(a, b []float32) float32 { return dot(a, b) }
