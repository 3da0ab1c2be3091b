package state

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Retention on PostgreSQL. The sweeper's notes are kept in state_meta
// (name 'retention_marks', the bbolt backend's encoding), shared by the
// replicas: each replica runs its own sweeper, every deletion is a
// compare-and-set Delete, so two sweepers deleting the same key cannot
// remove a newer write, and the vector change log's trigger records the
// deletion for every replica's index, as for a client's Delete.

// pgRetentionMarks is the state_meta name of the sweeper's notes.
const pgRetentionMarks = "retention_marks"

// retentionScan implements retentionStore: the revision sequence, then
// every row's scope, key and revision, in one REPEATABLE READ snapshot.
// The sequence is read first and is not transactional: a revision taken
// by a transaction that commits after the read counts as written at the
// sweep's time, up to that transaction's duration early.
func (p *Postgres) retentionScan(ctx context.Context, fn func(enc []byte, key string, rev uint64)) (uint64, error) {
	if p.closed.Load() {
		return 0, errClosed
	}
	tx, err := p.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return 0, p.dbError(ctx, "retention scan", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var (
		last   int64
		called bool
	)
	if err := tx.QueryRow(ctx, `SELECT last_value, is_called FROM state_revision`).Scan(&last, &called); err != nil {
		return 0, p.dbError(ctx, "retention scan", err)
	}
	if !called {
		last = 0
	}
	rows, err := tx.Query(ctx, `SELECT scope, key, revision FROM state_items`)
	if err != nil {
		return 0, p.dbError(ctx, "retention scan", err)
	}
	var (
		enc, key []byte
		rev      int64
	)
	_, err = pgx.ForEachRow(rows, []any{&enc, &key, &rev}, func() error {
		fn(enc, string(key), uint64(rev))
		return nil
	})
	if err != nil {
		return 0, p.dbError(ctx, "retention scan", err)
	}
	return uint64(last), nil
}

// loadMarks implements retentionStore.
func (p *Postgres) loadMarks() ([]retentionMark, error) {
	ctx := context.Background()
	var raw []byte
	err := p.pool.QueryRow(ctx, `SELECT value FROM state_meta WHERE name = $1`, pgRetentionMarks).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, p.dbError(ctx, "read retention marks", err)
	}
	if len(raw)%16 != 0 {
		return nil, fmt.Errorf("state_meta %s is %d bytes, not a multiple of 16", pgRetentionMarks, len(raw))
	}
	var marks []retentionMark
	for i := 0; i < len(raw); i += 16 {
		marks = append(marks, retentionMark{
			at:  time.Unix(0, int64(binary.BigEndian.Uint64(raw[i:]))),
			rev: binary.BigEndian.Uint64(raw[i+8:]),
		})
	}
	return marks, nil
}

// saveMarks implements retentionStore.
func (p *Postgres) saveMarks(marks []retentionMark) error {
	ctx := context.Background()
	raw := make([]byte, 0, 16*len(marks))
	for _, m := range marks {
		raw = binary.BigEndian.AppendUint64(raw, uint64(m.at.UnixNano()))
		raw = binary.BigEndian.AppendUint64(raw, m.rev)
	}
	_, err := p.pool.Exec(ctx, `INSERT INTO state_meta (name, value) VALUES ($1, $2)
		ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value`, pgRetentionMarks, raw)
	if err != nil {
		return p.dbError(ctx, "save retention marks", err)
	}
	return nil
}
