package state

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
)

// Vector search on PostgreSQL, without pgvector (Debian ships none for
// PostgreSQL 15; OpenPostgres looks for it and logs which index is in
// use). Embeddings are stored in the database with their rows
// (state_items.embedding, written in the Write's transaction); the vector
// index is in each replica's memory (a vectorIndex, the bbolt backend's:
// exact below annMin vectors of a scope, HNSW above, built in the
// background). It is caught up from a change log, as the bbolt backend
// catches its bleve index up from its own:
//
//   - a trigger on state_items adds a row to state_vector_log (seq, the
//     writing transaction's xid, scope, key) for every change of a row
//     that has or had an embedding, in the changing transaction (so a
//     Write, a Delete and the retention sweeper alike);
//   - a VectorSearch first reads, in one REPEATABLE READ snapshot, the
//     log rows after the last seq its replica read, and those of
//     transactions that were still running at its last read (xid at or
//     above that snapshot's xmin: they may commit a seq below what it
//     saw), then fetches the current rows of the changed keys of the
//     scopes it holds (a key without a row or an embedding leaves the
//     index), and, the first time it meets a scope, loads that scope's
//     embeddings; the cost is the changes, not the scope;
//   - replicas prune log rows older than pgVecLogKeep (with the
//     idempotency records); a replica whose last read is below the pruned
//     seq (state_vector_log_horizon) drops its index and loads again.
//
// So a search sees every Write and Delete acknowledged before it started,
// by any replica (TestPostgresVectorReplicas, TestPostgresVectorLog). One
// catch-up runs at a time per replica; searches run concurrently.

// pgVecFetch bounds the keys of one embedding fetch.
const pgVecFetch = 1000

// pgVecLogKeep is how long change-log rows are kept.
const pgVecLogKeep = time.Hour

// pgVectors is the PostgreSQL backend's in-process vector index.
type pgVectors struct {
	mu chanMutex // held while catching up
	// The fields below are guarded by mu (idx is replaced on a reload).
	idx     *vectorIndex
	loaded  map[string]bool // encoded scopes whose embeddings are loaded
	started bool            // pos and xmin are set
	pos     int64           // the highest log seq read
	xmin    int64           // the xmin of the last read's snapshot
	// keep is how long log rows are kept (pgVecLogKeep; tests lower it).
	keep time.Duration
	// logRows (rows read by the last catch-up) and reloads are for tests.
	logRows, reloads int
}

// chanMutex is a mutex whose Lock gives up when ctx ends.
type chanMutex chan struct{}

func (m chanMutex) lock(ctx context.Context) error {
	select {
	case m <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (m chanMutex) unlock() { <-m }

func newPgVectors() *pgVectors {
	return &pgVectors{mu: make(chanMutex, 1), idx: newVectorIndex(), loaded: map[string]bool{}, keep: pgVecLogKeep}
}

// close stops the index's background builds.
func (v *pgVectors) close() {
	_ = v.mu.lock(context.Background())
	defer v.mu.unlock()
	v.idx.close()
}

// pgvectorStatus looks for the pgvector extension and returns what this
// backend uses, for the start-up log: this build keeps the index in each
// replica in every case (CREATE EXTENSION is never tried: it needs
// rights the service should not have, and fails where the extension is
// not installed on the server).
func (p *Postgres) pgvectorStatus(ctx context.Context) (string, error) {
	var installed, available *string
	err := p.pool.QueryRow(ctx, `SELECT
		(SELECT extversion FROM pg_extension WHERE extname = 'vector'),
		(SELECT default_version FROM pg_available_extensions WHERE name = 'vector')`).Scan(&installed, &available)
	if err != nil {
		return "", p.dbError(ctx, "detect pgvector", err)
	}
	switch {
	case installed != nil:
		return fmt.Sprintf("installed in the database (version %s) but not used: this build keeps the vector index in each replica", *installed), nil
	case available != nil:
		return fmt.Sprintf("available on the server (version %s), not installed in the database, not used", *available), nil
	}
	return "not available on this server (no vector extension)", nil
}

var _ VectorBackend = (*Postgres)(nil)

// VectorSearch implements VectorBackend.
func (p *Postgres) VectorSearch(ctx context.Context, s *typesv1.Scope, vec []float32, limit int) ([]SearchHit, error) {
	enc, err := p.scopeOnly(ctx, s)
	if err != nil {
		return nil, err
	}
	q, err := checkVectorSearch(vec, limit)
	if err != nil {
		return nil, err
	}
	if p.closed.Load() {
		return nil, errClosed
	}
	idx, err := p.catchUpVectors(ctx, enc)
	if err != nil {
		return nil, err
	}
	ranked, err := idx.search(ctx, string(enc), q, limit)
	if err != nil || len(ranked) == 0 {
		return nil, err
	}
	// Snippets from the current rows; a key deleted since is left out.
	keys := make([][]byte, len(ranked))
	for i, h := range ranked {
		keys[i] = []byte(h.key)
	}
	wantSnippets := snippetsWanted(ctx)
	sql := `SELECT key, body FROM state_items WHERE scope = $1 AND key = ANY($2)`
	if !wantSnippets {
		sql = `SELECT key, '' FROM state_items WHERE scope = $1 AND key = ANY($2)`
	}
	rows, err := p.pool.Query(ctx, sql, enc, keys)
	if err != nil {
		return nil, p.dbError(ctx, "vector search", err)
	}
	bodies := map[string]string{}
	var (
		key  []byte
		body string
	)
	for rows.Next() {
		if err := rows.Scan(&key, &body); err != nil {
			rows.Close()
			return nil, p.dbError(ctx, "vector search", err)
		}
		bodies[string(key)] = body
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, p.dbError(ctx, "vector search", err)
	}
	hits := make([]SearchHit, 0, len(ranked))
	for _, h := range ranked {
		b, ok := bodies[h.key]
		if !ok {
			continue
		}
		hit := SearchHit{Key: h.key, Score: float64(h.score), Revision: h.rev}
		if wantSnippets {
			hit.Snippet = snippet(b, nil)
		}
		hits = append(hits, hit)
	}
	return hits, nil
}

// catchUpVectors brings the replica's index up to the database's
// change log, loading scope enc if the index does not hold it yet, and
// returns the index.
func (p *Postgres) catchUpVectors(ctx context.Context, enc []byte) (*vectorIndex, error) {
	v := p.vectors
	if err := v.mu.lock(ctx); err != nil {
		return nil, err
	}
	defer v.mu.unlock()
	tx, err := p.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, p.dbError(ctx, "vector search", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var xmin, pruned, last int64
	err = tx.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint,
		(SELECT pruned_upto FROM state_vector_log_horizon), (SELECT coalesce(max(seq), 0) FROM state_vector_log)`).Scan(&xmin, &pruned, &last)
	if err != nil {
		return nil, p.dbError(ctx, "vector search", err)
	}
	if !v.started || pruned > v.pos {
		// Start (again) from this snapshot: the scopes load from it.
		if v.started {
			p.opts.logger.Warn("vector index reloads: the change log was pruned past this replica's last read", "last_read", v.pos, "pruned_upto", pruned)
			old := v.idx
			v.idx = newVectorIndex()
			v.idx.annMin = old.annMin
			old.close()
			v.loaded = map[string]bool{}
			v.reloads++
		}
		v.started = true
	} else if err := p.readVectorLog(ctx, tx, &last); err != nil {
		return nil, err
	}
	if !v.loaded[string(enc)] {
		if err := p.loadVectorScope(ctx, tx, enc); err != nil {
			return nil, err
		}
		v.loaded[string(enc)] = true
	}
	v.pos, v.xmin = max(v.pos, last), xmin
	return v.idx, nil
}

// readVectorLog applies the log rows after the last seq read, and those
// of transactions running at the last read, to the loaded scopes; *last
// becomes the highest seq read.
func (p *Postgres) readVectorLog(ctx context.Context, tx pgx.Tx, last *int64) error {
	v := p.vectors
	rows, err := tx.Query(ctx, `SELECT seq, scope, key FROM state_vector_log
		WHERE seq > $1 OR xid >= ($2::bigint)::text::xid8`, v.pos, v.xmin)
	if err != nil {
		return p.dbError(ctx, "vector search", err)
	}
	var (
		seq        int64
		scope, key []byte
		scopes     [][]byte
		keys       [][]byte
		seen       = map[string]bool{}
	)
	*last = v.pos
	v.logRows = 0
	_, err = pgx.ForEachRow(rows, []any{&seq, &scope, &key}, func() error {
		v.logRows++
		*last = max(*last, seq)
		ck := string(scope) + "\x00" + string(key)
		if v.loaded[string(scope)] && !seen[ck] {
			seen[ck] = true
			scopes, keys = append(scopes, bytes.Clone(scope)), append(keys, bytes.Clone(key))
		}
		return nil
	})
	if err != nil {
		return p.dbError(ctx, "vector search", err)
	}
	for len(keys) > 0 {
		n := min(len(keys), pgVecFetch)
		if err := p.refreshVectors(ctx, tx, scopes[:n], keys[:n]); err != nil {
			return err
		}
		scopes, keys = scopes[n:], keys[n:]
	}
	return nil
}

// refreshVectors sets the index's entries of the keys (scopes[i],
// keys[i]) to their current rows: a key without a row or an embedding
// leaves the index.
func (p *Postgres) refreshVectors(ctx context.Context, tx pgx.Tx, scopes, keys [][]byte) error {
	rows, err := tx.Query(ctx, `SELECT c.scope, c.key, i.revision, i.embedding
		FROM unnest($1::bytea[], $2::bytea[]) AS c(scope, key)
		LEFT JOIN state_items i ON i.scope = c.scope AND i.key = c.key`, scopes, keys)
	if err != nil {
		return p.dbError(ctx, "vector search", err)
	}
	var (
		scope, key []byte
		rev        *int64
		raw        []byte
	)
	_, err = pgx.ForEachRow(rows, []any{&scope, &key, &rev, &raw}, func() error {
		p.setVector(scope, key, rev, raw)
		return nil
	})
	if err != nil {
		return p.dbError(ctx, "vector search", err)
	}
	return nil
}

// loadVectorScope loads every embedding of scope enc into the index.
func (p *Postgres) loadVectorScope(ctx context.Context, tx pgx.Tx, enc []byte) error {
	rows, err := tx.Query(ctx, `SELECT key, revision, embedding FROM state_items WHERE scope = $1 AND embedding IS NOT NULL`, enc)
	if err != nil {
		return p.dbError(ctx, "vector search", err)
	}
	var (
		key []byte
		rev *int64
		raw []byte
	)
	_, err = pgx.ForEachRow(rows, []any{&key, &rev, &raw}, func() error {
		p.setVector(enc, key, rev, raw)
		return nil
	})
	if err != nil {
		return p.dbError(ctx, "vector search", err)
	}
	return nil
}

// setVector sets key's entry in the index from its row (rev nil: no row;
// raw nil: no embedding).
func (p *Postgres) setVector(enc, key []byte, rev *int64, raw []byte) {
	idx := p.vectors.idx
	if rev == nil || raw == nil {
		idx.set(string(enc), string(key), 0, nil)
		return
	}
	vec, err := decodeVector(raw)
	if err != nil {
		p.opts.logger.Error("stored embedding unreadable; the key is left out of vector search", "key", truncate(string(key)), "err", err)
		idx.set(string(enc), string(key), 0, nil)
		return
	}
	idx.set(string(enc), string(key), uint64(*rev), vec)
}

// pruneVectorLog deletes a batch of change-log rows older than the
// keep time and raises the pruned horizon past them.
func (p *Postgres) pruneVectorLog(ctx context.Context) error {
	_, err := p.pool.Exec(ctx, `WITH d AS (
			DELETE FROM state_vector_log WHERE seq IN (
				SELECT seq FROM state_vector_log WHERE at <= now() - make_interval(secs => $1)
				ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED)
			RETURNING seq)
		UPDATE state_vector_log_horizon SET pruned_upto = greatest(pruned_upto, (SELECT max(seq) FROM d))
		WHERE id = 1 AND EXISTS (SELECT 1 FROM d)`, p.vectors.keep.Seconds(), pgPruneBatch)
	return err
}
