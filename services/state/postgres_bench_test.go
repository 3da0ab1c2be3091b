package state

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/pkg/testenv"
)

// BenchmarkPostgresWrite measures Write throughput on the PostgreSQL
// backend with 1, 8 and 64 concurrent writers (one pool), beside
// BenchmarkBoltWrite. The test server runs with fsync off, so this
// measures round trips and locking, not disk.
func BenchmarkPostgresWrite(b *testing.B) {
	for _, writers := range []int{1, 8, 64} {
		b.Run(fmt.Sprint("writers=", writers), func(b *testing.B) {
			st := openPostgresDSN(b, testenv.Postgres(b))
			s := scope.Session("bench")
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
						if _, err := st.Write(ctx, s, fmt.Sprint("k", i%1000), str(fmt.Sprintf("value number %d for the benchmark", i)), Guard{}); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
		})
	}
}

// BenchmarkPostgresRead measures Read throughput on the PostgreSQL
// backend, beside BenchmarkBoltRead.
func BenchmarkPostgresRead(b *testing.B) {
	st := openPostgresDSN(b, testenv.Postgres(b))
	s := scope.Session("bench")
	for i := range 1000 {
		if _, err := st.Write(ctx, s, fmt.Sprint("k", i), str("v"), Guard{}); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			if _, err := st.Read(ctx, s, fmt.Sprint("k", i%1000)); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
