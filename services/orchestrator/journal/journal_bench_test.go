package journal

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/internal/benchkit"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/services/orchestrator"
)

// BenchmarkJournalStep is the journal's cost per workflow step alone: the
// two commits of a step (BeginStep, the intent, then FinishStep, the
// result), each fsynced, as the host's Call makes them around an operator
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
			j, err := Open(filepath.Join(b.TempDir(), "journal.db"), time.Second)
			if err != nil {
				b.Fatal(err)
			}
			defer j.Close()
			ids := make([]string, conc)
			for w := range ids {
				ids[w] = orchestrator.NewWorkflowID()
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
				st, _, err := j.BeginStep(ids[w], n, func(*bolt.Bucket, *record, []*signalRecord) (*stepRecord, error) {
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
			r := benchkit.Concurrent(b, conc, func(w, _ int) error { return step(w) })
			commits := lastTx(b, j) - tx0
			b.ReportMetric(benchkit.Micros(r.Elapsed)/float64(b.N), "us/step")
			r.Report(b, "steps/s")
			b.ReportMetric(float64(commits)/float64(b.N), "commits/step")
			b.ReportMetric(benchkit.Micros(fsync), "fsync-us")
		})
	}
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
