package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/archlab/idempotency"
)

// TestUnmigratedSaysRunMigrate: before Migrate has run, every operation
// still fails closed with ErrUnavailable (and the server's error), and says
// what to do about it instead of a bare "relation does not exist": on a
// schema that exists without the table, on a schema that does not exist at
// all, and on a table whose token sequence is gone.
func TestUnmigratedSaysRunMigrate(t *testing.T) {
	pool := testPool(t, 4, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	schema := freshSchema(t, pool)
	noSeq := migratedStore(t, pool, schema, Options{Table: "noseq"})
	if _, err := pool.Exec(ctx, "DROP SEQUENCE "+schema+".noseq_token_seq"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		schema    string
		table     string
		sequence  bool // only the statements that draw a token fail
		wantTable string
	}{
		{"no-table", schema, "keys", false, schema + ".keys"},
		{"no-schema", "idem_test_absent_schema", "keys", false, "idem_test_absent_schema.keys"},
		{"no-sequence", schema, "noseq", true, schema + ".noseq"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := noSeq
			if !tc.sequence {
				var err error
				if s, err = New(pool, &Options{Schema: tc.schema, Table: tc.table}); err != nil {
					t.Fatal(err)
				}
			}
			now := time.Now()
			ops := map[string]func() error{
				"begin": func() error {
					_, _, err := s.Begin(ctx, "k", "fp", now, time.Minute, time.Hour)
					return err
				},
			}
			if !tc.sequence {
				ops["complete"] = func() error { return s.Complete(ctx, "k", 1, idempotency.Response{Status: 200}, now, time.Hour) }
				ops["extend"] = func() error { return s.Extend(ctx, "k", 1, now, time.Minute) }
				ops["release"] = func() error { return s.Release(ctx, "k", 1) }
				ops["get"] = func() error { _, err := s.Get(ctx, "k", now); return err }
				ops["delete"] = func() error { return s.Delete(ctx, "k") }
				ops["sweep"] = func() error { _, err := s.Sweep(ctx, now, 0); return err }
				ops["complete-tx"] = func() error {
					tx, err := pool.Begin(ctx)
					if err != nil {
						return fmt.Errorf("test: %w", err)
					}
					defer tx.Rollback(ctx)
					return s.CompleteTx(ctx, tx, "k", 1, idempotency.Response{Status: 200}, now, time.Hour)
				}
			}
			for op, f := range ops {
				err := f()
				var pe *pgconn.PgError
				if !errors.Is(err, idempotency.ErrUnavailable) || !errors.As(err, &pe) {
					t.Errorf("%s = %v, want ErrUnavailable and a *pgconn.PgError", op, err)
					continue
				}
				msg := err.Error()
				if !strings.Contains(msg, "run Store.Migrate (or idemproxy -migrate)") || !strings.Contains(msg, tc.wantTable) {
					t.Errorf("%s = %q, want it to name %s and say to run Store.Migrate (or idemproxy -migrate)", op, msg, tc.wantTable)
				}
			}
		})
	}
}
