//go:build !linux

package startbench

import "testing"

// BenchmarkStartup needs Linux: it reads /proc/<pid>/status.
func BenchmarkStartup(b *testing.B) {
	b.Skip("startbench reads /proc/<pid>/status: Linux only")
}
