// Package benchkit is the timing loop the services' benchmarks share:
// b.N calls split over a fixed number of goroutines, each call timed into
// a slice allocated before the timer starts, with throughput, latency
// percentiles and the process's CPU time; and StartMockModel, which runs
// the OpenAI-compatible mock model server (the mockmodel command in this
// directory) in a process of its own. It is imported only by _test
// files.
package benchkit

import (
	"cmp"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Result is one concurrent run.
type Result struct {
	// Elapsed is the wall time of all calls.
	Elapsed time.Duration
	// CPU is the process's user and system CPU time over the run.
	CPU time.Duration
	// Latencies of every call, sorted.
	Latencies []time.Duration
}

// Concurrent runs op b.N times split over conc goroutines: goroutine w
// makes its i-th call as op(w, i). The first error fails the benchmark.
func Concurrent(b *testing.B, conc int, op func(w, i int) error) Result {
	lat := make([][]time.Duration, conc)
	for w := range conc {
		n := b.N / conc
		if w < b.N%conc {
			n++
		}
		lat[w] = make([]time.Duration, n)
	}
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		errMu sync.Mutex
		first error
	)
	for w := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			mine := lat[w]
			for i := range mine {
				t0 := time.Now()
				err := op(w, i)
				mine[i] = time.Since(t0)
				if err != nil {
					errMu.Lock()
					first = cmp.Or(first, err)
					errMu.Unlock()
					return
				}
			}
		}()
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := CPUTime(b)
	t0 := time.Now()
	close(start)
	wg.Wait()
	r := Result{Elapsed: time.Since(t0), CPU: CPUTime(b) - cpu0}
	b.StopTimer()
	if first != nil {
		b.Fatal(first)
	}
	r.Latencies = slices.Concat(lat...)
	slices.Sort(r.Latencies)
	return r
}

// Percentile of the latencies, nearest rank.
func (r Result) Percentile(p float64) time.Duration {
	if len(r.Latencies) == 0 {
		return 0
	}
	i := int(p*float64(len(r.Latencies))+0.5) - 1
	return r.Latencies[min(max(i, 0), len(r.Latencies)-1)]
}

// Report reports throughput (calls per second, as unit) and the 50th and
// 99th percentile latency in microseconds.
func (r Result) Report(b *testing.B, unit string) {
	b.ReportMetric(float64(len(r.Latencies))/r.Elapsed.Seconds(), unit)
	b.ReportMetric(Micros(r.Percentile(0.50)), "p50-us")
	b.ReportMetric(Micros(r.Percentile(0.99)), "p99-us")
}

// Micros is d in microseconds.
func Micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// CPUTime is the user and system CPU time of this process.
func CPUTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
