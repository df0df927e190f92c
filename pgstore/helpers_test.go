package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/archlab/idempotency/internal/testenv"
)

// testPool connects to IDEMPOTENCY_TEST_POSTGRES_URL (or skips) with a pool
// of at most maxConns connections, closed when t ends.
func testPool(t testing.TB, maxConns int32, tracer pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatalf("parsing %s: %v", testenv.PostgresURLVar, err)
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.Tracer = tracer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connecting: %v", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		testenv.Missing(t, fmt.Sprintf("PostgreSQL at %s is unreachable: %v", testenv.PostgresURLVar, err))
	}
	t.Cleanup(pool.Close)
	return pool
}

// execOnCleanup runs sql (cleaning up what a test made) when t ends, on a
// connection of its own: the pool may be closed already (cleanups run last
// in, first out).
func execOnCleanup(t testing.TB, pool *pgxpool.Pool, sql string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, pool.Config().ConnConfig.ConnString())
		if err != nil {
			t.Errorf("%s: %v", sql, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Errorf("%s: %v", sql, err)
		}
	})
}

// freshSchema creates the schema idem_test_<random>, dropped when t ends.
func freshSchema(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	b := make([]byte, 6)
	rand.Read(b)
	schema := "idem_test_" + hex.EncodeToString(b)
	if _, err := pool.Exec(context.Background(), "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("creating schema: %v", err)
	}
	execOnCleanup(t, pool, "DROP SCHEMA "+schema+" CASCADE")
	return schema
}

var tableSeq atomic.Int64

// migratedStore returns a Store on a new table in schema, migrated.
func migratedStore(t testing.TB, pool *pgxpool.Pool, schema string, opts Options) *Store {
	t.Helper()
	opts.Schema = schema
	if opts.Table == "" {
		opts.Table = fmt.Sprintf("keys_%d", tableSeq.Add(1))
	}
	s, err := New(pool, &opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return s
}

// latestStore returns a Store on table keys in a fresh schema, migrated to
// the latest version this build knows, the schema and that version.
func latestStore(ctx context.Context, t testing.TB, pool *pgxpool.Pool) (s *Store, schema string, latest int) {
	t.Helper()
	schema = freshSchema(t, pool)
	s = migratedStore(t, pool, schema, Options{Table: "keys"})
	_, latest, err := s.SchemaVersion(ctx)
	if err != nil {
		t.Fatalf("SchemaVersion after Migrate: %v", err)
	}
	return s, schema, latest
}

// wantSchemaVersion fails t unless s's schema is at version want; when
// says at which point of the test.
func wantSchemaVersion(ctx context.Context, t testing.TB, s *Store, want int, when string) {
	t.Helper()
	if cur, _, err := s.SchemaVersion(ctx); err != nil || cur != want {
		t.Fatalf("SchemaVersion %s = %d, %v; want %d", when, cur, err, want)
	}
}

// mustExec runs sql on pool.
func mustExec(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// newTestStore is a migrated store in a fresh schema on its own pool.
func newTestStore(t testing.TB, opts Options) (*Store, *pgxpool.Pool) {
	t.Helper()
	pool := testPool(t, 8, nil)
	return migratedStore(t, pool, freshSchema(t, pool), opts), pool
}

// brokenStore is a Store whose pool points at a closed port, failing fast.
func brokenStore(t testing.TB) *Store {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cfg, err := pgxpool.ParseConfig("postgres://postgres@" + addr + "/test?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.ConnectTimeout = 500 * time.Millisecond
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := New(pool, &Options{Table: "broken"})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// countingTracer counts the round trips made through a pool: a statement,
// or a batch of them.
type countingTracer struct{ n atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *countingTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *countingTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (c *countingTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// clock is a settable time source for Guard.Now.
type clock struct{ ns atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ns.Store(time.Now().UnixNano())
	return c
}

func (c *clock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }
