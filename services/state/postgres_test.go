package state

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/scope"
)

// TestMain shares one PostgreSQL server between the tests of this
// package (started on the first testenv.Postgres call, if any).
func TestMain(m *testing.M) { os.Exit(testenv.PostgresMain(m)) }

// openPostgres opens a Postgres backend on a fresh database; it is the
// opener of the shared suite. It skips without PostgreSQL.
func openPostgres(t *testing.T, opts ...Option) Backend {
	return openPostgresDSN(t, testenv.Postgres(t), opts...)
}

// openPostgresDSN opens a Postgres backend (a replica) on dsn, closed
// when the test ends.
func openPostgresDSN(t testing.TB, dsn string, opts ...Option) *Postgres {
	t.Helper()
	p, err := OpenPostgres(t.Context(), dsn, opts...)
	if err != nil {
		t.Fatalf("OpenPostgres: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// pgIdemRecords counts the idempotency records in b's database.
func pgIdemRecords(t *testing.T, b *Postgres) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM state_idempotency`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPostgresReplicasCompareAndSet runs several replicas (separate
// backends with separate pools on one database) that increment one
// counter with read, then write expecting the revision read, retrying on
// a stale revision. No increment may be lost: the final value is the
// number of successful writes, and the revisions of the successful
// writes, in the order of the values they wrote, strictly increase.
func TestPostgresReplicasCompareAndSet(t *testing.T) {
	dsn := testenv.Postgres(t)
	const replicas, workersEach, increments = 3, 2, 15
	var stores []*Postgres
	for range replicas {
		stores = append(stores, openPostgresDSN(t, dsn))
	}
	s := scope.Global()
	if _, err := stores[0].Write(ctx, s, "counter", mustValue(t, 0.0), Guard{ExpectedRevision: rev(0)}); err != nil {
		t.Fatal(err)
	}
	type success struct {
		value float64
		rev   uint64
	}
	var (
		mu    sync.Mutex
		wins  []success
		stale int
		wg    sync.WaitGroup
	)
	errc := make(chan error, replicas*workersEach)
	for r := range replicas * workersEach {
		st := stores[r%replicas]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range increments {
				for attempt := 0; ; attempt++ {
					if attempt > 10000 {
						errc <- errors.New("no progress after 10000 attempts")
						return
					}
					cur, err := st.Read(ctx, s, "counter")
					if err != nil {
						errc <- err
						return
					}
					next := cur.Value.GetNumberValue() + 1
					res, err := st.Write(ctx, s, "counter", mustValue(t, next), Guard{ExpectedRevision: rev(cur.Revision)})
					if errors.Is(err, errs.StaleRevision) {
						mu.Lock()
						stale++
						mu.Unlock()
						continue
					}
					if err != nil {
						errc <- err
						return
					}
					if res.Revision <= cur.Revision {
						errc <- fmt.Errorf("revision went %d -> %d", cur.Revision, res.Revision)
						return
					}
					mu.Lock()
					wins = append(wins, success{next, res.Revision})
					mu.Unlock()
					break
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	final := read(t, stores[1], s, "counter")
	if got, want := final.Value.GetNumberValue(), float64(len(wins)); got != want || len(wins) != replicas*workersEach*increments {
		t.Fatalf("counter is %v after %d successful increments (want %d): an update was lost", got, len(wins), replicas*workersEach*increments)
	}
	slices.SortFunc(wins, func(a, b success) int { return int(a.value - b.value) })
	for i, w := range wins {
		if w.value != float64(i+1) {
			t.Fatalf("value %v written twice or skipped (at %d)", w.value, i)
		}
		if i > 0 && w.rev <= wins[i-1].rev {
			t.Fatalf("value %v has revision %d, not after value %v's %d", w.value, w.rev, wins[i-1].value, wins[i-1].rev)
		}
	}
	if final.Revision != wins[len(wins)-1].rev {
		t.Fatalf("final revision %d; last successful write %d", final.Revision, wins[len(wins)-1].rev)
	}
	t.Logf("%d increments, %d stale attempts", len(wins), stale)
}

// TestPostgresReplicasCreateOnce: of replicas racing to create one key
// with "must not exist", exactly one wins, repeatedly.
func TestPostgresReplicasCreateOnce(t *testing.T) {
	dsn := testenv.Postgres(t)
	const replicas = 4
	var stores []*Postgres
	for range replicas {
		stores = append(stores, openPostgresDSN(t, dsn))
	}
	s := scope.Workflow("race")
	for round := range 20 {
		key := fmt.Sprint("k", round)
		var wg sync.WaitGroup
		results := make([]error, replicas)
		for i, st := range stores {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, results[i] = st.Write(ctx, s, key, str(fmt.Sprint("replica ", i)), Guard{ExpectedRevision: rev(0)})
			}()
		}
		wg.Wait()
		won := 0
		for _, err := range results {
			switch {
			case err == nil:
				won++
			case errs.Code(err) != codes.FailedPrecondition:
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d replicas created the key; want 1", round, won)
		}
	}
}

// TestPostgresReplicasShareStore: replicas opened at the same time on a
// new database migrate it once, share one revision counter, accept each
// other's page tokens and replay each other's idempotency keys.
func TestPostgresReplicasShareStore(t *testing.T) {
	dsn := testenv.Postgres(t)
	const replicas = 4
	stores := make([]*Postgres, replicas)
	errc := make([]error, replicas)
	var wg sync.WaitGroup
	for i := range replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stores[i], errc[i] = OpenPostgres(ctx, dsn)
		}()
	}
	wg.Wait()
	for i, err := range errc {
		if err != nil {
			t.Fatalf("replica %d: %v", i, err)
		}
		t.Cleanup(func() { _ = stores[i].Close() })
	}
	var versions int
	if err := stores[0].pool.QueryRow(ctx, `SELECT count(*) FROM schema_migrations`).Scan(&versions); err != nil {
		t.Fatal(err)
	}
	if want, _ := pgLoadMigrations(); versions != len(want) {
		t.Fatalf("schema_migrations has %d rows; want %d", versions, len(want))
	}
	s := scope.Session("shared")
	var last uint64
	for i := range 8 {
		r := write(t, stores[i%replicas], s, fmt.Sprint("k", i), str("v"))
		if r <= last {
			t.Fatalf("revision %d after %d on another replica", r, last)
		}
		last = r
	}
	page, err := stores[0].List(ctx, s, "k", "", 3)
	if err != nil || page.NextPageToken == "" {
		t.Fatalf("List = %+v, %v", page, err)
	}
	next, err := stores[1].List(ctx, s, "k", page.NextPageToken, 3)
	if err != nil || len(next.Items) != 3 || next.Items[0].Key != "k3" {
		t.Fatalf("List on another replica = %+v, %v", next, err)
	}
	g := Guard{IdempotencyKey: "once"}
	first, err := stores[2].Write(ctx, s, "idem", str("v"), g)
	if err != nil {
		t.Fatal(err)
	}
	again, err := stores[3].Write(ctx, s, "idem", str("v"), g)
	if err != nil || !again.Replayed || again.Revision != first.Revision {
		t.Fatalf("retry on another replica = %+v, %v; want %d replayed", again, err, first.Revision)
	}
}

// TestPostgresUpgradesSchema1: a database at schema version 1 (only
// migrations/0001_init.sql applied, rows written as that version's
// binary wrote them) is upgraded on open; its rows stay readable and
// searchable, and unindexed writes work in it.
func TestPostgresUpgradesSchema1(t *testing.T) {
	dsn := testenv.Postgres(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	schema1, err := pgMigrations.ReadFile("migrations/0001_init.sql")
	if err != nil {
		t.Fatal(err)
	}
	s := scope.Session("s")
	enc := scopeEnc(t, s)
	raw, err := marshalValue.Marshal(str("an old lynx"))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		string(schema1),
		`CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`,
		`INSERT INTO schema_migrations (version, name) VALUES (1, '0001_init')`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctx, `INSERT INTO state_items (scope, key, value, revision, body, key_words) VALUES ($1, 'old', $2, nextval('state_revision'), 'an old lynx', 'old')`, enc, raw); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close(ctx)

	p := openPostgresDSN(t, dsn)
	if it := read(t, p, s, "old"); it.Revision != 1 || it.Value.GetStringValue() != "an old lynx" {
		t.Fatalf("Read = %v @%d", it.Value, it.Revision)
	}
	if got := hitKeys(search(t, p, s, "lynx")); !slices.Equal(got, []string{"old"}) {
		t.Fatalf("Search = %q", got)
	}
	if _, err := p.Write(ctx, s, "old", str("an old lynx, unindexed"), Guard{Unindexed: true}); err != nil {
		t.Fatal(err)
	}
	if got := hitKeys(search(t, p, s, "lynx old")); len(got) != 0 {
		t.Fatalf("Search = %q", got)
	}
}

// scopeEnc is the stored encoding of s.
func scopeEnc(t *testing.T, s *typesv1.Scope) []byte {
	t.Helper()
	enc, err := scope.Encode(s)
	if err != nil {
		t.Fatal(err)
	}
	return enc
}

// TestPostgresOpenErrors checks the kinds of OpenPostgres failures.
func TestPostgresOpenErrors(t *testing.T) {
	// A port nobody listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := l.Addr().String()
	_ = l.Close()

	t.Run("malformed DSN", func(t *testing.T) {
		_, err := OpenPostgres(ctx, "postgres://u:secret@host:notaport/db")
		wantCode(t, err, codes.InvalidArgument, "postgres dsn")
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Fatalf("error repeats the password: %v", err)
		}
	})
	t.Run("unreachable server", func(t *testing.T) {
		_, err := OpenPostgres(ctx, "postgres://postgres@"+deadAddr+"/db?sslmode=disable&connect_timeout=5")
		wantCode(t, err, codes.Unavailable, "")
	})
	t.Run("schema newer than the binary", func(t *testing.T) {
		dsn := testenv.Postgres(t)
		p := openPostgresDSN(t, dsn)
		if _, err := p.pool.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES (9999, '9999_future')`); err != nil {
			t.Fatal(err)
		}
		_, err := OpenPostgres(ctx, dsn)
		wantCode(t, err, codes.FailedPrecondition, "newer than this binary")
	})
	t.Run("server gone after open", func(t *testing.T) {
		dsn := testenv.Postgres(t)
		p := openPostgresDSN(t, dsn)
		write(t, p, scope.Global(), "k", str("v"))
		// End every connection of the database, as a restart or a
		// failover would, and forbid new ones.
		var db string
		if err := p.pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
			t.Fatal(err)
		}
		conn, err := pgx.Connect(ctx, pgAdminDSN(t, dsn))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `ALTER DATABASE `+db+` ALLOW_CONNECTIONS false`); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { // let the database be dropped cleanly
			_, _ = conn.Exec(ctx, `ALTER DATABASE `+db+` ALLOW_CONNECTIONS true`)
		})
		if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, db); err != nil {
			t.Fatal(err)
		}
		_, err = p.Read(ctx, scope.Global(), "k")
		wantCode(t, err, codes.Unavailable, "")
		_, err = p.Write(ctx, scope.Global(), "k", str("v2"), Guard{})
		wantCode(t, err, codes.Unavailable, "")
		_, err = p.Search(ctx, scope.Global(), "v", 1)
		wantCode(t, err, codes.Unavailable, "")
	})
}

// pgAdminDSN is dsn pointing at the postgres database of its server.
func pgAdminDSN(t *testing.T, dsn string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("postgres://%s@%s:%d/postgres?sslmode=disable", cfg.User, cfg.Host, cfg.Port)
}

// TestPgHelpers checks the pure helpers of the backend.
func TestPgHelpers(t *testing.T) {
	ends := []struct {
		prefix string
		want   []byte
	}{
		{"", nil},
		{"a", []byte("b")},
		{"a\xff", []byte("b")},
		{"\xff\xff", nil},
		{"p/", []byte("p0")},
	}
	for _, e := range ends {
		if got := pgPrefixEnd([]byte(e.prefix)); string(got) != string(e.want) || (got == nil) != (e.want == nil) {
			t.Errorf("pgPrefixEnd(%q) = %q; want %q", e.prefix, got, e.want)
		}
	}
	if got := pgTerms("Kernel, kernel OR monday-night"); !slices.Equal(got, []string{"kernel", "monday", "night"}) {
		t.Errorf("pgTerms = %q", got)
	}
	if got := pgKeyWords("doc/quantum_Notes.v2"); got != "doc quantum notes v2" {
		t.Errorf("pgKeyWords = %q", got)
	}
	body := "a kernel and a Kernel"
	marked := "a " + pgMarkStart + "kernel" + pgMarkStop + " and a " + pgMarkStart + "Kernel" + pgMarkStop
	if got := pgMatchSpans(body, marked, []string{"kernel"}); !slices.Equal(got, []span{{2, 8}, {15, 21}}) {
		t.Errorf("pgMatchSpans = %v", got)
	}
	// A body holding the mark characters falls back to exact words.
	odd := "x" + pgMarkStart + " kernel"
	if got := pgMatchSpans(odd, "x"+pgMarkStart+" "+pgMarkStart+"kernel"+pgMarkStop, []string{"kernel"}); !slices.Equal(got, []span{{5, 11}}) {
		t.Errorf("pgMatchSpans fallback = %v", got)
	}
}
