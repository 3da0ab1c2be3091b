//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/internal/proc"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/scope"
)

// The crash test runs the real state binary, SIGKILLs it at random
// moments while concurrent writers write, restarts it on the same data
// directory, and checks what survived. Set NEURON_CRASH_SEED to replay
// the kill timings of a logged run.
const (
	crashRounds     = 5                      // SIGKILLs; the server is started crashRounds+1 times
	crashWriters    = 8                      // concurrent writer goroutines
	hotKeysPerScope = 4                      // keys every writer overwrites, per scope
	hotShare        = 4                      // one write in hotShare goes to a hot key
	minKillDelay    = 50 * time.Millisecond  // kill this long after writers resume...
	maxKillDelay    = 400 * time.Millisecond // ...at most this long
	crashBudget     = 60 * time.Second       // hard bound on the whole test after the build
	rpcTimeout      = 5 * time.Second
)

// crashScopes are the two scopes the writers write to.
var crashScopes = []*typesv1.Scope{scope.Session("crash"), scope.Workflow("crash")}

func TestCrashRecovery(t *testing.T) {
	bin := testenv.BuildStatic(t, "github.com/secbear/neuron/services/state/cmd/state")
	ctx, cancel := context.WithTimeout(context.Background(), crashBudget)
	defer cancel()

	seed := testenv.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	dataDir := filepath.Join(t.TempDir(), "data")
	dbPath := filepath.Join(dataDir, "state.db")
	addr := proc.FreeAddr(t)

	conn, err := grpcclient.Dial(grpcclient.Config{Target: addr, Dev: true, MaxRetries: -1, Timeout: rpcTimeout},
		// Reconnect quickly after a restart (the default backoff starts at 1s).
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 100 * time.Millisecond},
			MinConnectTimeout: time.Second,
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := statev1.NewStateServiceClient(conn)
	health := healthpb.NewHealthClient(conn)

	led := newLedger()
	// Writers hold gate shared for each attempt; the test holds it
	// exclusively while the server is down or being verified, so
	// verification sees no write in flight.
	var gate sync.RWMutex
	gate.Lock()
	held := true // whether the test holds gate
	writeCtx, stopWriters := context.WithCancel(ctx)
	var round atomic.Int32
	var wg sync.WaitGroup
	for w := range crashWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runWriter(writeCtx, client, led, &gate, &round, w, rand.New(rand.NewPCG(seed, uint64(w)+1)))
		}()
	}
	// If the test fails midway, let the writers go before returning.
	defer func() {
		stopWriters()
		if held {
			gate.Unlock()
		}
		wg.Wait()
	}()

	var srv *proc.Proc
	for r := 0; r <= crashRounds; r++ {
		srv = startState(ctx, t, bin, dataDir, addr, filepath.Join(t.TempDir(), fmt.Sprintf("server-%d.log", r)))
		waitServing(ctx, t, health, srv)
		if r > 0 {
			t.Logf("restart %d: %s", r, indexRecovery(srv))
			floor := verify(ctx, t, client, led, false)
			led.setFloor(r, floor)
			if t.Failed() {
				t.Fatalf("verification failed after restart %d", r)
			}
		}
		if r == crashRounds {
			break
		}
		round.Store(int32(r))
		delay := minKillDelay + time.Duration(rng.Int64N(int64(maxKillDelay-minKillDelay)+1))
		before := led.counts()
		gate.Unlock() // writers go
		held = false
		sleepCtx(ctx, delay)
		srv.Kill(t)
		gate.Lock() // in-flight attempts fail against the dead server
		held = true
		after := led.counts()
		t.Logf("round %d: SIGKILL after %v; %d attempts, %d acknowledged", r, delay.Round(time.Millisecond),
			after.attempts-before.attempts, after.acked-before.acked)
		checkBolt(t, dbPath)
		if r == crashRounds/2 {
			// Once, lose the whole search index too: the restart must
			// rebuild it from bbolt.
			if err := os.RemoveAll(dbPath + ".bleve"); err != nil {
				t.Fatal(err)
			}
			t.Logf("round %d: removed the search index", r)
		}
	}

	// The writers are paused; stop them for good and verify strictly.
	stopWriters()
	gate.Unlock()
	held = false
	wg.Wait()
	verify(ctx, t, client, led, true)
	led.checkRevisions(t)
	total := led.counts()
	t.Logf("total: %d attempts, %d acknowledged, %d keys", total.attempts, total.acked, total.keys)
	if total.acked == 0 {
		t.Error("no write was acknowledged: the test checked nothing")
	}
	srv.Terminate(t)
	checkBolt(t, dbPath)
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// startState starts the state binary on the bolt backend in dataDir.
func startState(ctx context.Context, t *testing.T, bin, dataDir, addr, logPath string) *proc.Proc {
	t.Helper()
	return startStateArgs(ctx, t, bin, logPath, "--dev", "--backend", "bolt", "--data-dir", dataDir, "--addr", addr, "--log-format", "text", "--log-level", "info")
}

// startStateArgs starts the state binary with exactly args (nothing from
// the caller's NEURON_STATE_* environment: flags are the whole config),
// logging to logPath.
func startStateArgs(ctx context.Context, t *testing.T, bin, logPath string, args ...string) *proc.Proc {
	t.Helper()
	return proc.Start(t, bin, proc.Options{Name: "state", LogPath: logPath, EnvPrefix: envPrefix, Context: ctx, TailLines: 30}, args...)
}

// indexRecovery says how the server brought its search index up to date,
// from its log.
func indexRecovery(p *proc.Proc) string {
	for line := range strings.Lines(p.Log()) {
		if strings.Contains(line, "search index") {
			return strings.TrimSpace(line)
		}
	}
	return "search index opened up to date"
}

// waitServing polls grpc.health.v1 until the state service is SERVING.
func waitServing(ctx context.Context, t *testing.T, health healthpb.HealthClient, p *proc.Proc) {
	t.Helper()
	p.WaitServing(ctx, t, health, statev1.StateService_ServiceDesc.ServiceName, 20*time.Millisecond)
}

// checkBolt opens the file of a dead server and runs bbolt's consistency
// check.
func checkBolt(t *testing.T, path string) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatalf("open %s after the crash: %v", path, err)
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		var problems []error
		for err := range tx.Check() {
			problems = append(problems, err)
		}
		return errors.Join(problems...)
	})
	if err != nil {
		t.Fatalf("bbolt consistency check of %s: %v", path, err)
	}
}

// attempt is one Write a writer sent. Only an attempt whose RPC returned
// OK is acknowledged; any other may or may not have been applied.
type attempt struct {
	key   keyID
	word  string // unique to this attempt; in its value's text
	round int    // the round (server run) it was sent in
	acked bool
	rev   uint64 // the acknowledged revision
}

type keyID struct {
	scope int // index in crashScopes
	key   string
}

// ledger records every attempt.
type ledger struct {
	mu         sync.Mutex
	byKey      map[keyID][]*attempt
	attempts   int
	acked      int
	floors     map[int]uint64 // round -> highest revision seen when it started
	unexpected []string       // write errors a crash cannot explain
}

func newLedger() *ledger {
	return &ledger{byKey: map[keyID][]*attempt{}, floors: map[int]uint64{}}
}

func (l *ledger) begin(k keyID, word string, round int) *attempt {
	a := &attempt{key: k, word: word, round: round}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.byKey[k] = append(l.byKey[k], a)
	l.attempts++
	return a
}

func (l *ledger) finish(a *attempt, resp *statev1.WriteResponse, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch status.Code(err) {
	case codes.OK:
		a.acked, a.rev = true, resp.GetRevision()
		l.acked++
	case codes.Unavailable, codes.DeadlineExceeded:
		// The server died (or was down) during the call: outcome unknown.
	default:
		l.unexpected = append(l.unexpected, fmt.Sprintf("write %q in round %d: %v", a.key.key, a.round, err))
	}
}

func (l *ledger) setFloor(round int, rev uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.floors[round] = rev
}

type ledgerCounts struct{ attempts, acked, keys int }

func (l *ledger) counts() ledgerCounts {
	l.mu.Lock()
	defer l.mu.Unlock()
	return ledgerCounts{l.attempts, l.acked, len(l.byKey)}
}

// snapshot copies the attempts of every key.
func (l *ledger) snapshot() map[keyID][]attempt {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[keyID][]attempt, len(l.byKey))
	for k, as := range l.byKey {
		for _, a := range as {
			out[k] = append(out[k], *a)
		}
	}
	return out
}

// checkRevisions checks the store-wide revision counter across crashes:
// no two acknowledged writes share a revision, and every write
// acknowledged after a restart has a revision above every revision that
// survived the crash before it (the counter never goes back).
func (l *ledger) checkRevisions(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, u := range l.unexpected {
		t.Errorf("unexpected write error (not explained by the crash): %s", u)
	}
	seen := map[uint64]string{}
	for k, as := range l.byKey {
		for _, a := range as {
			if !a.acked {
				continue
			}
			if other, dup := seen[a.rev]; dup {
				t.Errorf("revision %d acknowledged for both %s and %q", a.rev, other, k.key)
			}
			seen[a.rev] = k.key
			if floor := l.floors[a.round]; a.round > 0 && a.rev <= floor {
				t.Errorf("%q: acknowledged revision %d in round %d is not above %d, the highest revision that survived the crash before it",
					k.key, a.rev, a.round, floor)
			}
		}
	}
}

func runWriter(ctx context.Context, client statev1.StateServiceClient, led *ledger, gate *sync.RWMutex, round *atomic.Int32, w int, rng *rand.Rand) {
	for n := 0; ; n++ {
		gate.RLock()
		if ctx.Err() != nil {
			gate.RUnlock()
			return
		}
		k := keyID{scope: rng.IntN(len(crashScopes)), key: fmt.Sprintf("w%d/u%d", w, n)}
		if rng.IntN(hotShare) == 0 {
			k.key = fmt.Sprintf("hot/%d", rng.IntN(hotKeysPerScope))
		}
		word := fmt.Sprintf("cw%dx%d", w, n)
		a := led.begin(k, word, int(round.Load()))
		val, _ := structpb.NewValue(map[string]any{
			"word": word,
			"text": fmt.Sprintf("crash test document %s from writer %d", word, w),
		})
		cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
		resp, err := client.Write(cctx, &statev1.WriteRequest{Scope: crashScopes[k.scope], Key: k.key, Value: val})
		cancel()
		led.finish(a, resp, err)
		gate.RUnlock()
		if err != nil {
			sleepCtx(ctx, 5*time.Millisecond)
		}
	}
}

// verify checks every key ever written against the ledger and returns
// the highest revision it read. It runs with no write in flight.
//
// For a key, let maxAck be the highest acknowledged revision (0 if none).
// The stored value must come from one of the key's attempts, X:
//   - if X was acknowledged, the stored revision is exactly X's and X is
//     the last acknowledged write (revision == maxAck);
//   - if not, X was applied after every acknowledged write (revision >
//     maxAck): a write in flight at the kill may win, never an older one.
//
// A key with an acknowledged write must exist. Search for X's word finds
// exactly this key at the stored revision; Search for any other attempt's
// word finds nothing (the index holds no overwritten or unapplied
// value). With final, List must also agree with the reads.
func verify(ctx context.Context, t *testing.T, client statev1.StateServiceClient, led *ledger, final bool) uint64 {
	t.Helper()
	snap := led.snapshot()
	type found struct {
		rev    uint64
		exists bool
	}
	var (
		mu     sync.Mutex
		maxRev uint64
		stored = map[keyID]found{}
		errs   []string
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(errs) < 50 {
			errs = append(errs, fmt.Sprintf(format, args...))
		}
	}
	check := func(k keyID, as []attempt) {
		var maxAck uint64
		for _, a := range as {
			if a.acked {
				maxAck = max(maxAck, a.rev)
			}
		}
		sc := crashScopes[k.scope]
		rctx, cancel := context.WithTimeout(ctx, rpcTimeout)
		resp, err := client.Read(rctx, &statev1.ReadRequest{Scope: sc, Key: k.key})
		cancel()
		current := ""
		switch status.Code(err) {
		case codes.NotFound:
			if maxAck > 0 {
				fail("%s %q: acknowledged write (revision %d) lost: NOT_FOUND", scope.String(sc), k.key, maxAck)
			}
		case codes.OK:
			current = resp.GetValue().GetStructValue().GetFields()["word"].GetStringValue()
			i := slices.IndexFunc(as, func(a attempt) bool { return a.word == current })
			switch {
			case i < 0:
				fail("%s %q: value %v was written by no attempt on this key", scope.String(sc), k.key, resp.GetValue())
			case as[i].acked && (resp.GetRevision() != as[i].rev || as[i].rev != maxAck):
				fail("%s %q: holds acknowledged %s at revision %d (acknowledged %d), but the last acknowledged revision is %d",
					scope.String(sc), k.key, current, resp.GetRevision(), as[i].rev, maxAck)
			case !as[i].acked && resp.GetRevision() <= maxAck:
				fail("%s %q: holds unacknowledged %s at revision %d, not after the acknowledged revision %d",
					scope.String(sc), k.key, current, resp.GetRevision(), maxAck)
			}
			mu.Lock()
			maxRev = max(maxRev, resp.GetRevision())
			stored[k] = found{resp.GetRevision(), true}
			mu.Unlock()
		default:
			fail("%s %q: read: %v", scope.String(sc), k.key, err)
			return
		}
		for _, a := range as {
			if a.word != current && !final {
				continue
			}
			sctx, cancel := context.WithTimeout(ctx, rpcTimeout)
			res, err := client.Search(sctx, &statev1.SearchRequest{Scope: sc, Query: a.word, Limit: 5})
			cancel()
			if err != nil {
				fail("%s search %s: %v", scope.String(sc), a.word, err)
				continue
			}
			hits := res.GetResults()
			if a.word == current {
				if len(hits) != 1 || hits[0].GetKey() != k.key || hits[0].GetRevision() != resp.GetRevision() {
					fail("%s search %s: got %v, want exactly %q at revision %d", scope.String(sc), a.word, hits, k.key, resp.GetRevision())
				}
			} else if len(hits) != 0 {
				fail("%s search %s: got %v for a value that is not current (acknowledged=%v)", scope.String(sc), a.word, hits, a.acked)
			}
		}
	}

	keys := make(chan keyID)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range keys {
				check(k, snap[k])
			}
		}()
	}
	for k := range snap {
		keys <- k
	}
	close(keys)
	wg.Wait()

	if final {
		for i, sc := range crashScopes {
			listed := listAll(ctx, t, client, sc)
			for key, rev := range listed {
				if f := stored[keyID{i, key}]; !f.exists || f.rev != rev {
					fail("%s: List has %q at revision %d; Read said %v", scope.String(sc), key, rev, f)
				}
			}
			for k, f := range stored {
				if k.scope == i && f.exists {
					if _, ok := listed[k.key]; !ok {
						fail("%s: List misses %q", scope.String(sc), k.key)
					}
				}
			}
		}
	}
	for _, e := range errs {
		t.Error(e)
	}
	return maxRev
}

// listAll lists every key of a scope with its revision.
func listAll(ctx context.Context, t *testing.T, client statev1.StateServiceClient, sc *typesv1.Scope) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	token := ""
	for {
		lctx, cancel := context.WithTimeout(ctx, rpcTimeout)
		page, err := client.List(lctx, &statev1.ListRequest{Scope: sc, PageSize: 1000, PageToken: token})
		cancel()
		if err != nil {
			t.Fatalf("list %s: %v", scope.String(sc), err)
		}
		for _, it := range page.GetItems() {
			out[it.GetKey()] = it.GetRevision()
		}
		if token = page.GetNextPageToken(); token == "" {
			return out
		}
	}
}
