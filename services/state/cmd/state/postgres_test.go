//go:build unix

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/internal/proc"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/scope"
)

// The multi-process test: several state binaries on one PostgreSQL
// database, incremented by compare-and-set from many goroutines.
const (
	pgProcs       = 3                // state processes sharing the database
	pgCounters    = 3                // keys every goroutine increments
	pgWorkers     = 4                // goroutines per process
	pgIncrements  = 15               // successful increments per goroutine
	pgMaxAttempts = 1000             // CAS attempts per increment before giving up
	pgBudget      = 60 * time.Second // hard bound on the test after the build
)

// TestPostgresProcessesNoLostUpdate runs three real state binaries
// (--backend postgres --postgres-dsn-file) on one database and has
// goroutines spread over the three increment a few shared counters with
// read, then write with expected_revision set to the revision read,
// retrying on FAILED_PRECONDITION (reason STALE_REVISION). A counter that
// does not exist yet is created with expected_revision 0, so the first
// writes race too. No update may be lost: each counter's value is the
// number of increments acknowledged on it, every value from 1 up was
// acknowledged exactly once, in increasing revision order, and the stored
// revision is that of the last acknowledged write. Every process must then
// stop cleanly on SIGTERM.
func TestPostgresProcessesNoLostUpdate(t *testing.T) {
	dsn := testenv.Postgres(t) // skips when PostgreSQL cannot start here
	bin := testenv.BuildStatic(t, "github.com/secbear/neuron/services/state/cmd/state")
	ctx, cancel := context.WithTimeout(context.Background(), pgBudget)
	defer cancel()

	dir := t.TempDir()
	dsnFile := filepath.Join(dir, "dsn")
	if err := os.WriteFile(dsnFile, []byte(dsn+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var (
		procs   []*proc.Proc
		clients []statev1.StateServiceClient
	)
	for i := range pgProcs {
		addr := proc.FreeAddr(t)
		p := startStateArgs(ctx, t, bin, filepath.Join(dir, fmt.Sprintf("state-%d.log", i)),
			"--dev", "--backend", "postgres", "--postgres-dsn-file", dsnFile, "--addr", addr, "--log-format", "text", "--log-level", "info")
		conn, err := grpcclient.Dial(grpcclient.Config{Target: addr, Dev: true, MaxRetries: -1, Timeout: rpcTimeout})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		waitServing(ctx, t, healthpb.NewHealthClient(conn), p)
		procs = append(procs, p)
		clients = append(clients, statev1.NewStateServiceClient(conn))
	}

	sc := scope.Workflow("pg-procs")
	keys := make([]string, pgCounters)
	for i := range keys {
		keys[i] = fmt.Sprintf("counter-%d", i)
	}
	led := &casLedger{wins: map[string][]casWin{}}
	var wg sync.WaitGroup
	for w := range pgProcs * pgWorkers {
		client := clients[w%pgProcs]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range pgIncrements {
				key := keys[(w+n)%len(keys)]
				if err := increment(ctx, client, sc, key, led); err != nil {
					led.fail(fmt.Errorf("worker %d (process %d), %s: %w", w, w%pgProcs, key, err))
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, err := range led.errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}

	total := 0
	for i, key := range keys {
		wins := led.wins[key]
		total += len(wins)
		// Read through a different process from the one that wrote last,
		// most of the time: every process must see the same store.
		resp, err := clients[i%pgProcs].Read(ctx, &statev1.ReadRequest{Scope: sc, Key: key})
		if err != nil {
			t.Fatalf("read %s: %v", key, err)
		}
		got := resp.GetValue().GetStructValue().GetFields()["n"].GetNumberValue()
		if got != float64(len(wins)) {
			t.Errorf("%s is %v after %d acknowledged increments: an update was lost", key, got, len(wins))
			continue
		}
		slices.SortFunc(wins, func(a, b casWin) int { return a.value - b.value })
		for j, win := range wins {
			if win.value != j+1 {
				t.Errorf("%s: value %d acknowledged twice or value %d never (at %d)", key, win.value, j+1, j)
				break
			}
			if j > 0 && win.rev <= wins[j-1].rev {
				t.Errorf("%s: value %d has revision %d, not after value %d's %d", key, win.value, win.rev, wins[j-1].value, wins[j-1].rev)
			}
		}
		if last := wins[len(wins)-1].rev; resp.GetRevision() != last {
			t.Errorf("%s: stored revision %d; the last acknowledged write got %d", key, resp.GetRevision(), last)
		}
	}
	if want := pgProcs * pgWorkers * pgIncrements; total != want {
		t.Errorf("%d increments acknowledged, want %d", total, want)
	}
	t.Logf("%d processes, %d goroutines, %d keys: %d increments, %d stale attempts", pgProcs, pgProcs*pgWorkers, pgCounters, total, led.stale)
	for _, p := range procs {
		p.Terminate(t)
	}
}

// casWin is one acknowledged increment: the value written and the
// revision it got.
type casWin struct {
	value int
	rev   uint64
}

// casLedger collects what the incrementing goroutines saw.
type casLedger struct {
	mu    sync.Mutex
	wins  map[string][]casWin
	stale int
	errs  []error
}

func (l *casLedger) win(key string, w casWin) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.wins[key] = append(l.wins[key], w)
}

func (l *casLedger) staleAttempt() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stale++
}

func (l *casLedger) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, err)
}

// increment adds one to the counter at key: it reads the counter (absent
// is 0 at revision 0), writes the next value expecting the revision read,
// and starts over when another writer got there first. Any other error
// ends it: no call is retried blindly, so an acknowledged write is never
// applied twice.
func increment(ctx context.Context, client statev1.StateServiceClient, sc *typesv1.Scope, key string, led *casLedger) error {
	for range pgMaxAttempts {
		var (
			cur int
			rev uint64
		)
		resp, err := client.Read(ctx, &statev1.ReadRequest{Scope: sc, Key: key})
		switch status.Code(err) {
		case codes.OK:
			cur, rev = int(resp.GetValue().GetStructValue().GetFields()["n"].GetNumberValue()), resp.GetRevision()
		case codes.NotFound:
		default:
			return fmt.Errorf("read: %w", err)
		}
		next := cur + 1
		val, err := structpb.NewValue(map[string]any{"n": next})
		if err != nil {
			return err
		}
		wr, err := client.Write(ctx, &statev1.WriteRequest{Scope: sc, Key: key, Value: val, ExpectedRevision: &rev})
		switch {
		case err == nil:
			if wr.GetRevision() <= rev {
				return fmt.Errorf("write expecting revision %d acknowledged at revision %d", rev, wr.GetRevision())
			}
			led.win(key, casWin{value: next, rev: wr.GetRevision()})
			return nil
		case status.Code(err) == codes.FailedPrecondition && errs.Reason(err) == errs.ReasonStaleRevision:
			led.staleAttempt()
		default:
			return fmt.Errorf("write expecting revision %d: %w", rev, err)
		}
	}
	return fmt.Errorf("no increment after %d attempts", pgMaxAttempts)
}
