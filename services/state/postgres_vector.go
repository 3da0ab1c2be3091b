package state

import (
	"context"
	"hash/maphash"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
)

// Vector search on PostgreSQL, without pgvector (Debian ships none for
// PostgreSQL 15). Embeddings are stored in the database with their rows
// (state_items.embedding, written in the Write's transaction); the vector
// index is in each replica's memory (a vectorIndex, the bbolt backend's:
// exact below annMin vectors of a scope, HNSW above). A VectorSearch
// first brings its replica's copy of the scope up to the database:
//
//  1. it reads the scope's (key, revision) pairs of the rows that have
//     an embedding (an index-only scan of state_items_embedded; no
//     vectors travel);
//  2. it fetches the embeddings of the keys its copy lacks or holds at
//     another revision (revisions are store-wide and never reused, so an
//     equal revision is the same embedding), and drops the keys the
//     database no longer has;
//  3. it searches its copy.
//
// So a search sees every Write and Delete acknowledged before it started,
// by any replica (TestPostgresVectorReplicas), and a replica that
// restarts or first meets a scope fetches its embeddings then (a 100k x
// 768 scope moves about 300 MB and builds its graph on that first
// search). Syncing and searching a scope hold a lock of that scope's
// stripe, so an older snapshot never undoes a newer one.
//
// Trade-off: step 1 costs a scan of the scope's keys on every search
// (linear in the scope, without the vectors); a change-log table read
// from the last position seen would cost only the changes, and is the
// next step if scopes grow to hundreds of thousands of embedded keys.

// pgVecStripes is the number of scope lock stripes.
const pgVecStripes = 64

// pgVecFetch bounds the keys of one embedding fetch.
const pgVecFetch = 1000

// pgVectors is the PostgreSQL backend's in-process vector index.
type pgVectors struct {
	idx     *vectorIndex
	seed    maphash.Seed
	stripes [pgVecStripes]chanMutex
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
	v := &pgVectors{idx: newVectorIndex(), seed: maphash.MakeSeed()}
	for i := range v.stripes {
		v.stripes[i] = make(chanMutex, 1)
	}
	return v
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
	mu := p.vectors.stripes[maphash.Bytes(p.vectors.seed, enc)%pgVecStripes]
	if err := mu.lock(ctx); err != nil {
		return nil, err
	}
	ranked, err := func() ([]vecHit, error) {
		defer mu.unlock()
		if err := p.syncVectors(ctx, enc); err != nil {
			return nil, err
		}
		return p.vectors.idx.search(ctx, string(enc), q, limit)
	}()
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

// syncVectors brings the replica's copy of scope enc up to the database.
// The caller holds the scope's stripe lock.
func (p *Postgres) syncVectors(ctx context.Context, enc []byte) error {
	rows, err := p.pool.Query(ctx, `SELECT key, revision FROM state_items WHERE scope = $1 AND embedding IS NOT NULL`, enc)
	if err != nil {
		return p.dbError(ctx, "vector search", err)
	}
	current := map[string]uint64{}
	var (
		key []byte
		rev int64
	)
	for rows.Next() {
		if err := rows.Scan(&key, &rev); err != nil {
			rows.Close()
			return p.dbError(ctx, "vector search", err)
		}
		current[string(key)] = uint64(rev)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return p.dbError(ctx, "vector search", err)
	}
	need, gone := p.vectors.idx.diff(string(enc), current)
	for _, k := range gone {
		p.vectors.idx.set(string(enc), k, 0, nil)
	}
	for len(need) > 0 {
		batch := need[:min(len(need), pgVecFetch)]
		need = need[len(batch):]
		if err := p.fetchVectors(ctx, enc, batch); err != nil {
			return err
		}
	}
	return nil
}

// fetchVectors loads the embeddings of keys of scope enc into the copy.
func (p *Postgres) fetchVectors(ctx context.Context, enc []byte, keys [][]byte) error {
	rows, err := p.pool.Query(ctx, `SELECT key, revision, embedding FROM state_items
		WHERE scope = $1 AND key = ANY($2) AND embedding IS NOT NULL`, enc, keys)
	if err != nil {
		return p.dbError(ctx, "vector search", err)
	}
	defer rows.Close()
	var (
		key []byte
		rev int64
		raw []byte
	)
	seen := map[string]bool{}
	for rows.Next() {
		if err := rows.Scan(&key, &rev, &raw); err != nil {
			return p.dbError(ctx, "vector search", err)
		}
		seen[string(key)] = true
		vec, err := decodeVector(raw)
		if err != nil {
			p.opts.logger.Error("stored embedding unreadable; the key is left out of vector search", "key", truncate(string(key)), "err", err)
			p.vectors.idx.set(string(enc), string(key), 0, nil)
			continue
		}
		p.vectors.idx.set(string(enc), string(key), uint64(rev), vec)
	}
	if err := rows.Err(); err != nil {
		return p.dbError(ctx, "vector search", err)
	}
	// Keys deleted (or written without an embedding) since the list was
	// read: drop them too.
	for _, k := range keys {
		if !seen[string(k)] {
			p.vectors.idx.set(string(enc), string(k), 0, nil)
		}
	}
	return nil
}
