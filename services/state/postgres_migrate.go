package state

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/secbear/neuron/pkg/errs"
)

// pgMigrations holds the schema of the PostgreSQL backend as numbered
// SQL files, NNNN_name.sql, applied in order and never edited once
// released: a change is a new file.
//
//go:embed migrations/*.sql
var pgMigrations embed.FS

// pgMigration is one schema version.
type pgMigration struct {
	version int
	name    string
	sql     string
}

// pgLoadMigrations reads the embedded migrations, sorted by version.
func pgLoadMigrations() ([]pgMigration, error) {
	files, err := fs.Glob(pgMigrations, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var out []pgMigration
	for _, f := range files {
		base := path.Base(f)
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: name must be NNNN_name.sql", base)
		}
		sql, err := pgMigrations.ReadFile(f)
		if err != nil {
			return nil, err
		}
		out = append(out, pgMigration{version: v, name: strings.TrimSuffix(base, ".sql"), sql: string(sql)})
	}
	slices.SortFunc(out, func(a, b pgMigration) int { return a.version - b.version })
	for i := 1; i < len(out); i++ {
		if out[i].version == out[i-1].version {
			return nil, fmt.Errorf("migrations %s and %s have the same version", out[i-1].name, out[i].name)
		}
	}
	return out, nil
}

// migrate brings the schema to the newest version and returns the page
// token secret, creating it on first use. Everything runs in one
// transaction under an advisory lock, so replicas starting together
// apply each migration once and all read the same secret; a failed
// migration leaves the database as it was.
func (p *Postgres) migrate(ctx context.Context) ([]byte, error) {
	migrations, err := pgLoadMigrations()
	if err != nil {
		return nil, err
	}
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return nil, p.dbError(ctx, "connect", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, pgMigrationLock); err != nil {
		return nil, p.dbError(ctx, "migrate", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    integer     PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, p.dbError(ctx, "migrate", err)
	}
	rows, err := tx.Query(ctx, `SELECT version FROM schema_migrations`)
	if err != nil {
		return nil, p.dbError(ctx, "migrate", err)
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, p.dbError(ctx, "migrate", err)
	}
	newest := migrations[len(migrations)-1].version
	for _, v := range applied {
		if int(v) > newest {
			return nil, fmt.Errorf("the database's state schema is at version %d, newer than this binary's %d; run a newer binary: %w", v, newest, errs.FailedPrecondition)
		}
	}
	for _, m := range migrations {
		if slices.Contains(applied, int32(m.version)) {
			continue
		}
		if _, err := tx.Exec(ctx, m.sql); err != nil {
			return nil, fmt.Errorf("migration %s: %w", m.name, p.dbError(ctx, "migrate", err))
		}
		if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, m.version, m.name); err != nil {
			return nil, p.dbError(ctx, "migrate", err)
		}
		p.opts.logger.Info("applied state schema migration", "migration", m.name)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO state_meta (name, value) VALUES ('page_token_secret', $1) ON CONFLICT (name) DO NOTHING`, pgNewSecret()); err != nil {
		return nil, p.dbError(ctx, "migrate", err)
	}
	var secret []byte
	if err := tx.QueryRow(ctx, `SELECT value FROM state_meta WHERE name = 'page_token_secret'`).Scan(&secret); err != nil {
		return nil, p.dbError(ctx, "migrate", err)
	}
	if len(secret) != tokenSecretLen {
		return nil, errors.New("state_meta holds a page token secret of the wrong size")
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, p.dbError(ctx, "migrate", err)
	}
	return secret, nil
}
