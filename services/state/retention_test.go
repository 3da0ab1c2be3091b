package state

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/scope"
)

// handClock is a clock tests move by hand.
type handClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *handClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *handClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func TestParseRetention(t *testing.T) {
	rules, err := ParseRetention(`scope=session,prefix=conversation/,max-age=720h,max-entries=1000; scope=global,max-age=1h ;`)
	if err != nil {
		t.Fatal(err)
	}
	want := []RetentionRule{
		{Scope: "session", Prefix: "conversation/", MaxAge: 720 * time.Hour, MaxEntries: 1000},
		{Scope: "global", MaxAge: time.Hour},
	}
	if !slices.Equal(rules, want) {
		t.Fatalf("rules %+v, want %+v", rules, want)
	}
	if rules, err := ParseRetention(""); err != nil || len(rules) != 0 {
		t.Fatalf("empty: %v, %v", rules, err)
	}
	for _, bad := range []string{
		"scope=session",                      // no limit
		"prefix=x,max-entries=1",             // no scope
		"scope=sessions,max-entries=1",       // unknown kind
		"scope=session,max-age=soon",         // bad duration
		"scope=session,max-entries=-1",       // negative
		"scope=session,max-entries=1,keep=2", // unknown field
		"scope=session,max-entries",          // not name=value
	} {
		if _, err := ParseRetention(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	path := filepath.Join(t.TempDir(), "retention.json")
	if err := os.WriteFile(path, []byte(`{"rules":[{"scope":"session:\"s1\"","prefix":"a,b;c","max_age":"2h","max_entries":3}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	rules, err = ReadRetentionFile(path)
	if err != nil || len(rules) != 1 || rules[0] != (RetentionRule{Scope: `session:"s1"`, Prefix: "a,b;c", MaxAge: 2 * time.Hour, MaxEntries: 3}) {
		t.Fatalf("file: %+v, %v", rules, err)
	}
	if err := os.WriteFile(path, []byte(`{"rules":[{"scope":"session","max_entries":3,"maxage":"1h"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadRetentionFile(path); err == nil {
		t.Error("unknown field in the file accepted")
	}
}

func TestRetentionMatches(t *testing.T) {
	tests := []struct {
		rule  string
		scope *typesv1.Scope
		key   string
		want  bool
	}{
		{"*", scope.Global(), "k", true},
		{"session", scope.Session("s1"), "conversation/1", true},
		{"session", scope.Workflow("s1"), "conversation/1", false},
		{`session:"s1"`, scope.Session("s1"), "x", true},
		{`session:s1`, scope.Session("s1"), "x", true},
		{`session:s1`, scope.Session("s10"), "x", false},
		{"agent", scope.Agent("wf", "a"), "x", true},
		{"custom", scope.Custom("team"), "x", true},
	}
	for _, tt := range tests {
		r := RetentionRule{Scope: tt.rule, MaxEntries: 1}
		if got := r.matches(scope.String(tt.scope), tt.key); got != tt.want {
			t.Errorf("%q on %s: %v, want %v", tt.rule, scope.String(tt.scope), got, tt.want)
		}
	}
	if (RetentionRule{Scope: "*", Prefix: "conversation/"}).matches("global", "summary/1") {
		t.Error("prefix not applied")
	}
}

// listKeys lists every key of s in b.
func listKeys(t *testing.T, b Backend, s *typesv1.Scope) []string {
	t.Helper()
	page, err := b.List(ctx, s, "", "", MaxPageSize)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, it := range page.Items {
		out = append(out, it.Key)
	}
	return out
}

func removedKeys(rs []Removed) []string {
	var out []string
	for _, r := range rs {
		out = append(out, scope.String(r.Scope)+" "+r.Key+" "+r.Reason)
	}
	return out
}

// TestRetentionSweep: on every backend (PostgreSQL when it can start),
// with a hand-moved clock, a max-entries rule keeps each selected scope's
// newest keys, a max-age rule deletes keys once a sweep at least max-age
// ago had seen them, the rest is untouched, and the full-text and vector
// indexes follow (the vector index having answered before the sweep: on
// PostgreSQL it follows through the change log).
func TestRetentionSweep(t *testing.T) {
	for _, bk := range backends {
		t.Run(bk.name, func(t *testing.T) {
			b := bk.open(t)
			s1, s2, g := scope.Session("s1"), scope.Session("s2"), scope.Global()
			write := func(s *typesv1.Scope, key string, embedding ...float32) {
				t.Helper()
				if _, err := b.Write(ctx, s, key, str("memory of "+strings.ReplaceAll(key, "/", " ")), Guard{Embedding: embedding}); err != nil {
					t.Fatal(err)
				}
			}
			for _, k := range []string{"conversation/1", "conversation/2", "conversation/3", "conversation/4", "conversation/5"} {
				write(s1, k, 1, 0, 0)
			}
			write(s1, "summary/1")
			write(s2, "conversation/1")
			write(g, "g/1", 0, 1, 0)
			if vb, ok := b.(VectorBackend); ok {
				for _, s := range []*typesv1.Scope{s1, g} {
					if hits, err := vb.VectorSearch(ctx, s, []float32{1, 0, 0}, 10); err != nil || len(hits) == 0 {
						t.Fatalf("vector search before the sweep: %v, %v", hits, err)
					}
				}
			}
			clock := &handClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
			sw, err := NewSweeper(b, []RetentionRule{
				{Scope: "session", Prefix: "conversation/", MaxEntries: 3},
				{Scope: "global", MaxAge: time.Hour},
			}, clock.now, nil)
			if err != nil {
				t.Fatal(err)
			}
			sweep := func(want ...string) {
				t.Helper()
				got, err := sw.Sweep(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(removedKeys(got), want) {
					t.Fatalf("removed %q, want %q", removedKeys(got), want)
				}
			}
			sweep(`session:"s1" conversation/1 max-entries`, `session:"s1" conversation/2 max-entries`)
			if got := listKeys(t, b, s1); !slices.Equal(got, []string{"conversation/3", "conversation/4", "conversation/5", "summary/1"}) {
				t.Fatalf("s1 keeps %q", got)
			}
			sweep() // nothing more, and g/1 is not known to be an hour old yet

			clock.add(30 * time.Minute)
			write(g, "g/2")
			sweep()
			clock.add(30 * time.Minute)
			sweep(`global g/1 max-age`) // seen by the sweep an hour ago; g/2 was written after it
			if got := listKeys(t, b, g); !slices.Equal(got, []string{"g/2"}) {
				t.Fatalf("global keeps %q", got)
			}
			clock.add(30 * time.Minute)
			sweep(`global g/2 max-age`)
			if got := listKeys(t, b, s2); !slices.Equal(got, []string{"conversation/1"}) {
				t.Fatalf("s2 keeps %q", got)
			}

			// The indexes follow: neither search finds a removed key.
			if hits, err := b.Search(ctx, s1, "conversation", 10); err != nil || len(hits) != 3 {
				t.Fatalf("keyword search after retention: %v, %v", hits, err)
			}
			if vb, ok := b.(VectorBackend); ok {
				hits, err := vb.VectorSearch(ctx, s1, []float32{1, 0, 0}, 10)
				if err != nil {
					t.Fatal(err)
				}
				var keys []string
				for _, h := range hits {
					keys = append(keys, h.Key)
				}
				slices.Sort(keys)
				if !slices.Equal(keys, []string{"conversation/3", "conversation/4", "conversation/5"}) {
					t.Fatalf("vector search after retention: %q", keys)
				}
				if hits, err := vb.VectorSearch(ctx, g, []float32{0, 1, 0}, 10); err != nil || len(hits) != 0 {
					t.Fatalf("vector search finds removed global keys: %v, %v", hits, err)
				}
			}
		})
	}
}

// rewriting is a store whose scan is followed, before the sweeper
// deletes anything, by a client's rewrite of key.
type rewriting struct {
	retentionStore
	s   *typesv1.Scope
	key string
}

func (r rewriting) retentionScan(ctx context.Context, fn func(enc []byte, key string, rev uint64)) (uint64, error) {
	last, err := r.retentionStore.retentionScan(ctx, fn)
	if err == nil {
		_, err = r.Write(ctx, r.s, r.key, str("rewritten"), Guard{})
	}
	return last, err
}

// TestRetentionKeepsARewrite: a key written again between the sweep's
// scan and its deletion is kept (the delete is a compare-and-set on the
// revision the scan saw).
func TestRetentionKeepsARewrite(t *testing.T) {
	m := NewMemory()
	defer m.Close()
	s := scope.Session("s")
	for _, k := range []string{"a", "b", "c"} {
		if _, err := m.Write(ctx, s, k, str(k), Guard{}); err != nil {
			t.Fatal(err)
		}
	}
	sw, err := NewSweeper(rewriting{m, s, "a"}, []RetentionRule{{Scope: "session", MaxEntries: 1}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := sw.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removedKeys(got), []string{`session:"s" b max-entries`}) {
		t.Fatalf("removed %q; want only b (a was rewritten after the scan)", removedKeys(got))
	}
	if it, err := m.Read(ctx, s, "a"); err != nil || it.Value.GetStringValue() != "rewritten" {
		t.Fatalf("a: %v, %v", it, err)
	}
}

// TestRetentionIdempotentRetry: a retried write of a key retention
// removed is recognised, not applied again: nothing resurrects.
func TestRetentionIdempotentRetry(t *testing.T) {
	m := NewMemory()
	defer m.Close()
	s := scope.Session("s")
	first, err := m.Write(ctx, s, "conversation/1", str("turn"), Guard{IdempotencyKey: "effect-1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Write(ctx, s, "conversation/2", str("turn"), Guard{}); err != nil {
		t.Fatal(err)
	}
	sw, err := NewSweeper(m, []RetentionRule{{Scope: "session", Prefix: "conversation/", MaxEntries: 1}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := sw.Sweep(ctx); err != nil || len(got) != 1 {
		t.Fatalf("sweep: %q, %v", removedKeys(got), err)
	}
	retry, err := m.Write(ctx, s, "conversation/1", str("turn"), Guard{IdempotencyKey: "effect-1"})
	if err != nil || !retry.Replayed || retry.Revision != first.Revision {
		t.Fatalf("retry: %+v, %v; want replayed with revision %d", retry, err, first.Revision)
	}
	if _, err := m.Read(ctx, s, "conversation/1"); !errors.Is(err, errs.NotFound) {
		t.Fatalf("the removed key came back: %v", err)
	}
}

// TestRetentionPostgresSharesAges: the sweeper's notes are in the
// database, so a sweep by another replica (a new sweeper) ages keys from
// the first one's note, and removes only what that note covers.
func TestRetentionPostgresSharesAges(t *testing.T) {
	dsn := testenv.Postgres(t)
	a, b := openPostgresDSN(t, dsn), openPostgresDSN(t, dsn)
	s := scope.Custom("logs")
	if _, err := a.Write(ctx, s, "old", str("x"), Guard{}); err != nil {
		t.Fatal(err)
	}
	clock := &handClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	rules := []RetentionRule{{Scope: "custom", MaxAge: time.Hour}}
	sw, err := NewSweeper(a, rules, clock.now, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := sw.Sweep(ctx); err != nil || len(got) != 0 {
		t.Fatalf("first sweep: %q, %v", removedKeys(got), err)
	}
	if _, err := b.Write(ctx, s, "new", str("y"), Guard{}); err != nil {
		t.Fatal(err)
	}
	clock.add(2 * time.Hour)
	if sw, err = NewSweeper(b, rules, clock.now, nil); err != nil {
		t.Fatal(err)
	}
	got, err := sw.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removedKeys(got), []string{`custom:"logs" old max-age`}) {
		t.Fatalf("replica b's sweep removed %q, want only old", removedKeys(got))
	}
	if got := listKeys(t, a, s); !slices.Equal(got, []string{"new"}) {
		t.Fatalf("keys %q; want new", got)
	}
}

// TestRetentionBoltRemembersAges: bbolt keeps the sweeper's notes, so a
// key seen by a sweep before a restart is aged from then.
func TestRetentionBoltRemembersAges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	b := mustOpen(t, path)
	s := scope.Custom("logs")
	if _, err := b.Write(ctx, s, "old", str("x"), Guard{}); err != nil {
		t.Fatal(err)
	}
	clock := &handClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	rules := []RetentionRule{{Scope: "custom", MaxAge: time.Hour}}
	sw, err := NewSweeper(b, rules, clock.now, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := sw.Sweep(ctx); err != nil || len(got) != 0 {
		t.Fatalf("first sweep: %q, %v", removedKeys(got), err)
	}
	mustClose(t, b)

	b = mustOpen(t, path)
	if _, err := b.Write(ctx, s, "new", str("y"), Guard{}); err != nil {
		t.Fatal(err)
	}
	clock.add(2 * time.Hour)
	if sw, err = NewSweeper(b, rules, clock.now, nil); err != nil {
		t.Fatal(err)
	}
	got, err := sw.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removedKeys(got), []string{`custom:"logs" old max-age`}) {
		t.Fatalf("after a restart removed %q, want only old", removedKeys(got))
	}
}

// TestRunRetention: the service's background sweeper, configured as
// --retention configures it, enforces max-entries on what clients write
// through gRPC; a backend the sweeper cannot enumerate is refused.
func TestRunRetention(t *testing.T) {
	rules, err := ParseRetention("scope=session,prefix=conversation/,max-entries=2")
	if err != nil {
		t.Fatal(err)
	}
	addr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		return Run(ctx, Config{Server: devServer, Log: harness.Quiet(), Listener: lis, Backend: BackendMemory,
			Retention: rules, RetentionInterval: 5 * time.Millisecond})
	})
	c := statev1.NewStateServiceClient(harness.Dial(t, addr))
	s := scope.Session("chat")
	for _, k := range []string{"conversation/1", "conversation/2", "conversation/3", "conversation/4", "notes"} {
		if _, err := c.Write(ctx, &statev1.WriteRequest{Scope: s, Key: k, Value: str(k)}); err != nil {
			t.Fatal(err)
		}
	}
	// Wait (bounded) for a sweep that has seen every write.
	deadline := time.Now().Add(20 * time.Second)
	var keys []string
	for {
		resp, err := c.List(ctx, &statev1.ListRequest{Scope: s, PageSize: 100})
		if err != nil {
			t.Fatal(err)
		}
		keys = keys[:0]
		for _, it := range resp.GetItems() {
			keys = append(keys, it.GetKey())
		}
		if len(keys) <= 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !slices.Equal(keys, []string{"conversation/3", "conversation/4", "notes"}) {
		t.Fatalf("keys %q, want the two newest conversation entries and notes", keys)
	}

	if _, err := NewSweeper(struct{ Backend }{NewMemory()}, rules, nil, nil); !errors.Is(err, errs.FailedPrecondition) {
		t.Fatalf("a backend without retention support: %v, want FAILED_PRECONDITION", err)
	}
}
