package orchestrator

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/content"
)

// BenchmarkJournalStep is the journal's cost per workflow step alone: the
// two commits of a step (BeginStep, the intent, then FinishStep, the
// result), each fsynced, as run.go's step makes them around an operator
// call. At c=64, 64 workflows step at once and the group commit (commit.go)
// shares transactions between them.
//
// Metrics: us/step is wall time per step (1e6 / steps/s); p50-us and
// p99-us the latency of one step's two commits; commits/step the bbolt
// write transactions per step (2 without grouping); fsync-us the median
// of a 4 KiB overwrite plus fsync of a file in the same directory,
// measured before the run: the floor of a commit, which bbolt fsyncs
// twice (pages, then meta). Part of scripts/bench-orchestrator.sh.
func BenchmarkJournalStep(b *testing.B) {
	in, err := proto.Marshal(&operatorv1.OperatorInput{
		Message: content.Text("ping"),
		Dispatch: &operatorv1.DispatchContext{DispatchId: "wf-0123456789ab-00112233445566778899#1", WorkflowId: "wf-0123456789ab-00112233445566778899",
			AgentId: "echo", CorrelationId: "wf-0123456789ab-00112233445566778899"},
	})
	if err != nil {
		b.Fatal(err)
	}
	out, err := proto.Marshal(&operatorv1.OperatorOutput{
		Message:    content.Text("ping"),
		ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_COMPLETE},
	})
	if err != nil {
		b.Fatal(err)
	}
	fsync := fsyncFloor(b)
	for _, conc := range []int{1, 64} {
		b.Run(fmt.Sprintf("c=%d", conc), func(b *testing.B) {
			j, err := OpenJournal(filepath.Join(b.TempDir(), "journal.db"), time.Second)
			if err != nil {
				b.Fatal(err)
			}
			defer j.Close()
			ids := make([]string, conc)
			for w := range ids {
				ids[w] = newWorkflowID()
				now := time.Now()
				if _, _, err := j.Create(&record{ID: ids[w], Status: orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING,
					RootAgent: "echo", CurrentAgent: "echo", Created: now, Updated: now, Input: in}); err != nil {
					b.Fatal(err)
				}
			}
			next := make([]uint64, conc) // the last step of each workflow
			step := func(w int) error {
				next[w]++
				n := next[w]
				st, _, err := j.BeginStep(ids[w], n, func(*record, []*signalRecord) (*stepRecord, error) {
					return &stepRecord{Agent: "echo", Input: in, Started: time.Now()}, nil
				})
				if err != nil {
					return err
				}
				st.Output = out
				return j.FinishStep(ids[w], n, st, func(r *record) {
					r.Steps++
					r.LastOutput = st.Output
				})
			}
			tx0 := lastTx(b, j)
			elapsed, lat := measureSteps(b, conc, step)
			commits := lastTx(b, j) - tx0
			b.ReportMetric(micros(elapsed)/float64(b.N), "us/step")
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "steps/s")
			b.ReportMetric(micros(percentile(lat, 0.50)), "p50-us")
			b.ReportMetric(micros(percentile(lat, 0.99)), "p99-us")
			b.ReportMetric(float64(commits)/float64(b.N), "commits/step")
			b.ReportMetric(micros(fsync), "fsync-us")
		})
	}
}

// measureSteps runs step b.N times split over conc goroutines (goroutine
// w steps workflow w) and returns the wall time and the sorted latencies.
func measureSteps(b *testing.B, conc int, step func(w int) error) (time.Duration, []time.Duration) {
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
			for i := range lat[w] {
				t0 := time.Now()
				err := step(w)
				lat[w][i] = time.Since(t0)
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
	t0 := time.Now()
	close(start)
	wg.Wait()
	elapsed := time.Since(t0)
	b.StopTimer()
	if first != nil {
		b.Fatal(first)
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	return elapsed, all
}

// lastTx is the id of the journal's last committed write transaction.
func lastTx(b *testing.B, j *Journal) int {
	var id int
	if err := j.db.View(func(tx *bolt.Tx) error { id = tx.ID(); return nil }); err != nil {
		b.Fatal(err)
	}
	return id
}

// fsyncFloor is the median time of overwriting 4 KiB of a file in the
// temp directory and fsyncing it.
func fsyncFloor(b *testing.B) time.Duration {
	f, err := os.Create(filepath.Join(b.TempDir(), "fsync"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	page := make([]byte, 4096)
	times := make([]time.Duration, 21)
	for i := range times {
		t0 := time.Now()
		if _, err := f.WriteAt(page, 0); err != nil {
			b.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
		times[i] = time.Since(t0)
	}
	slices.Sort(times)
	return times[len(times)/2]
}

// percentile of sorted latencies, nearest rank.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
