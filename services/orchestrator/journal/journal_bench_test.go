package journal

import (
	"context"
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
				st, _, err := j.BeginStep(ids[w], n, func(*wtx, []*signalRecord) (*stepRecord, error) {
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

// BenchmarkJournalDispatch is the journal engine's cost per dispatch
// alone: Start and Wait of a one-step workflow, as Server.Dispatch makes
// them for a Dispatch that names no workflow (Unnamed), on an operator
// that answers at once in process (no gRPC). At c=64, 64 dispatches run
// at once and share commits.
//
// Metrics: us/dispatch is wall time per dispatch; cpu-us/op the
// process's CPU time per dispatch; commits/dispatch the
// bbolt write transactions per dispatch (1 without grouping: the
// workflow's creation, its step's intent and result and its end, held
// back over the operator call; 2 for a Dispatch naming its workflow),
// each fsynced twice by bbolt; fsync-us as in BenchmarkJournalStep.
// Part of scripts/bench-orchestrator.sh.
func BenchmarkJournalDispatch(b *testing.B) {
	fsync := fsyncFloor(b)
	in := &operatorv1.OperatorInput{Message: content.Text("ping")}
	for _, conc := range []int{1, 64} {
		b.Run(fmt.Sprintf("c=%d", conc), func(b *testing.B) {
			j, err := Open(filepath.Join(b.TempDir(), "journal.db"), time.Second)
			if err != nil {
				b.Fatal(err)
			}
			defer j.Close()
			e := newEngine(b, j, echoCaller{})
			defer e.Close()
			ctx := context.Background()
			dispatch := func() error {
				id, _, err := e.Start(ctx, &orchestrator.StartRequest{WorkflowID: orchestrator.NewWorkflowID(), AgentID: "echo", Input: in, Unnamed: true})
				if err != nil {
					return err
				}
				wf, err := e.Wait(ctx, id)
				if err != nil {
					return err
				}
				if wf.Status != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED {
					return fmt.Errorf("workflow %s ended %s", id, wf.Status)
				}
				return nil
			}
			tx0 := lastTx(b, j)
			r := benchkit.Concurrent(b, conc, func(int, int) error { return dispatch() })
			commits := lastTx(b, j) - tx0
			b.ReportMetric(benchkit.Micros(r.Elapsed)/float64(b.N), "us/dispatch")
			r.Report(b, "dispatches/s")
			b.ReportMetric(float64(commits)/float64(b.N), "commits/dispatch")
			b.ReportMetric(benchkit.Micros(r.CPU)/float64(b.N), "cpu-us/op")
			b.ReportMetric(benchkit.Micros(fsync), "fsync-us")
		})
	}
}

// echoCaller answers every operator call at once: the input's message
// back, EXIT_KIND_COMPLETE, no cost, no effects.
type echoCaller struct{}

func (echoCaller) Call(_ context.Context, _ *orchestrator.Agent, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
	return &operatorv1.OperatorOutput{Message: in.GetMessage(), ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_COMPLETE}}, nil
}

// lastTx is the id of the journal's last committed write transaction.
func lastTx(b testing.TB, j *Journal) int {
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
