package state

import (
	"fmt"
	"testing"

	"github.com/secbear/neuron/internal/testenv"
)

// BenchmarkPostgresWrite measures Write throughput on the PostgreSQL
// backend with 1, 8 and 64 concurrent writers (one pool), beside
// BenchmarkBoltWrite. The test server runs with fsync off, so this
// measures round trips and locking, not disk.
func BenchmarkPostgresWrite(b *testing.B) {
	for _, writers := range []int{1, 8, 64} {
		b.Run(fmt.Sprint("writers=", writers), func(b *testing.B) {
			benchWrites(b, openPostgresDSN(b, testenv.Postgres(b)), writers)
		})
	}
}

// BenchmarkPostgresRead measures Read throughput on the PostgreSQL
// backend, beside BenchmarkBoltRead.
func BenchmarkPostgresRead(b *testing.B) {
	benchReads(b, openPostgresDSN(b, testenv.Postgres(b)))
}
