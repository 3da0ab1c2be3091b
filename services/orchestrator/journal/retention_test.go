package journal

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	bolt "go.etcd.io/bbolt"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/money"
	"github.com/secbear/neuron/services/orchestrator"
)

var (
	running          = orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING
	suspended        = orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED
	completed        = orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED
	finishedStatuses = []orchestratorv1.WorkflowStatus{completed,
		orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED}
)

func openT(t testing.TB, path string) *Journal {
	t.Helper()
	j, err := Open(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// addFinished writes n finished workflows through the journal's own
// writes, 1000 per transaction (faster than their runs would): the i-th
// is prefix-i, ends at end(i) in the i-th of COMPLETED, FAILED, CANCELED,
// and owns what a run leaves: a step, an effect, a signal and its key, a
// registry lookup, events.
func addFinished(t testing.TB, j *Journal, prefix string, n int, end func(i int) time.Time) []string {
	t.Helper()
	ids := make([]string, n)
	for from := 0; from < n; from += 1000 {
		err := j.db.Update(func(tx *bolt.Tx) error {
			for i := from; i < min(from+1000, n); i++ {
				ids[i] = fmt.Sprintf("%s-%05d", prefix, i)
				if err := putFinished(tx, ids[i], finishedStatuses[i%3], end(i)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

func putFinished(tx *bolt.Tx, id string, status orchestratorv1.WorkflowStatus, end time.Time) error {
	b, err := tx.Bucket(bucketWorkflows).CreateBucket([]byte(id))
	if err != nil {
		return err
	}
	r := &record{ID: id, Status: status, RootAgent: "echo", CurrentAgent: "echo", Steps: 1, Created: end.Add(-time.Second), Updated: end,
		Input: []byte("input"), SignalSeq: 1}
	if err := putJSON(b, stepKey(1), &stepRecord{Agent: "echo", Input: []byte("in"), Output: []byte("out"), Signals: []uint64{1}}); err != nil {
		return err
	}
	if err := putJSON(b, []byte("e"+id+"#1/effect/0"), &effectRecord{Applied: true, Step: 1}); err != nil {
		return err
	}
	if err := putJSON(b, append([]byte{prefixSignal}, u64(1)...), &signalRecord{Seq: 1, Key: "k", Step: 1}); err != nil {
		return err
	}
	if err := b.Put([]byte("kk"), u64(1)); err != nil {
		return err
	}
	if err := putJSON(b, []byte("lecho"), &lookupRecord{Attempts: 3}); err != nil {
		return err
	}
	if err := appendEvents(b, &lifecyclev1.LifecycleEvent{WorkflowId: id}, &lifecyclev1.LifecycleEvent{WorkflowId: id}); err != nil {
		return err
	}
	return writeRecord(tx, b, r)
}

// addUnfinished writes a workflow in status (RUNNING or SUSPENDED) that
// started at created and has not called its agent yet: a run of it
// starts from its input.
func addUnfinished(t testing.TB, j *Journal, id, agent string, status orchestratorv1.WorkflowStatus, created time.Time) {
	t.Helper()
	in, err := proto.Marshal(&operatorv1.OperatorInput{Message: content.Text("go")})
	if err != nil {
		t.Fatal(err)
	}
	r := &record{ID: id, Status: status, RootAgent: agent, CurrentAgent: agent, Created: created, Updated: created, Input: in, Detached: true}
	if _, _, err := j.Create(r); err != nil {
		t.Fatal(err)
	}
}

// contents counts what the journal holds: workflows' buckets, entries of
// each index, and meta/finished.
func contents(t testing.TB, j *Journal) map[string]int {
	t.Helper()
	out := map[string]int{}
	err := j.db.View(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucketIndex, bucketLive, bucketEnded} {
			out[string(name)] = tx.Bucket(name).Stats().KeyN
		}
		_ = tx.Bucket(bucketWorkflows).ForEachBucket(func([]byte) error { out["workflows"]++; return nil })
		out["meta/finished"] = int(getU64(tx.Bucket(bucketMeta), keyFinished))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// listed is every workflow List returns in status, page by page.
func listed(t testing.TB, j *Journal, status orchestratorv1.WorkflowStatus) []string {
	t.Helper()
	var ids []string
	token := ""
	for {
		recs, next, err := j.List(status, 500, token)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			ids = append(ids, r.ID)
		}
		if next == "" {
			slices.Sort(ids)
			return ids
		}
		token = next
	}
}

// Finished workflows are deleted by age, by count, or both, oldest end
// first, with everything they own; workflows that ended less than
// MinRetention ago are kept beyond the count; a RUNNING and a SUSPENDED
// workflow older than every cut-off are kept. A deleted workflow is
// NOT_FOUND and no longer listed.
func TestPrune(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	const old, young = 2000, 3
	// old-i ended i+2 minutes before now; young-i 10 s before now.
	type want struct{ old, young int } // how many of each are kept: the latest-ended
	fixture := filepath.Join(t.TempDir(), "fixture.db")
	j := openT(t, fixture)
	ancient := now.Add(-10_000 * time.Hour)
	addUnfinished(t, j, "running", "echo", running, ancient)
	addUnfinished(t, j, "suspended", "echo", suspended, ancient)
	olds := addFinished(t, j, "old", old, func(i int) time.Time { return now.Add(-time.Duration(i+2) * time.Minute) })
	youngs := addFinished(t, j, "young", young, func(int) time.Time { return now.Add(-10 * time.Second) })
	j.Close()
	for _, tc := range []struct {
		name string
		r    Retention
		want want
	}{
		{"no bound", Retention{}, want{old, young}},
		{"age", Retention{MaxAge: 1000 * time.Minute}, want{998, young}},
		{"count", Retention{MaxWorkflows: 500}, want{497, young}},
		{"age binds before count", Retention{MaxAge: 1000 * time.Minute, MaxWorkflows: 2000}, want{998, young}},
		{"count binds before age", Retention{MaxAge: 1000 * time.Minute, MaxWorkflows: 100}, want{97, young}},
		{"count keeps what just ended", Retention{MaxWorkflows: 1}, want{0, young}},
		{"age below MinRetention keeps what just ended", Retention{MaxAge: time.Second}, want{0, young}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "journal.db")
			copyFile(t, fixture, path)
			j := openT(t, path)
			defer j.Close()

			n, err := j.prune(context.Background(), tc.r, func() time.Time { return now })
			if err != nil {
				t.Fatal(err)
			}
			kept := append(slices.Clone(olds[:tc.want.old]), youngs[:tc.want.young]...)
			if want := old + young - len(kept); n != want {
				t.Errorf("Prune deleted %d workflows; want %d", n, want)
			}
			// At the cut and both ends (List and the counts below cover
			// the rest).
			for _, i := range []int{0, tc.want.old - 1, tc.want.old, old - 1} {
				if i < 0 || i >= old {
					continue
				}
				_, err := j.Get(olds[i])
				if i < tc.want.old && err != nil {
					t.Fatalf("Get(%s), which ended %d minutes ago, should be kept: %v", olds[i], i+2, err)
				}
				if i >= tc.want.old && errs.Code(err) != codes.NotFound {
					t.Fatalf("Get(%s), which ended %d minutes ago, = %v; want NOT_FOUND", olds[i], i+2, err)
				}
			}
			for _, id := range []string{"running", "suspended"} {
				if _, err := j.Get(id); err != nil {
					t.Fatalf("the %s workflow, started 10000 h ago, was deleted: %v", id, err)
				}
			}
			all := append(slices.Clone(kept), "running", "suspended")
			slices.Sort(all)
			if got := listed(t, j, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_UNSPECIFIED); !slices.Equal(got, all) {
				t.Errorf("List lists %d workflows; want the %d kept", len(got), len(all))
			}
			var done []string // addFinished's i-th is COMPLETED when i%3 == 0
			for i := 0; i < tc.want.old; i += 3 {
				done = append(done, olds[i])
			}
			for i := 0; i < tc.want.young; i += 3 {
				done = append(done, youngs[i])
			}
			slices.Sort(done)
			if got := listed(t, j, completed); !slices.Equal(got, done) {
				t.Errorf("List(COMPLETED) lists %d workflows; want the %d kept", len(got), len(done))
			}
			// Nothing of a deleted workflow is left: its bucket and its
			// entries in every index are gone, and the count follows.
			want := map[string]int{"workflows": len(kept) + 2, "index": len(kept) + 2, "live": 2, "ended": len(kept), "meta/finished": len(kept)}
			if got := contents(t, j); !maps.Equal(got, want) {
				t.Errorf("the journal holds %v; want %v", got, want)
			}
			if recs, err := j.Unfinished(); err != nil || len(recs) != 1 || recs[0].ID != "running" {
				t.Errorf("Unfinished after pruning = %v, %v; want the RUNNING workflow", ids(recs), err)
			}
		})
	}
}

func copyFile(t testing.TB, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}

func ids(recs []*record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r.ID)
	}
	return out
}

// fakeCaller answers operator calls: "slow" waits for release (or its
// context), "ask" suspends unless a signal triggered the call, anything
// else completes at once.
type fakeCaller struct {
	started chan string // workflow ids whose "slow" call began
	release chan struct{}
	mu      sync.Mutex
	calls   map[string]int // by workflow id
}

func newFakeCaller() *fakeCaller {
	return &fakeCaller{started: make(chan string, 16), release: make(chan struct{}), calls: map[string]int{}}
}

func (f *fakeCaller) Call(ctx context.Context, a *orchestrator.Agent, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
	f.mu.Lock()
	f.calls[in.GetDispatch().GetWorkflowId()]++
	f.mu.Unlock()
	out := &operatorv1.OperatorOutput{Message: content.Text("done"), ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_COMPLETE},
		Metadata: &operatorv1.OperatorMetadata{Cost: money.FromDecimal(decimal.Zero)}}
	switch a.ID {
	case "slow":
		f.started <- in.GetDispatch().GetWorkflowId()
		select {
		case <-f.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	case "ask":
		if in.GetTrigger() != operatorv1.TriggerType_TRIGGER_TYPE_SIGNAL {
			out.ExitReason = &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_SUSPENDED,
				Suspension: &operatorv1.Suspension{ResumeToken: "tok", Prompt: "approve?"}}
		}
	}
	return out, nil
}

func (f *fakeCaller) callsOf(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[id]
}

func newEngine(t testing.TB, j *Journal, c orchestrator.Caller) *Engine {
	t.Helper()
	reg, err := orchestrator.ParseRegistry([]byte("agents:\n  - {id: slow, operator: 127.0.0.1:1}\n  - {id: ask, operator: 127.0.0.1:1}\n  - {id: echo, operator: 127.0.0.1:1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	return New(j, orchestrator.Deps{Registry: reg, Caller: c}, orchestrator.Options{})
}

func waitFor(t testing.TB, e *Engine, id string, status orchestratorv1.WorkflowStatus) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		wf, err := e.Get(ctx, id)
		if err == nil && wf.Status == status {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("workflow %s: %v, %v; want %s", id, wf, err, orchestrator.StatusName(status))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A workflow RUNNING (in an operator call, then paused by a stop) and
// one SUSPENDED (waiting for a signal), both older than every cut-off,
// survive pruning and then complete: the RUNNING one when the next
// start resumes it, the SUSPENDED one when signaled. Once finished, they
// are deleted like any other.
func TestPruneKeepsUnfinished(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	j := openT(t, path)
	caller := newFakeCaller()
	e := newEngine(t, j, caller)
	ctx := context.Background()
	in := &operatorv1.OperatorInput{Message: content.Text("go")}
	for id, agent := range map[string]string{"running": "slow", "suspended": "ask"} {
		if _, _, err := e.Start(ctx, &orchestrator.StartRequest{WorkflowID: id, AgentID: agent, Input: in, Detached: true}); err != nil {
			t.Fatal(err)
		}
	}
	<-caller.started
	waitFor(t, e, "suspended", suspended)
	addFinished(t, j, "done", 1000, func(int) time.Time { return time.Now() })
	// A clock far ahead: every workflow is older than both bounds.
	later := func() time.Time { return time.Now().Add(1000 * time.Hour) }
	everything := Retention{MaxAge: time.Hour, MaxWorkflows: 1}
	if n, err := j.prune(ctx, everything, later); err != nil || n != 1000 {
		t.Fatalf("Prune while one workflow is in a call = %d, %v; want the 1000 finished deleted", n, err)
	}
	e.Close() // the call stops; the workflow stays RUNNING
	j.Close()

	j = openT(t, path)
	defer j.Close()
	if n, err := j.prune(ctx, everything, later); err != nil || n != 0 {
		t.Fatalf("Prune at start = %d, %v; want nothing deleted", n, err)
	}
	close(caller.release)
	e = newEngine(t, j, caller)
	defer e.Close()
	if n, err := e.Resume(); err != nil || n != 1 {
		t.Fatalf("Resume = %d, %v; want the RUNNING workflow", n, err)
	}
	waitFor(t, e, "running", completed)
	if _, _, err := e.Signal(ctx, "suspended", []byte{}, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, e, "suspended", completed)
	if n, err := j.prune(ctx, everything, later); err != nil || n != 2 {
		t.Fatalf("Prune once both finished = %d, %v; want both deleted", n, err)
	}
	for _, id := range []string{"running", "suspended"} {
		if _, err := e.Get(ctx, id); errs.Code(err) != codes.NotFound {
			t.Errorf("GetWorkflow(%s) after pruning = %v; want NOT_FOUND", id, err)
		}
	}
}

// A start reads the unfinished workflows alone: with the record of every
// finished workflow made unreadable and its status index entry made to
// say RUNNING, the journal opens and resumes exactly its one RUNNING
// workflow (a start that read either would fail or resume thousands).
func TestStartReadsOnlyUnfinished(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	j := openT(t, path)
	addUnfinished(t, j, "running", "slow", running, time.Now())
	addUnfinished(t, j, "suspended", "ask", suspended, time.Now())
	done := addFinished(t, j, "done", 2000, func(int) time.Time { return time.Now() })
	j.Close()

	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		all, idx := tx.Bucket(bucketWorkflows), tx.Bucket(bucketIndex)
		finished := map[string]bool{}
		for _, id := range done {
			finished[id] = true
		}
		var keys [][]byte
		_ = idx.ForEach(func(k, _ []byte) error {
			if finished[string(k[8:])] {
				keys = append(keys, bytes.Clone(k))
			}
			return nil
		})
		for _, k := range keys {
			if err := all.Bucket(k[8:]).Put(keyRecord, []byte("not a record")); err != nil {
				return err
			}
			if err := idx.Put(k, []byte{byte(running)}); err != nil {
				return err
			}
		}
		return nil
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}

	j = openT(t, path)
	defer j.Close()
	recs, err := j.Unfinished()
	if err != nil || len(recs) != 1 || recs[0].ID != "running" {
		t.Fatalf("Unfinished = %d records (%v); want the one RUNNING workflow", len(recs), err)
	}
	caller := newFakeCaller()
	e := newEngine(t, j, caller)
	defer e.Close()
	if n, err := e.Resume(); err != nil || n != 1 {
		t.Fatalf("Resume = %d, %v; want 1", n, err)
	}
	if id := <-caller.started; id != "running" {
		t.Errorf("resumed %q; want running", id)
	}
}

// A file of schema version 1 (no live or ended index) is migrated at
// open: its RUNNING workflow is resumed, its finished ones are counted
// and pruned by the time they ended, and it is stamped version 2.
func TestMigrateVersion1(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	j := openT(t, path)
	now := time.Now()
	addUnfinished(t, j, "running", "slow", running, now.Add(-time.Hour))
	addUnfinished(t, j, "suspended", "ask", suspended, now.Add(-time.Hour))
	olds := addFinished(t, j, "old", 300, func(i int) time.Time { return now.Add(-time.Duration(i+2) * time.Minute) })
	j.Close()
	// What version 1 wrote: version 2 without its indexes.
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketLive, bucketEnded} {
			if err := tx.DeleteBucket(b); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		if err := meta.Delete(keyFinished); err != nil {
			return err
		}
		return meta.Put(keySchema, u64(1))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}

	j = openT(t, path)
	defer j.Close()
	if recs, err := j.Unfinished(); err != nil || len(recs) != 1 || recs[0].ID != "running" {
		t.Errorf("Unfinished after migrating = %v, %v; want the RUNNING workflow", ids(recs), err)
	}
	want := map[string]int{"workflows": 302, "index": 302, "live": 2, "ended": 300, "meta/finished": 300}
	if got := contents(t, j); !maps.Equal(got, want) {
		t.Errorf("after migrating, the journal holds %v; want %v", got, want)
	}
	if n, err := j.Prune(context.Background(), Retention{MaxWorkflows: 100}); err != nil || n != 200 {
		t.Fatalf("Prune to 100 = %d, %v; want 200 deleted", n, err)
	}
	for i, id := range olds {
		if _, err := j.Get(id); (i < 100) != (err == nil) {
			t.Fatalf("Get(%s), the %d-th latest ended, = %v; want the 100 latest kept", id, i+1, err)
		}
	}
	_ = j.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(keySchema); string(v) != string(u64(schemaVersion)) {
			t.Errorf("schema version after migrating = %x; want %d", v, schemaVersion)
		}
		return nil
	})
}

// A Dispatch reusing the id of a pruned workflow starts a new workflow:
// nothing of the old one is replayed (its steps are called again), its
// signal keys no longer deduplicate, and its event log starts over.
// Before pruning, the same request reusing the id returns the recorded
// workflow.
func TestPrunedIDStartsOver(t *testing.T) {
	j := openT(t, filepath.Join(t.TempDir(), "journal.db"))
	defer j.Close()
	caller := newFakeCaller()
	e := newEngine(t, j, caller)
	defer e.Close()
	ctx := context.Background()
	req := &orchestrator.StartRequest{WorkflowID: "reused", AgentID: "ask", Input: &operatorv1.OperatorInput{Message: content.Text("go")}, Detached: true}
	run := func() (dup bool, seq uint64, sigDup bool) {
		t.Helper()
		_, dup, err := e.Start(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, e, "reused", suspended)
		if seq, sigDup, err = e.Signal(ctx, "reused", []byte{}, "approve-1"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, e, "reused", completed)
		return dup, seq, sigDup
	}
	if dup, seq, sigDup := run(); dup || seq != 1 || sigDup {
		t.Fatalf("first run: duplicate %v, signal %d duplicate %v", dup, seq, sigDup)
	}
	evs, _, err := e.Events(ctx, "reused", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, dup, err := e.Start(ctx, req); err != nil || !dup {
		t.Fatalf("the same Dispatch before pruning = duplicate %v, %v; want the recorded workflow", dup, err)
	}
	if n, err := j.prune(ctx, Retention{MaxAge: time.Hour}, func() time.Time { return time.Now().Add(2 * time.Hour) }); err != nil || n != 1 {
		t.Fatalf("Prune = %d, %v", n, err)
	}
	if dup, seq, sigDup := run(); dup || seq != 1 || sigDup {
		t.Errorf("after pruning: duplicate %v, signal %d duplicate %v; want a new workflow whose first signal is 1 and new", dup, seq, sigDup)
	}
	if n := caller.callsOf("reused"); n != 4 {
		t.Errorf("operator calls of the reused id = %d; want 4 (two in each workflow: none replayed)", n)
	}
	again, _, err := e.Events(ctx, "reused", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(again) != len(evs) || again[0].GetWorkflowSequence() != 1 {
		t.Errorf("the new workflow's log has %d events from %d; want %d from 1", len(again), again[0].GetWorkflowSequence(), len(evs))
	}
}

// Retain prunes at once, then every Interval, in the background; Close
// stops it.
func TestRetain(t *testing.T) {
	j := openT(t, filepath.Join(t.TempDir(), "journal.db"))
	addFinished(t, j, "old", 500, func(int) time.Time { return time.Now().Add(-48 * time.Hour) })
	j.Retain(Retention{MaxAge: 24 * time.Hour, Interval: time.Hour}, nil)
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := j.Finished()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d finished workflows left 10 s after Retain; want its first pass to delete them all", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := j.Close(); err != nil { // waits for the pruning to stop
		t.Fatal(err)
	}
}
