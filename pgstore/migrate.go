package pgstore

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"slices"

	"github.com/jackc/pgx/v5"

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
//
// It fails with ErrInvalidConfig, changing nothing, when the schema is at a
// version newer than this build knows (a newer build migrated it; this one
// would misread it), or when a name it would create is taken by a relation
// that is not this store's: another store's Table in the same schema that
// equals one of this store's derived names, or the reverse (Tables "a" and
// "a_token_seq"), or an object of the application.
//
// Until it has run, every operation of the Store fails closed with
// ErrUnavailable and an error that names the missing table and says to run
// Migrate (idemproxy runs it at start unless -migrate=false).
func (s *Store) Migrate(ctx context.Context) error {
	steps, err := s.migrationSteps()
	if err != nil {
		return err
	}
	for {
		done, err := s.migrateOne(ctx, steps)
		if errors.Is(err, idempotency.ErrInvalidConfig) {
			return fmt.Errorf("pgstore: migrate: %w", err)
		}
		if err != nil {
			return fmt.Errorf("pgstore: migrate: %w: %w", idempotency.ErrUnavailable, err)
		}
		if done {
			return nil
		}
	}
}

// SchemaVersion returns the version the schema was migrated to (0: never)
// and the latest version this package knows, within OpTimeout. A current
// above latest means that a newer build migrated the schema: Migrate
// refuses it. When the version table's name is taken by another relation,
// the error wraps ErrInvalidConfig.
func (s *Store) SchemaVersion(ctx context.Context) (current, latest int, err error) {
	steps, err := s.migrationSteps()
	if err != nil {
		return 0, 0, err
	}
	// Bounded like the operations: a process that checks at startup must
	// not wait for ever on a server that stopped answering.
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	exists, err := s.versionTable(ctx, s.pool)
	if err == nil && exists {
		err = s.pool.QueryRow(ctx, s.names.Replace("SELECT coalesce(max(version), 0) FROM {{versions}}")).Scan(&current)
	}
	if errors.Is(err, idempotency.ErrInvalidConfig) {
		return 0, len(steps), fmt.Errorf("pgstore: schema version: %w", err)
	}
	if err != nil {
		return 0, len(steps), fmt.Errorf("pgstore: schema version: %w: %w", idempotency.ErrUnavailable, err)
	}
	return current, len(steps), nil
}

// CheckSchema fails unless the schema is at the version this build needs,
// for a process that does not run Migrate itself (it was run at deploy
// time): with ErrInvalidConfig when the schema was never migrated or is at
// an older version (run Migrate first), or when a newer build migrated it
// (run a build that knows its version); with ErrUnavailable when the
// database cannot be asked (within OpTimeout). It changes nothing and
// costs two short queries (the catalog, then the version table), so that a
// process finds a schema it cannot use at startup rather than at its first
// request.
func (s *Store) CheckSchema(ctx context.Context) error {
	current, latest, err := s.SchemaVersion(ctx)
	switch {
	case err != nil:
		return err
	case current > latest:
		return fmt.Errorf("pgstore: schema check: %w", s.newerSchema(current, latest))
	case current < latest:
		was := fmt.Sprintf("at schema version %d", current)
		if current == 0 {
			was = "not migrated (schema version 0)"
		}
		return fmt.Errorf("pgstore: schema check: %w: table %s is %s, and this build of pgstore needs version %d: "+
			"migrate it first (Store.Migrate)", idempotency.ErrInvalidConfig, s.names.Replace("{{table}}"), was, latest)
	}
	return nil
}

func (s *Store) newerSchema(current, latest int) error {
	return fmt.Errorf("%w: table %s is at schema version %d, and this build of pgstore knows only up to version %d: "+
		"a newer build migrated it; run a build that knows version %d",
		idempotency.ErrInvalidConfig, s.names.Replace("{{table}}"), current, latest, current)
}

// querier is a pool or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// versionTable reports whether the version table exists. A relation of its
// name that is no version table (no version column) is another store's
// records table (Tables "a" and "a_schema_version") or the application's:
// that fails with ErrInvalidConfig instead of being read or written.
func (s *Store) versionTable(ctx context.Context, q querier) (exists bool, err error) {
	var (
		kind       string
		hasVersion bool
	)
	err = q.QueryRow(ctx, `SELECT c.relkind::text, EXISTS (SELECT FROM pg_attribute a
	WHERE a.attrelid = c.oid AND a.attname = 'version' AND a.attnum > 0 AND NOT a.attisdropped)
FROM pg_class c WHERE c.oid = to_regclass($1)`, s.names.Replace("{{versions}}")).Scan(&kind, &hasVersion)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, err
	case kind != "r" && kind != "p" || !hasVersion:
		what := relkindName(kind)
		if kind == "r" || kind == "p" {
			what += " with no version column"
		}
		return false, s.nameTaken(s.names.Replace("{{versions}}"), "version table", what)
	}
	return true, nil
}

// relation is one that a migration creates.
type relation struct {
	version int    // the migration that creates it
	name    string // schema-qualified, quoted
	role    string // what it is to the store, for errors
}

// relations lists what the migrations create besides the version table and
// the primary key's index (PostgreSQL picks a free name for that one).
func (s *Store) relations() []relation {
	return []relation{
		{1, s.names.Replace("{{seq}}"), "token sequence"},
		{1, s.names.Replace("{{table}}"), "records table"},
		{1, pgx.Identifier{s.schema, s.table + "_expires_at_idx"}.Sanitize(), "expiry index"},
	}
}

// checkFree fails with ErrInvalidConfig if a relation that migration
// version creates exists already. It did not come from this store (its
// version table says the migration has not run), so it is another store's
// (Tables "a" and "a_token_seq") or the application's; CREATE would fail
// with a bare "already exists".
func (s *Store) checkFree(ctx context.Context, tx pgx.Tx, version int) error {
	for _, r := range s.relations() {
		if r.version != version {
			continue
		}
		var kind string
		err := tx.QueryRow(ctx, "SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)", r.name).Scan(&kind)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return err
		}
		return s.nameTaken(r.name, r.role, relkindName(kind))
	}
	return nil
}

func (s *Store) nameTaken(name, role, what string) error {
	return fmt.Errorf("%w: Table %q needs %s for its %s, but the name is taken (%s) by another store's Table "+
		"or derived name in schema %q, or by the application: choose another Table",
		idempotency.ErrInvalidConfig, s.table, name, role, what, s.schema)
}

func relkindName(kind string) string {
	switch kind {
	case "r":
		return "table"
	case "p":
		return "partitioned table"
	case "S":
		return "sequence"
	case "i", "I":
		return "index"
	case "v":
		return "view"
	case "m":
		return "materialized view"
	case "f":
		return "foreign table"
	case "c":
		return "composite type"
	}
	return "relation"
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
			// ctx may have ended between two statements, leaving the
			// connection open: the ROLLBACK is still sent, and bounded, so
			// that a server that stopped answering does not hold Migrate
			// for good (pgx closes the connection when it fails).
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
			defer cancel()
			err = errors.Join(err, tx.Rollback(rctx))
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
	exists, err := s.versionTable(ctx, tx)
	if err != nil {
		return false, err
	}
	if !exists {
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
	if current > len(steps) {
		return false, s.newerSchema(current, len(steps))
	}
	if current < len(steps) {
		if err := s.checkFree(ctx, tx, current+1); err != nil {
			return false, err
		}
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
