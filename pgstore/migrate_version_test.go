package pgstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

// TestMigrateRefusesNewerSchema: a schema whose version table records a
// version this build does not know (a newer build migrated it) is refused
// with ErrInvalidConfig and left as it was, instead of being run against,
// whether or not the newer build kept the records table.
func TestMigrateRefusesNewerSchema(t *testing.T) {
	pool := testPool(t, 4, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name  string
		setup string // run after the current migrations, before the newer version is recorded
	}{
		{"records table kept", ""},
		{"records table gone", "DROP TABLE {{table}}; DROP SEQUENCE {{seq}}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, schema, latest := latestStore(ctx, t, pool)
			if tc.setup != "" {
				mustExec(t, pool, s.names.Replace(tc.setup))
			}
			mustExec(t, pool, s.names.Replace("INSERT INTO {{versions}} (version) VALUES ($1)"), latest+1)

			old, err := New(pool, &Options{Schema: schema, Table: "keys"})
			if err != nil {
				t.Fatal(err)
			}
			err = old.Migrate(ctx)
			if !errors.Is(err, idempotency.ErrInvalidConfig) || errors.Is(err, idempotency.ErrUnavailable) {
				t.Fatalf("Migrate of a schema at version %d by a build that knows %d = %v; want ErrInvalidConfig (and not ErrUnavailable)", latest+1, latest, err)
			}
			wantSchemaVersion(ctx, t, old, latest+1, "after the refused Migrate")
			var tableBack bool
			if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", s.names.Replace("{{table}}")).Scan(&tableBack); err != nil {
				t.Fatal(err)
			}
			if want := tc.setup == ""; tableBack != want {
				t.Fatalf("records table exists = %v after the refused Migrate, want %v (left as it was)", tableBack, want)
			}
		})
	}
}

// TestMigrateEmptyVersionTable: a version table without rows (version 0,
// as SchemaVersion reports it) and nothing else is migrated from scratch,
// as before the newer-version check.
func TestMigrateEmptyVersionTable(t *testing.T) {
	pool := testPool(t, 4, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	schema := freshSchema(t, pool)
	s, err := New(pool, &Options{Schema: schema, Table: "keys"})
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, pool, s.names.Replace("CREATE TABLE {{versions}} (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"))
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate over an empty version table: %v", err)
	}
	if cur, latest, err := s.SchemaVersion(ctx); err != nil || cur != latest {
		t.Fatalf("SchemaVersion = %d, %d, %v", cur, latest, err)
	}
	if _, ok, err := s.Begin(ctx, "k", "fp", time.Now(), lease, retention); err != nil || !ok {
		t.Fatalf("Begin = %v, %v", ok, err)
	}
}
