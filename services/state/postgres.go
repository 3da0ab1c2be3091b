package state

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/types/known/structpb"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
)

// Postgres is a Backend on PostgreSQL, for running several replicas of
// the state service over one database. It has the semantics of the bbolt
// backend (the shared backend suite checks it), with these mechanisms:
//
//   - Revisions come from one sequence (state_revision), taken with
//     nextval while the key is locked, so a key's revisions strictly
//     increase across replicas and are never reused.
//   - Every Write and Delete is one transaction that first takes
//     transaction-scoped advisory locks on the key and on its idempotency
//     key (in a fixed order, so two mutations cannot deadlock), then reads
//     the idempotency record and the key's row (SELECT ... FOR UPDATE),
//     checks Guard.ExpectedRevision, writes the row and the idempotency
//     record, and commits. The advisory lock also covers keys that do not
//     exist yet, which a row lock cannot, so two replicas writing "must
//     not exist" cannot both win and a compare-and-set never loses an
//     update. The decision logic is apply (apply.go), shared with the
//     other backends.
//   - List is keyset pagination over the primary key (scope, key), both
//     bytea, so the order is byte order; page tokens are signed with a
//     secret kept in the database (state_meta), so every replica accepts
//     the tokens of the others.
//   - Search is PostgreSQL full-text search: a tsvector column generated
//     from the value's text (English) and the key's words (both empty,
//     and the row's indexed column false, for an unindexed value), a GIN
//     index,
//     an OR of the query's words (websearch_to_tsquery) ranked with
//     ts_rank; snippets are cut by the shared snippet code around the
//     matches ts_headline marks.
//   - Idempotency records carry their creation time (from the Option
//     clock); a record older than the retention is ignored and pruned by
//     later writes, at most once a second per replica, in batches.
//   - Connection failures are errs.Unavailable; a failed commit is
//     Unavailable too, and its outcome unknown: retry with an idempotency
//     key.
//
// The schema is created and upgraded by OpenPostgres (migrations/*.sql,
// recorded in schema_migrations). Known limit: PostgreSQL's btree holds
// index entries of at most about 2.7 KB, so a key whose scope and bytes
// do not compress under that fails with InvalidArgument even below
// Limits.MaxKeyBytes.
type Postgres struct {
	core
	pool   *pgxpool.Pool
	closed atomic.Bool

	pruneMu   sync.Mutex
	lastPrune time.Time // by the Option clock

	// vectors is this replica's vector index (postgres_vector.go).
	vectors *pgVectors
	// pgvector says what OpenPostgres found of the pgvector extension.
	pgvector string
}

var _ Backend = (*Postgres)(nil)

// Tuning of the PostgreSQL backend.
const (
	// pgMigrationLock is the advisory lock key held while migrating.
	pgMigrationLock int64 = 0x6e6575726f6e5301
	// pgMaxAttempts bounds the tries of a mutation that PostgreSQL
	// aborted for a deadlock or a serialization failure.
	pgMaxAttempts = 5
	// pgPruneInterval is how often a replica prunes idempotency records.
	pgPruneInterval = time.Second
	// pgPruneBatch bounds the records one prune deletes.
	pgPruneBatch = 1000
	// pgMarkStart and pgMarkStop delimit matches in ts_headline output.
	pgMarkStart = "\uE000"
	pgMarkStop  = "\uE001"
)

// OpenPostgres connects to the database at dsn (a libpq connection
// string or postgres:// URL, with pgxpool's pool_* settings), creates or
// upgrades the schema, and returns the store. Several replicas may open
// the same database at once: migrations run in one transaction under an
// advisory lock. The pool is closed by Close.
//
// A malformed dsn is errs.InvalidArgument; an unreachable server is
// errs.Unavailable; a database whose schema is newer than this binary is
// errs.FailedPrecondition.
func OpenPostgres(ctx context.Context, dsn string, opts ...Option) (*Postgres, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// The message of a parse error never repeats the password.
		return nil, fmt.Errorf("postgres dsn: %v: %w", err, errs.InvalidArgument)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %v: %w", err, errs.InvalidArgument)
	}
	p := &Postgres{core: core{opts: applyOptions(opts)}, pool: pool, vectors: newPgVectors()}
	secret, err := p.migrate(ctx)
	if err != nil {
		pool.Close()
		return nil, err
	}
	p.tokens = tokenSigner{secret: secret}
	pgv, err := p.pgvectorStatus(ctx)
	if err != nil {
		pool.Close()
		return nil, err
	}
	p.pgvector = pgv
	p.opts.logger.Info("vector search: an index in each replica's memory (exact, HNSW from 4096 vectors a scope), caught up from state_vector_log",
		"pgvector", pgv)
	return p, nil
}

// Read implements Backend.
func (p *Postgres) Read(ctx context.Context, s *typesv1.Scope, key string) (Item, error) {
	enc, err := p.target(ctx, s, key)
	if err != nil {
		return Item{}, err
	}
	if p.closed.Load() {
		return Item{}, errClosed
	}
	var (
		raw []byte
		rev int64
	)
	err = p.pool.QueryRow(ctx, `SELECT value, revision FROM state_items WHERE scope = $1 AND key = $2`, enc, []byte(key)).Scan(&raw, &rev)
	if errors.Is(err, pgx.ErrNoRows) {
		return Item{}, notFound(s, key)
	}
	if err != nil {
		return Item{}, p.dbError(ctx, "read", err)
	}
	v, err := unmarshalValue(raw)
	if err != nil {
		return Item{}, err
	}
	return Item{Value: v, Revision: uint64(rev)}, nil
}

// Write implements Backend.
func (p *Postgres) Write(ctx context.Context, s *typesv1.Scope, key string, v *structpb.Value, g Guard) (WriteResult, error) {
	mu, err := p.prepareWrite(ctx, s, key, v, g)
	if err != nil {
		return WriteResult{}, err
	}
	body := ""
	if !g.Unindexed {
		body = pgText(valueText(v))
	}
	out, err := p.mutate(ctx, mu, body)
	if err != nil {
		return WriteResult{}, err
	}
	return WriteResult{Revision: out.revision, Replayed: out.replayed}, nil
}

// Delete implements Backend.
func (p *Postgres) Delete(ctx context.Context, s *typesv1.Scope, key string, g Guard) (DeleteResult, error) {
	mu, err := p.prepareDelete(ctx, s, key, g)
	if err != nil {
		return DeleteResult{}, err
	}
	out, err := p.mutate(ctx, mu, "")
	if err != nil {
		return DeleteResult{}, err
	}
	return DeleteResult{Existed: out.existed, Replayed: out.replayed}, nil
}

// mutate runs mu in a transaction, retrying deadlocks and serialization
// failures. body is the searchable text of a Write's value.
func (p *Postgres) mutate(ctx context.Context, mu *mutation, body string) (outcome, error) {
	if p.closed.Load() {
		return outcome{}, errClosed
	}
	p.prune(ctx, mu.now)
	for attempt := 1; ; attempt++ {
		out, err := p.mutateOnce(ctx, mu, body)
		if err == nil {
			return out, nil
		}
		var k *errs.Kind
		if errors.As(err, &k) {
			return outcome{}, err
		}
		if attempt < pgMaxAttempts && pgRetryable(err) && ctx.Err() == nil {
			continue
		}
		return outcome{}, p.dbError(ctx, "write", err)
	}
}

// mutateOnce is one attempt of mutate.
func (p *Postgres) mutateOnce(ctx context.Context, mu *mutation, body string) (outcome, error) {
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return outcome{}, err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	locks := []int64{pgLockID('k', mu.ck())}
	if mu.guard.IdempotencyKey != "" {
		locks = append(locks, pgLockID('i', mu.ik()))
	}
	slices.Sort(locks) // one global order: no deadlock between mutations
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(k) FROM unnest($1::bigint[]) AS k`, locks); err != nil {
		return outcome{}, err
	}
	out, err := apply(&pgTxn{ctx: ctx, tx: tx, body: body}, mu, p.opts.retention)
	if err != nil {
		return outcome{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return outcome{}, err
	}
	return out, nil
}

// prune deletes a batch of expired idempotency records, at most once per
// pgPruneInterval per replica. It runs in its own statement, outside any
// mutation, and skips rows other transactions hold, so it never waits
// and cannot deadlock with a mutation. A failure is only logged.
func (p *Postgres) prune(ctx context.Context, now time.Time) {
	p.pruneMu.Lock()
	due := p.lastPrune.IsZero() || now.Sub(p.lastPrune) >= pgPruneInterval || now.Before(p.lastPrune)
	if due {
		p.lastPrune = now
	}
	p.pruneMu.Unlock()
	if !due {
		return
	}
	cut := now.Add(-p.opts.retention)
	_, err := p.pool.Exec(ctx, `DELETE FROM state_idempotency WHERE created_at <= $1 AND id IN (
		SELECT id FROM state_idempotency WHERE created_at <= $1 ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED)`, cut, pgPruneBatch)
	if err != nil && ctx.Err() == nil {
		p.opts.logger.Warn("pruning idempotency records failed", "error", err)
	}
	if err := p.pruneVectorLog(ctx); err != nil && ctx.Err() == nil {
		p.opts.logger.Warn("pruning the vector change log failed", "error", err)
	}
}

// List implements Backend.
func (p *Postgres) List(ctx context.Context, s *typesv1.Scope, prefix, pageToken string, pageSize int) (ListPage, error) {
	return p.Scan(ctx, s, ListQuery{Prefix: prefix, PageToken: pageToken, PageSize: pageSize})
}

// Scan implements Backend. The page comes from one statement.
func (p *Postgres) Scan(ctx context.Context, s *typesv1.Scope, q ListQuery) (ListPage, error) {
	enc, after, hasAfter, err := p.listStart(ctx, s, q)
	if err != nil {
		return ListPage{}, err
	}
	if p.closed.Load() {
		return ListPage{}, errClosed
	}
	// The page starts at the prefix (reversed: at its end), or strictly
	// after (reversed: before) the token's key, which has the prefix, and
	// stays within the keys with the prefix.
	cols := `key, revision`
	if q.Values {
		cols += `, value`
	}
	sql := `SELECT ` + cols + ` FROM state_items WHERE scope = $1 AND key >= $2`
	args := []any{enc, []byte(q.Prefix)}
	end := pgPrefixEnd([]byte(q.Prefix))
	switch {
	case !q.Reverse && hasAfter:
		sql = `SELECT ` + cols + ` FROM state_items WHERE scope = $1 AND key > $2`
		args[1] = []byte(after)
	case hasAfter:
		end = []byte(after)
	}
	if end != nil {
		sql += ` AND key < $3`
		args = append(args, end)
	}
	order := `key`
	if q.Reverse {
		order = `key DESC`
	}
	sql += fmt.Sprintf(` ORDER BY %s LIMIT %d`, order, q.PageSize+1)
	rows, err := p.pool.Query(ctx, sql, args...)
	if err != nil {
		return ListPage{}, p.dbError(ctx, "list", err)
	}
	defer rows.Close()
	var (
		pg  = &pager{q: q}
		key []byte
		rev int64
		raw []byte
	)
	dest := []any{&key, &rev}
	if q.Values {
		dest = append(dest, &raw)
	}
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return ListPage{}, p.dbError(ctx, "list", err)
		}
		ok, err := pg.add(string(key), uint64(rev), raw)
		if err != nil {
			return ListPage{}, err
		}
		if !ok {
			break
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return ListPage{}, p.dbError(ctx, "list", err)
	}
	return p.finishPage(enc, pg), nil
}

// Search implements Backend.
func (p *Postgres) Search(ctx context.Context, s *typesv1.Scope, query string, limit int) ([]SearchHit, error) {
	enc, err := p.scopeOnly(ctx, s)
	if err != nil {
		return nil, err
	}
	if err := checkSearch(query, limit); err != nil {
		return nil, err
	}
	if p.closed.Load() {
		return nil, errClosed
	}
	terms := pgTerms(query)
	if len(terms) == 0 {
		return nil, nil
	}
	if !snippetsWanted(ctx) {
		return p.searchRanked(ctx, enc, terms, limit)
	}
	// Any of the words matches (as the other backends' queries do); the
	// words are letters and digits only, so websearch syntax cannot
	// reach them. The inner query ranks and limits; ts_headline marks
	// the matches of the hits only.
	rows, err := p.pool.Query(ctx, `
		SELECT key, revision, body, rank, ts_headline('english'::regconfig, body, q, $4)
		FROM (
			SELECT key, revision, body, ts_rank(search, q) AS rank, q
			FROM state_items, websearch_to_tsquery('english'::regconfig, $2) AS q
			WHERE scope = $1 AND indexed AND search @@ q
			ORDER BY rank DESC, key
			LIMIT $3
		) AS hits
		ORDER BY rank DESC, key`,
		enc, strings.Join(terms, " or "), limit,
		fmt.Sprintf(`HighlightAll=true, StartSel="%s", StopSel="%s"`, pgMarkStart, pgMarkStop))
	if err != nil {
		return nil, p.dbError(ctx, "search", err)
	}
	var (
		hits   []SearchHit
		key    []byte
		rev    int64
		body   string
		rank   float32
		marked string
	)
	_, err = pgx.ForEachRow(rows, []any{&key, &rev, &body, &rank, &marked}, func() error {
		hits = append(hits, SearchHit{
			Key:      string(key),
			Score:    float64(rank),
			Snippet:  snippet(body, pgMatchSpans(body, marked, terms)),
			Revision: uint64(rev),
		})
		return nil
	})
	if err != nil {
		return nil, p.dbError(ctx, "search", err)
	}
	return hits, nil
}

// searchRanked is Search without snippets (neither the body nor
// ts_headline is read).
func (p *Postgres) searchRanked(ctx context.Context, enc []byte, terms []string, limit int) ([]SearchHit, error) {
	rows, err := p.pool.Query(ctx, `
		SELECT key, revision, ts_rank(search, q) AS rank
		FROM state_items, websearch_to_tsquery('english'::regconfig, $2) AS q
		WHERE scope = $1 AND indexed AND search @@ q
		ORDER BY rank DESC, key
		LIMIT $3`,
		enc, strings.Join(terms, " or "), limit)
	if err != nil {
		return nil, p.dbError(ctx, "search", err)
	}
	var (
		hits []SearchHit
		key  []byte
		rev  int64
		rank float32
	)
	_, err = pgx.ForEachRow(rows, []any{&key, &rev, &rank}, func() error {
		hits = append(hits, SearchHit{Key: string(key), Score: float64(rank), Revision: uint64(rev)})
		return nil
	})
	if err != nil {
		return nil, p.dbError(ctx, "search", err)
	}
	return hits, nil
}

// snippets implements snippetBackend: ts_headline marks the matches of
// the matched keys, as Search does; the others' snippets start at the
// start of the value.
func (p *Postgres) snippets(ctx context.Context, s *typesv1.Scope, query string, keys []string, matched map[string]bool) (map[string]string, error) {
	enc, err := p.scopeOnly(ctx, s)
	if err != nil {
		return nil, err
	}
	if p.closed.Load() {
		return nil, errClosed
	}
	terms := pgTerms(query)
	var withMatches, plain [][]byte
	for _, k := range keys {
		if matched[k] && len(terms) > 0 {
			withMatches = append(withMatches, []byte(k))
		} else {
			plain = append(plain, []byte(k))
		}
	}
	out := make(map[string]string, len(keys))
	var (
		key    []byte
		body   string
		marked string
	)
	if len(withMatches) > 0 {
		rows, err := p.pool.Query(ctx, `
			SELECT key, body, ts_headline('english'::regconfig, body, websearch_to_tsquery('english'::regconfig, $3), $4)
			FROM state_items WHERE scope = $1 AND key = ANY($2)`,
			enc, withMatches, strings.Join(terms, " or "),
			fmt.Sprintf(`HighlightAll=true, StartSel="%s", StopSel="%s"`, pgMarkStart, pgMarkStop))
		if err != nil {
			return nil, p.dbError(ctx, "search snippets", err)
		}
		_, err = pgx.ForEachRow(rows, []any{&key, &body, &marked}, func() error {
			out[string(key)] = snippet(body, pgMatchSpans(body, marked, terms))
			return nil
		})
		if err != nil {
			return nil, p.dbError(ctx, "search snippets", err)
		}
	}
	if len(plain) > 0 {
		rows, err := p.pool.Query(ctx, `SELECT key, body FROM state_items WHERE scope = $1 AND key = ANY($2)`, enc, plain)
		if err != nil {
			return nil, p.dbError(ctx, "search snippets", err)
		}
		_, err = pgx.ForEachRow(rows, []any{&key, &body}, func() error {
			out[string(key)] = snippet(body, nil)
			return nil
		})
		if err != nil {
			return nil, p.dbError(ctx, "search snippets", err)
		}
	}
	return out, nil
}

// Close implements Backend: it closes the pool, waiting for calls in
// flight to release their connections.
func (p *Postgres) Close() error {
	if p.closed.Swap(true) {
		return nil
	}
	p.pool.Close()
	p.vectors.close()
	return nil
}

// dbError classifies an error of the database: kinds pass through, a
// closed store is errClosed, a done context stays a context error, a
// dropped connection or a server that is shutting down or full is
// Unavailable, and anything else (a bug or a schema problem) is an
// internal error.
func (p *Postgres) dbError(ctx context.Context, op string, err error) error {
	var k *errs.Kind
	if errors.As(err, &k) {
		return err
	}
	if p.closed.Load() {
		return errClosed
	}
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("postgres %s: %w", op, cerr)
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		// Whatever the server said: it did not let us in.
		return fmt.Errorf("postgres %s: %v: %w", op, err, errs.Unavailable)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		// Errors that do not come from the server are the connection's:
		// refused, reset, timed out, closed.
		return fmt.Errorf("postgres %s: %v: %w", op, err, errs.Unavailable)
	}
	switch {
	case pgErr.Code == "53100": // disk_full
		return fmt.Errorf("postgres %s: the database server's disk is full, nothing was written (%s); retry once space is freed: %w", op, pgErr.Message, errs.StorageFull)
	case strings.HasPrefix(pgErr.Code, "08"), // connection exception
		strings.HasPrefix(pgErr.Code, "53"),                                 // insufficient resources
		pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03", // shutdown, cannot connect now
		pgErr.Code == "40001", pgErr.Code == "40P01": // still conflicting after retries
		return fmt.Errorf("postgres %s: %s: %w", op, pgErr.Message, errs.Unavailable)
	case pgErr.Code == "54000": // program_limit_exceeded: index row too large
		return fmt.Errorf("key and scope are too large for the PostgreSQL index (%s); use a shorter key: %w", pgErr.Message, errs.InvalidArgument)
	}
	return fmt.Errorf("postgres %s: %w", op, err)
}

// pgRetryable reports a transaction PostgreSQL aborted that a rerun may
// complete: a deadlock or a serialization failure.
func pgRetryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// pgLockID is the advisory lock key of a state key (kind 'k') or an
// idempotency key (kind 'i'): 64 bits of a hash, so that unrelated keys
// collide only by accident, which merely serialises them.
func pgLockID(kind byte, id []byte) int64 {
	h := sha256.New()
	h.Write([]byte{kind})
	h.Write(id)
	return int64(binary.BigEndian.Uint64(h.Sum(nil)))
}

// pgPrefixEnd returns the smallest byte string greater than every string
// with prefix, or nil when there is none (an empty or all-0xff prefix).
func pgPrefixEnd(prefix []byte) []byte {
	for i := len(prefix) - 1; i >= 0; i-- {
		if prefix[i] < 0xff {
			end := slices.Clone(prefix[:i+1])
			end[i]++
			return end
		}
	}
	return nil
}

// pgText makes text storable in a text column, which cannot hold NUL.
func pgText(s string) string { return strings.ReplaceAll(s, "\x00", " ") }

// pgKeyWords is the searchable text of a key: its words, so that a key
// like "doc/quantum" is found by "quantum" (PostgreSQL's parser would
// read it as one file-path token).
func pgKeyWords(key string) string {
	toks := tokenize(key)
	words := make([]string, len(toks))
	for i, t := range toks {
		words[i] = t.term
	}
	return strings.Join(words, " ")
}

// pgTerms returns the distinct words of a query, without "or", which
// websearch_to_tsquery reads as an operator.
func pgTerms(query string) []string {
	var terms []string
	for _, t := range tokenize(query) {
		if t.term != "or" && !slices.Contains(terms, t.term) {
			terms = append(terms, t.term)
		}
	}
	return terms
}

// pgMatchSpans returns the byte ranges of body that ts_headline marked
// in marked. When the marked text is not body with marks (body holds the
// mark characters itself), it falls back to the words of body equal to
// a query term.
func pgMatchSpans(body, marked string, terms []string) []span {
	var (
		spans []span
		b     strings.Builder
		start = -1
	)
	b.Grow(len(body))
	for i := 0; i < len(marked); {
		switch {
		case strings.HasPrefix(marked[i:], pgMarkStart):
			start = b.Len()
			i += len(pgMarkStart)
		case strings.HasPrefix(marked[i:], pgMarkStop):
			if start >= 0 {
				spans = append(spans, span{start, b.Len()})
			}
			start = -1
			i += len(pgMarkStop)
		default:
			b.WriteByte(marked[i])
			i++
		}
	}
	if b.String() == body {
		return spans
	}
	spans = spans[:0]
	for _, t := range tokenize(body) {
		if slices.Contains(terms, t.term) {
			spans = append(spans, t.span)
		}
	}
	return spans
}

// pgTxn is the txn (apply.go) of one PostgreSQL transaction; the caller
// holds the advisory locks of the key and the idempotency key.
type pgTxn struct {
	ctx  context.Context
	tx   pgx.Tx
	body string // the searchable text of a Write's value
}

func (t *pgTxn) revision(ck []byte) (uint64, bool, error) {
	enc, key, err := splitKey(ck)
	if err != nil {
		return 0, false, err
	}
	var rev int64
	err = t.tx.QueryRow(t.ctx, `SELECT revision FROM state_items WHERE scope = $1 AND key = $2 FOR UPDATE`, enc, []byte(key)).Scan(&rev)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	return uint64(rev), true, nil
}

func (t *pgTxn) put(ck []byte, rev uint64, raw []byte, unindexed bool, vec []float32) error {
	enc, key, err := splitKey(ck)
	if err != nil {
		return err
	}
	body, words := t.body, ""
	if unindexed {
		body = "" // nothing of the value or the key reaches the search vector
	} else {
		words = pgKeyWords(key)
	}
	var embedding []byte // NULL: no embedding
	if vec != nil && !unindexed {
		embedding = encodeVector(vec)
	}
	_, err = t.tx.Exec(t.ctx, `INSERT INTO state_items (scope, key, value, revision, body, key_words, indexed, embedding)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
		ON CONFLICT (scope, key) DO UPDATE SET value = EXCLUDED.value, revision = EXCLUDED.revision,
			body = EXCLUDED.body, key_words = EXCLUDED.key_words, indexed = EXCLUDED.indexed, embedding = EXCLUDED.embedding`,
		enc, []byte(key), raw, int64(rev), body, words, !unindexed, embedding)
	return err
}

func (t *pgTxn) del(ck []byte, _ uint64) error {
	enc, key, err := splitKey(ck)
	if err != nil {
		return err
	}
	_, err = t.tx.Exec(t.ctx, `DELETE FROM state_items WHERE scope = $1 AND key = $2`, enc, []byte(key))
	return err
}

func (t *pgTxn) nextRevision() (uint64, error) {
	var n int64
	if err := t.tx.QueryRow(t.ctx, `SELECT nextval('state_revision')`).Scan(&n); err != nil {
		return 0, err
	}
	return uint64(n), nil
}

func (t *pgTxn) idem(ik []byte) (idemRecord, bool, error) {
	var (
		r   idemRecord
		op  int16
		fp  []byte
		rev int64
	)
	err := t.tx.QueryRow(t.ctx, `SELECT created_at, op, fingerprint, revision, existed FROM state_idempotency WHERE id = $1`, ik).
		Scan(&r.created, &op, &fp, &rev, &r.existed)
	if errors.Is(err, pgx.ErrNoRows) {
		return idemRecord{}, false, nil
	}
	if err != nil {
		return idemRecord{}, false, err
	}
	r.op, r.revision = opKind(op), uint64(rev)
	copy(r.fingerprint[:], fp)
	return r, true, nil
}

func (t *pgTxn) putIdem(ik []byte, r idemRecord, _ *idemRecord) error {
	_, err := t.tx.Exec(t.ctx, `INSERT INTO state_idempotency (id, created_at, op, fingerprint, revision, existed)
		VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (id) DO UPDATE SET created_at = EXCLUDED.created_at, op = EXCLUDED.op,
			fingerprint = EXCLUDED.fingerprint, revision = EXCLUDED.revision, existed = EXCLUDED.existed`,
		ik, r.created, int16(r.op), r.fingerprint[:], int64(r.revision), r.existed)
	return err
}

// pgNewSecret returns a fresh page token secret.
func pgNewSecret() []byte {
	secret := make([]byte, tokenSecretLen)
	_, _ = rand.Read(secret) // crypto/rand.Read never fails
	return secret
}
