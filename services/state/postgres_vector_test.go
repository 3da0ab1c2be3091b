package state

import (
	"bytes"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/services/state/internal/vecsynth"
)

// TestPostgresVectorReplicas: two replicas on one database, each with
// its own in-process vector index (searched through HNSW graphs: annMin
// lowered to 16), see each other's writes, overwrites, deletes and
// unindexed writes at their next search; scopes stay apart; a replica
// opened later fetches everything at its first search.
func TestPostgresVectorReplicas(t *testing.T) {
	dsn := testenv.Postgres(t)
	a, b := openPostgresDSN(t, dsn), openPostgresDSN(t, dsn)
	for _, p := range []*Postgres{a, b} {
		p.vectors.idx.annMin = 16
	}
	s, other := scope.Session("vec"), scope.Session("other")
	data := vecsynth.New(21, 32, 5)
	vecs := map[string][]float32{}
	for i := range 60 {
		key := fmt.Sprintf("k%02d", i)
		vecs[key] = data.Next()
		w := []*Postgres{a, b}[i%2]
		if _, err := w.Write(ctx, s, key, str("value "+key), Guard{Embedding: vecs[key]}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Write(ctx, other, "k00", str("elsewhere"), Guard{Embedding: vecs["k00"]}); err != nil {
		t.Fatal(err)
	}
	top := func(p *Postgres, q []float32, limit int) []SearchHit {
		t.Helper()
		hits, err := p.VectorSearch(ctx, s, q, limit)
		if err != nil {
			t.Fatal(err)
		}
		return hits
	}
	keys := func(hits []SearchHit) []string {
		var out []string
		for _, h := range hits {
			out = append(out, h.Key)
		}
		return out
	}
	for _, p := range []*Postgres{a, b} {
		hits := top(p, vecs["k07"], 5)
		if len(hits) == 0 || hits[0].Key != "k07" || hits[0].Snippet != "value k07" {
			t.Fatalf("search by k07's own vector: %+v", hits)
		}
		enc, _ := scope.Encode(s)
		p.vectors.idx.settle() // the graph is built in the background
		if g := p.vectors.idx.scopes[string(enc)].graphs[32]; g == nil || g.Len() != 60 {
			t.Fatalf("replica has no graph of the scope's 60 vectors")
		}
	}
	if hits := top(a, vecs["k00"], 60); len(hits) != 60 {
		t.Errorf("limit 60 over 60 keys: %d hits (other scopes must not count)", len(hits))
	}

	// b overwrites k07 with another vector; a sees the new one only.
	vecs["k07"] = data.Next()
	res, err := b.Write(ctx, s, "k07", str("value k07 again"), Guard{Embedding: vecs["k07"]})
	if err != nil {
		t.Fatal(err)
	}
	hits := top(a, vecs["k07"], 1)
	if len(hits) != 1 || hits[0].Key != "k07" || hits[0].Revision != res.Revision || hits[0].Snippet != "value k07 again" {
		t.Errorf("after b overwrote k07 (revision %d), a finds %+v", res.Revision, hits)
	}
	// a deletes k08 and writes k09 unindexed, and k10 without an
	// embedding: b never returns them.
	if _, err := a.Delete(ctx, s, "k08", Guard{}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Write(ctx, s, "k09", str("hidden"), Guard{Unindexed: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Write(ctx, s, "k10", str("plain"), Guard{}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"k08", "k09", "k10"} {
		if got := keys(top(b, vecs[k], 60)); slices.Contains(got, k) {
			t.Errorf("b returned %s after a removed its embedding", k)
		}
	}
	if got := keys(top(b, vecs["k00"], 60)); len(got) != 57 {
		t.Errorf("b holds %d embedded keys; want 57", len(got))
	}

	// A replica opened now fetches the scope at its first search.
	c := openPostgresDSN(t, dsn)
	if hits := top(c, vecs["k11"], 1); len(hits) != 1 || hits[0].Key != "k11" {
		t.Errorf("new replica: %+v", hits)
	}
}

// TestPostgresVectorLog: OpenPostgres logs which vector index is in use
// and what it found of pgvector; a replica that holds a scope catches up
// by reading the change log's new rows only (not the scope's keys); a
// replica whose last read falls behind the pruned log reloads, and still
// sees a write whose log row was pruned (without the reload it would
// not).
func TestPostgresVectorLog(t *testing.T) {
	dsn := testenv.Postgres(t)
	var logs bytes.Buffer
	a := openPostgresDSN(t, dsn, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	b := openPostgresDSN(t, dsn)
	if !strings.Contains(logs.String(), "state_vector_log") || !strings.Contains(logs.String(), "pgvector=") || a.pgvector == "" {
		t.Errorf("start-up log %q; want the vector index in use and what was found of pgvector", logs.String())
	}
	t.Logf("pgvector: %s", a.pgvector)
	s := scope.Session("log")
	data := vecsynth.New(22, 16, 4)
	vecs := map[string][]float32{}
	write := func(p *Postgres, key string) {
		t.Helper()
		vecs[key] = data.Next()
		if _, err := p.Write(ctx, s, key, str("value "+key), Guard{Embedding: vecs[key]}); err != nil {
			t.Fatal(err)
		}
	}
	find := func(p *Postgres, key string) bool {
		t.Helper()
		hits, err := p.VectorSearch(ctx, s, vecs[key], 1)
		if err != nil {
			t.Fatal(err)
		}
		return len(hits) == 1 && hits[0].Key == key
	}
	for i := range 50 {
		write(a, fmt.Sprintf("k%02d", i))
	}
	if !find(b, "k03") {
		t.Fatal("b does not find k03 at its first search")
	}
	write(a, "new")
	if !find(b, "new") {
		t.Fatal("b does not find a's new write")
	}
	// One log row is new; rows of transactions running at b's last read
	// are read again, which a quiet database does not have.
	if n := b.vectors.logRows; n < 1 || n >= 50 {
		t.Errorf("b's catch-up read %d log rows; want the one new row, not the scope", n)
	}

	// a writes again, then prunes every log row: b's last read is
	// behind the pruned log; it reloads and finds the write.
	write(a, "after")
	a.vectors.keep = 0
	if err := a.pruneVectorLog(ctx); err != nil {
		t.Fatal(err)
	}
	if !find(b, "after") {
		t.Error("b does not find a write whose log row was pruned")
	}
	if b.vectors.reloads != 1 {
		t.Errorf("b reloaded %d times; want 1", b.vectors.reloads)
	}
	if !find(b, "k10") {
		t.Error("b lost k10 in the reload")
	}
}
