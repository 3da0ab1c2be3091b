package journal

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/internal/benchkit"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/services/orchestrator"
)

// trivial is the journal content of one trivial workflow (one operator
// call, no effects) as the engine writes it, read once per process.
var trivial struct {
	once sync.Once
	kvs  [][2][]byte
	err  error
}

func trivialWorkflow(b *testing.B) [][2][]byte {
	trivial.once.Do(func() {
		dir, err := os.MkdirTemp("", "trivial")
		if err != nil {
			trivial.err = err
			return
		}
		defer os.RemoveAll(dir)
		j, err := Open(filepath.Join(dir, "journal.db"), time.Second)
		if err != nil {
			trivial.err = err
			return
		}
		defer j.Close()
		e := newEngine(b, j, newFakeCaller())
		defer e.Close()
		id := orchestrator.NewWorkflowID()
		ctx := context.Background()
		in := &operatorv1.OperatorInput{Message: content.Text("ping"), Dispatch: &operatorv1.DispatchContext{CorrelationId: id}}
		if _, _, err := e.Start(ctx, &orchestrator.StartRequest{WorkflowID: id, AgentID: "echo", Input: in}); err != nil {
			trivial.err = err
			return
		}
		if _, err := e.Wait(ctx, id); err != nil {
			trivial.err = err
			return
		}
		trivial.err = j.db.View(func(tx *bolt.Tx) error {
			return wfBucket(tx, id).ForEach(func(k, v []byte) error {
				trivial.kvs = append(trivial.kvs, [2][]byte{bytes.Clone(k), bytes.Clone(v)})
				return nil
			})
		})
	})
	if trivial.err != nil {
		b.Fatal(trivial.err)
	}
	return trivial.kvs
}

// addTrivial writes n copies of the trivial workflow, finished at
// end(i), 1000 per transaction.
func addTrivial(b *testing.B, j *Journal, n int, end func(i int) time.Time) {
	kvs := trivialWorkflow(b)
	for from := 0; from < n; from += 1000 {
		err := j.db.Update(func(tx *bolt.Tx) error {
			for i := from; i < min(from+1000, n); i++ {
				id := orchestrator.NewWorkflowID()
				bk, err := tx.Bucket(bucketWorkflows).CreateBucket([]byte(id))
				if err != nil {
					return err
				}
				var r record
				for _, kv := range kvs {
					if string(kv[0]) == string(keyRecord) {
						if err := json.Unmarshal(kv[1], &r); err != nil {
							return err
						}
						continue
					}
					if err := bk.Put(kv[0], kv[1]); err != nil {
						return err
					}
				}
				r.ID, r.Updated = id, end(i)
				r.Created = r.Updated.Add(-2 * time.Millisecond)
				if err := writeRecord(tx, bk, &r); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// build40k writes a journal of 40000 finished trivial workflows (the
// issue's 40k dispatches), plus one RUNNING and one SUSPENDED workflow,
// in b's temporary directory: a few seconds, not timed.
func build40k(b *testing.B) string {
	path := filepath.Join(b.TempDir(), "journal40k.db")
	j := openT(b, path)
	addUnfinished(b, j, "running", "slow", running, time.Now())
	addUnfinished(b, j, "suspended", "ask", suspended, time.Now())
	addTrivial(b, j, 40_000, func(int) time.Time { return time.Now() })
	j.Close()
	return path
}

// BenchmarkOpenResume is what a start of the orchestrator does with its
// journal: Open (the file's check and bbolt's walk of the pages in use),
// New, Resume (read the unfinished workflows and run the RUNNING one),
// then Close. The journal holds 40000 finished trivial workflows, one
// RUNNING and one SUSPENDED; "pruned-to=N" first prunes all but N of the
// finished ones. The file does not shrink (file-MiB); what a start reads
// does.
func BenchmarkOpenResume(b *testing.B) {
	fixture := build40k(b)
	for _, keep := range []int{-1, 1000, 0} {
		name := "finished=40000"
		if keep >= 0 {
			name = fmt.Sprintf("pruned-to=%d", keep)
		}
		b.Run(name, func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "journal.db")
			copyFile(b, fixture, path)
			if keep >= 0 {
				j := openT(b, path)
				r := Retention{MaxWorkflows: keep}
				if keep == 0 {
					r = Retention{MaxAge: MinRetention}
				}
				later := func() time.Time { return time.Now().Add(time.Hour) }
				if _, err := j.prune(context.Background(), r, later); err != nil {
					b.Fatal(err)
				}
				j.Close()
			}
			st, err := os.Stat(path)
			if err != nil {
				b.Fatal(err)
			}
			caller := newFakeCaller()
			go func() {
				for range caller.started {
				}
			}()
			defer close(caller.started)
			b.ReportAllocs()
			for b.Loop() {
				j, err := Open(path, time.Second)
				if err != nil {
					b.Fatal(err)
				}
				e := newEngine(b, j, caller)
				if n, err := e.Resume(); err != nil || n != 1 {
					b.Fatalf("Resume = %d, %v; want the RUNNING workflow", n, err)
				}
				e.Close()
				j.Close()
			}
			b.ReportMetric(float64(st.Size())/(1<<20), "file-MiB")
		})
	}
}

// BenchmarkJournalStepWhilePruning is BenchmarkJournalStep (c=1: one
// workflow stepping; c=64: 64 sharing commits) with and without Prune
// deleting a backlog of 40000 finished trivial workflows at the same
// time: what pruning adds to the latency of the workflows that run.
// p50-us and p99-us are one step's two commits; deleted/s is Prune's
// pace meanwhile.
func BenchmarkJournalStepWhilePruning(b *testing.B) {
	fixture := build40k(b)
	for _, tc := range []struct {
		conc    int
		pruning bool
	}{{1, false}, {1, true}, {64, false}, {64, true}} {
		conc, pruning := tc.conc, tc.pruning
		b.Run(fmt.Sprintf("c=%d/pruning=%v", conc, pruning), func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "journal.db")
			copyFile(b, fixture, path)
			j := openT(b, path)
			defer j.Close()
			ids := make([]string, conc)
			for w := range ids {
				ids[w] = orchestrator.NewWorkflowID()
				now := time.Now()
				if _, _, err := j.Create(&record{ID: ids[w], Status: running, RootAgent: "echo", CurrentAgent: "echo", Created: now, Updated: now, Input: []byte("in")}); err != nil {
					b.Fatal(err)
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			var (
				wg      sync.WaitGroup
				deleted int
			)
			if pruning {
				wg.Add(1)
				go func() {
					defer wg.Done()
					later := func() time.Time { return time.Now().Add(time.Hour) }
					deleted, _ = j.prune(ctx, Retention{MaxAge: MinRetention}, later)
				}()
			}
			next := make([]uint64, conc)
			r := benchkit.Concurrent(b, conc, func(w, _ int) error {
				next[w]++
				n := next[w]
				st, _, err := j.BeginStep(ids[w], n, func(*wtx, []*signalRecord) (*stepRecord, error) {
					return &stepRecord{Agent: "echo", Input: []byte("in"), Started: time.Now()}, nil
				})
				if err != nil {
					return err
				}
				st.Output = []byte("out")
				return j.FinishStep(ids[w], n, st, func(r *record) { r.Steps++ })
			})
			cancel()
			wg.Wait()
			r.Report(b, "steps/s")
			if pruning {
				b.ReportMetric(float64(deleted)/r.Elapsed.Seconds(), "deleted/s")
			}
		})
	}
}
