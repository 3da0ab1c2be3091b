package hnsw

import "golang.org/x/sys/cpu"

// dotFMA is dot with AVX2 and FMA: 16 floats a step, then one at a time.
//
//go:noescape
func dotFMA(a, b []float32) float32

func init() {
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA {
		dot = func(a, b []float32) float32 { return dotFMA(a, b[:len(a)]) }
	}
}
