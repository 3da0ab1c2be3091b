package state

import (
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/secbear/neuron/pkg/scope"
)

// BenchmarkBoltWrite measures in-process Write throughput with 1 and 64
// concurrent writers; tx/op shows how many writes share a transaction.
func BenchmarkBoltWrite(b *testing.B) {
	for _, writers := range []int{1, 8, 64} {
		b.Run(fmt.Sprint("writers=", writers), func(b *testing.B) {
			st, err := OpenBolt(filepath.Join(b.TempDir(), "state.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			benchWrites(b, st, writers)
			b.ReportMetric(float64(st.group.transactions.Load())/float64(b.N), "tx/op")
		})
	}
}

// BenchmarkBoltRead measures in-process Read throughput.
func BenchmarkBoltRead(b *testing.B) {
	st, err := OpenBolt(filepath.Join(b.TempDir(), "state.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	benchReads(b, st)
}

// benchWrites makes b.N Writes to st from writers goroutines, over 1000
// keys of one scope.
func benchWrites(b *testing.B, st Backend, writers int) {
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
}

// benchReads fills st with 1000 keys, then makes b.N parallel Reads.
func benchReads(b *testing.B, st Backend) {
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
