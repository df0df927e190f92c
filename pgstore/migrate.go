package pgstore

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"slices"

	"github.com/archlab/idempotency"
)

// migrations are applied in file name order; version n is the n-th file.
// A released file is never edited: changes come as a new file.
//
//go:embed migrations/*.sql
var migrations embed.FS

// Migrate brings the schema to the latest version. It is idempotent and
// safe to run from several processes at once: each migration runs in its
// own transaction, under transaction advisory locks on the schema's and
// the table's names, after re-reading the version under them.
func (s *Store) Migrate(ctx context.Context) error {
	steps, err := s.migrationSteps()
	if err != nil {
		return err
	}
	for {
		done, err := s.migrateOne(ctx, steps)
		if err != nil {
			return fmt.Errorf("pgstore: migrate: %w: %w", idempotency.ErrUnavailable, err)
		}
		if done {
			return nil
		}
	}
}

// SchemaVersion returns the version the schema was migrated to (0: never)
// and the latest version this package knows.
func (s *Store) SchemaVersion(ctx context.Context) (current, latest int, err error) {
	steps, err := s.migrationSteps()
	if err != nil {
		return 0, 0, err
	}
	var exists bool
	err = s.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", s.names.Replace("{{versions}}")).Scan(&exists)
	if err == nil && exists {
		err = s.pool.QueryRow(ctx, s.names.Replace("SELECT coalesce(max(version), 0) FROM {{versions}}")).Scan(&current)
	}
	if err != nil {
		return 0, len(steps), fmt.Errorf("pgstore: schema version: %w: %w", idempotency.ErrUnavailable, err)
	}
	return current, len(steps), nil
}

func (s *Store) migrationSteps() ([]string, error) {
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	steps := make([]string, len(names))
	for i, name := range names {
		b, err := migrations.ReadFile(name)
		if err != nil {
			return nil, err
		}
		steps[i] = s.names.Replace(string(b))
	}
	return steps, nil
}

// migrateOne applies the next migration, if any, in one transaction, and
// reports whether the schema is at the latest version.
func (s *Store) migrateOne(ctx context.Context, steps []string) (done bool, err error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, tx.Rollback(context.WithoutCancel(ctx)))
		}
	}()
	// The schema's lock first: stores with other tables in the same schema
	// take it too, so that only one of them creates a missing schema (two
	// CREATE SCHEMA at once fail on pg_namespace's unique index).
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", advisoryKey(s.schema, "")); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", s.lockKey); err != nil {
		return false, err
	}
	// CREATE SCHEMA IF NOT EXISTS checks the CREATE privilege on the
	// database even when the schema exists; ask first so that a role that
	// owns only its schema can migrate.
	var missing bool
	if err := tx.QueryRow(ctx, "SELECT to_regnamespace($1) IS NULL", s.schema).Scan(&missing); err != nil {
		return false, err
	}
	if missing {
		if _, err := tx.Exec(ctx, s.names.Replace("CREATE SCHEMA {{schema}}")); err != nil {
			return false, err
		}
	}
	// Likewise CREATE TABLE IF NOT EXISTS checks CREATE on the schema: an
	// application role that may only use the migrated schema must still be
	// able to run Migrate at startup.
	if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NULL", s.names.Replace("{{versions}}")).Scan(&missing); err != nil {
		return false, err
	}
	if missing {
		if _, err := tx.Exec(ctx, s.names.Replace(`CREATE TABLE {{versions}} (
		version    integer     PRIMARY KEY,
		applied_at timestamptz NOT NULL DEFAULT now())`)); err != nil {
			return false, err
		}
	}
	var current int
	if err := tx.QueryRow(ctx, s.names.Replace("SELECT coalesce(max(version), 0) FROM {{versions}}")).Scan(&current); err != nil {
		return false, err
	}
	if current < len(steps) {
		// No arguments: pgx sends it with the simple protocol, which runs
		// several statements.
		if _, err := tx.Exec(ctx, steps[current]); err != nil {
			return false, fmt.Errorf("migration %d: %w", current+1, err)
		}
		if _, err := tx.Exec(ctx, s.names.Replace("INSERT INTO {{versions}} (version) VALUES ($1)"), current+1); err != nil {
			return false, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return false, err
	}
	return current+1 >= len(steps), nil
}

// advisoryKey names the table, or with table "" the schema, for
// pg_advisory_xact_lock.
func advisoryKey(schema, table string) int64 {
	h := fnv.New64a()
	h.Write([]byte("pgstore\x00" + schema + "\x00" + table))
	return int64(h.Sum64())
}
