package pgstore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

// TestCheckSchema: a process that does not migrate learns at startup that
// the schema is not the one its build needs (never migrated, migrated by an
// older or a newer build), with ErrInvalidConfig and the versions, rather
// than at its first request; a current schema passes.
func TestCheckSchema(t *testing.T) {
	pool := testPool(t, 4, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name    string
		setup   func(t *testing.T, s *Store, latest int) // on a migrated store
		current func(latest int) int
		want    string // in the error; "" for none
	}{
		{
			name: "never migrated",
			setup: func(t *testing.T, s *Store, _ int) {
				mustExec(t, pool, s.names.Replace("DROP TABLE {{versions}}, {{table}}; DROP SEQUENCE {{seq}}"))
			},
			current: func(int) int { return 0 },
			want:    "Migrate",
		},
		{
			name: "older",
			setup: func(t *testing.T, s *Store, latest int) {
				mustExec(t, pool, s.names.Replace("DELETE FROM {{versions}} WHERE version = $1"), latest)
			},
			current: func(latest int) int { return latest - 1 },
			want:    "Migrate",
		},
		{
			name: "newer",
			setup: func(t *testing.T, s *Store, latest int) {
				mustExec(t, pool, s.names.Replace("INSERT INTO {{versions}} (version) VALUES ($1)"), latest+1)
			},
			current: func(latest int) int { return latest + 1 },
			want:    "newer build",
		},
		{
			name:    "current",
			setup:   func(*testing.T, *Store, int) {},
			current: func(latest int) int { return latest },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _, latest := latestStore(ctx, t, pool)
			tc.setup(t, s, latest)
			cur := tc.current(latest)
			wantSchemaVersion(ctx, t, s, cur, "after setup")

			err := s.CheckSchema(ctx)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("CheckSchema of a schema at the latest version %d = %v", latest, err)
				}
				return
			}
			if !errors.Is(err, idempotency.ErrInvalidConfig) || errors.Is(err, idempotency.ErrUnavailable) {
				t.Fatalf("CheckSchema at version %d by a build that needs %d = %v; want ErrInvalidConfig (and not ErrUnavailable)", cur, latest, err)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.want) || !strings.Contains(msg, "version "+strconv.Itoa(cur)) || !strings.Contains(msg, strconv.Itoa(latest)) {
				t.Errorf("CheckSchema = %q; want it to say %q and name versions %d and %d", msg, tc.want, cur, latest)
			}
			wantSchemaVersion(ctx, t, s, cur, "after CheckSchema (unchanged)")
		})
	}
}

// TestCheckSchemaMissingSchema: a Schema that does not exist at all is
// one never migrated, not an unreachable database.
func TestCheckSchemaMissingSchema(t *testing.T) {
	pool := testPool(t, 2, nil)
	s, err := New(pool, &Options{Schema: "idem_test_absent_" + strconv.FormatInt(time.Now().UnixNano(), 36), Table: "keys"})
	if err != nil {
		t.Fatal(err)
	}
	err = s.CheckSchema(context.Background())
	if !errors.Is(err, idempotency.ErrInvalidConfig) || errors.Is(err, idempotency.ErrUnavailable) || !strings.Contains(err.Error(), "version 0") {
		t.Fatalf("CheckSchema in a missing schema = %v; want ErrInvalidConfig naming version 0", err)
	}
}

// TestCheckSchemaUnreachable: a database that does not answer is
// ErrUnavailable, not a schema to migrate.
func TestCheckSchemaUnreachable(t *testing.T) {
	s := brokenStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.CheckSchema(ctx); !errors.Is(err, idempotency.ErrUnavailable) || errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Fatalf("CheckSchema on an unreachable database = %v; want ErrUnavailable", err)
	}
}
