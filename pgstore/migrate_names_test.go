package pgstore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

// TestMigrateRefusesCollidingNames: a store whose Table, or one of the
// names derived from it (<Table>_token_seq, _schema_version,
// _expires_at_idx), is already taken in the schema by another store or by
// the application fails Migrate with ErrInvalidConfig naming the
// relation, leaves nothing behind, and the other store keeps working.
func TestMigrateRefusesCollidingNames(t *testing.T) {
	pool := testPool(t, 4, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name   string // when setup is used
		first  string // a store migrated first, or
		setup  string // SQL run first ({{schema}}: the schema)
		second string // the store whose Migrate is refused
		taken  string // the relation named in the error
	}{
		{first: "a", second: "a_token_seq", taken: "a_token_seq"},
		{first: "a_token_seq", second: "a", taken: "a_token_seq"},
		{first: "a", second: "a_schema_version", taken: "a_schema_version"},
		{first: "a_schema_version", second: "a", taken: "a_schema_version"},
		{first: "a", second: "a_expires_at_idx", taken: "a_expires_at_idx"},
		{first: "a_expires_at_idx", second: "a", taken: "a_expires_at_idx"},
		{first: "a", second: "a_pkey", taken: "a_pkey"},
		{name: "application's view", setup: "CREATE VIEW {{schema}}.keys AS SELECT 1 AS one", second: "keys", taken: `"keys"`},
		{name: "application's table as version table", setup: "CREATE TABLE {{schema}}.keys_schema_version (v int)", second: "keys", taken: "keys_schema_version"},
		{name: "unversioned records table", setup: "CREATE TABLE {{schema}}.keys_schema_version (version int); CREATE TABLE {{schema}}.keys (key bytea)", second: "keys", taken: `"keys"`},
	} {
		name := tc.name
		if name == "" {
			name = tc.first + " then " + tc.second
		}
		t.Run(name, func(t *testing.T) {
			schema := freshSchema(t, pool)
			var first *Store
			if tc.setup != "" {
				if _, err := pool.Exec(ctx, strings.ReplaceAll(tc.setup, "{{schema}}", schema)); err != nil {
					t.Fatal(err)
				}
			} else {
				first = migratedStore(t, pool, schema, Options{Table: tc.first})
			}
			second, err := New(pool, &Options{Schema: schema, Table: tc.second})
			if err != nil {
				t.Fatal(err)
			}
			var before int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_class WHERE relnamespace = to_regnamespace($1)", schema).Scan(&before); err != nil {
				t.Fatal(err)
			}
			err = second.Migrate(ctx)
			if !errors.Is(err, idempotency.ErrInvalidConfig) || errors.Is(err, idempotency.ErrUnavailable) || !strings.Contains(err.Error(), tc.taken) {
				t.Fatalf("Migrate = %v; want ErrInvalidConfig (not ErrUnavailable) naming %s", err, tc.taken)
			}
			var after int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_class WHERE relnamespace = to_regnamespace($1)", schema).Scan(&after); err != nil {
				t.Fatal(err)
			}
			if after != before {
				t.Fatalf("%d relations in the schema after the refused Migrate, %d before", after, before)
			}
			if first != nil {
				if err := first.Migrate(ctx); err != nil {
					t.Fatalf("Migrate of the first store again: %v", err)
				}
				if _, ok, err := first.Begin(ctx, "k", "fp", time.Now(), lease, retention); err != nil || !ok {
					t.Fatalf("Begin on the first store = %v, %v", ok, err)
				}
			}
		})
	}
}

// TestMigrateNeighboursThatDoNotCollide: names that only look alike work
// side by side, in either order (PostgreSQL names a primary key index
// <table>_pkey1 when <table>_pkey is taken).
func TestMigrateNeighboursThatDoNotCollide(t *testing.T) {
	pool := testPool(t, 4, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, tables := range [][]string{
		{"a_pkey", "a"},
		{"a", "a_token", "a_token_seq_x", "a_schema", "a_expires_at"},
		{"a_expires_at", "a_schema", "a_token_seq_x", "a_token", "a"},
	} {
		t.Run(strings.Join(tables, ","), func(t *testing.T) {
			schema := freshSchema(t, pool)
			for _, table := range tables {
				s := migratedStore(t, pool, schema, Options{Table: table})
				if _, ok, err := s.Begin(ctx, "k", "fp", time.Now(), lease, retention); err != nil || !ok {
					t.Fatalf("Begin on %s = %v, %v", table, ok, err)
				}
			}
		})
	}
}
