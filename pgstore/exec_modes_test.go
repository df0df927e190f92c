package pgstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/archlab/idempotency"
)

// TestBytesExactInEveryExecMode stores and replays keys, fingerprints and
// responses that only bytes can hold (NUL, invalid UTF-8, a body of
// several MB) through pools in each of pgx's query exec modes: the
// simple protocol (what PgBouncer's transaction pooling asks for) sends
// the arguments as literals in the SQL text, the exec mode as text
// without a described type.
func TestBytesExactInEveryExecMode(t *testing.T) {
	direct := testPool(t, 2, nil)
	schema := freshSchema(t, direct)
	migratedStore(t, direct, schema, Options{Table: "modes"})
	modes := []pgx.QueryExecMode{
		pgx.QueryExecModeCacheStatement,
		pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec,
		pgx.QueryExecModeExec,
		pgx.QueryExecModeSimpleProtocol,
	}
	ctx := context.Background()
	for i, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := direct.Config()
			cfg.MaxConns = 2
			cfg.ConnConfig.DefaultQueryExecMode = mode
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			s, err := New(pool, &Options{Schema: schema, Table: "modes"})
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			key := mode.String() + "\x00\xff\xfe'\\x00\"; --"
			fp := "fp\x00\xc3\x28"
			want := oddResponse(uint64(i), 3<<20)
			rec, ok, err := s.Begin(ctx, key, fp, now, lease, retention)
			if err != nil || !ok {
				t.Fatalf("Begin = %v, %v", ok, err)
			}
			if err := s.Complete(ctx, key, rec.Token, want, now, retention); err != nil {
				t.Fatalf("Complete: %v", err)
			}
			got, ok, err := s.Begin(ctx, key, fp, now, lease, retention)
			if err != nil || ok || got.State != idempotency.Done || got.Fingerprint != fp {
				t.Fatalf("Begin again = %v, %v, %q, %v; want the stored result", got.State, ok, got.Fingerprint, err)
			}
			if diff := responseDiff(want, got.Response); diff != "" {
				t.Fatalf("replayed response (-stored +replayed):\n%s", diff)
			}
			// Another process, in the default mode, reads the same bytes.
			other, err := New(direct, &Options{Schema: schema, Table: "modes"})
			if err != nil {
				t.Fatal(err)
			}
			if got, err := other.Get(ctx, key, now); err != nil || responseDiff(want, got.Response) != "" {
				t.Fatalf("Get through the default mode = %v; response differs: %v", err, responseDiff(want, got.Response))
			}
			// The fingerprint is compared byte for byte: one that differs
			// after its NUL conflicts, and the key only matches itself.
			if got, ok, err := s.Begin(ctx, key, "fp\x00\xc3\x29", now, lease, retention); err != nil || ok || got.State != idempotency.Conflict {
				t.Fatalf("Begin with a fingerprint differing after NUL = %v, %v, %v; want Conflict", got.State, ok, err)
			}
			if _, err := s.Get(ctx, mode.String()+"\x00\xff\xfe", now); !errors.Is(err, idempotency.ErrNotFound) {
				t.Fatalf("Get of the key's prefix = %v, want ErrNotFound", err)
			}
			if err := s.Delete(ctx, key); err != nil {
				t.Fatalf("Delete: %v", err)
			}
			if _, err := s.Get(ctx, key, now); !errors.Is(err, idempotency.ErrNotFound) {
				t.Fatalf("Get after Delete = %v, want ErrNotFound", err)
			}
		})
	}
}
