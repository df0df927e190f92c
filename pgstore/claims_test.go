package pgstore

import (
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/testenv"
)

// TestBeginAnswersWithoutLocking: a replay, an in-flight answer and a
// conflict take no row lock and write nothing. With the key's row locked
// by another transaction, each is answered (a Begin that locked would wait
// for the lock and fail at OpTimeout), and the row's version (xmin) stays
// the same.
func TestBeginAnswersWithoutLocking(t *testing.T) {
	pool := testPool(t, 4, nil)
	s := migratedStore(t, pool, freshSchema(t, pool), Options{OpTimeout: 2 * time.Second})
	ctx := context.Background()
	now := time.Now()
	done, ok, err := s.Begin(ctx, "done", "fp", now, time.Minute, time.Hour)
	if err != nil || !ok {
		t.Fatalf("Begin = %v, %v", ok, err)
	}
	if err := s.Complete(ctx, "done", done.Token, idempotency.Response{Status: 201, Body: []byte("made")}, now, time.Hour); err != nil {
		t.Fatal(err)
	}
	held, ok, err := s.Begin(ctx, "held", "fp", now, time.Minute, time.Hour)
	if err != nil || !ok {
		t.Fatalf("Begin = %v, %v", ok, err)
	}

	xmin := func(key string) string {
		t.Helper()
		var x string
		if err := pool.QueryRow(ctx, s.names.Replace("SELECT xmin::text FROM {{table}} WHERE key = $1"), []byte(key)).Scan(&x); err != nil {
			t.Fatal(err)
		}
		return x
	}
	before := map[string]string{"done": xmin("done"), "held": xmin("held")}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, s.names.Replace("SELECT FROM {{table}} WHERE key = ANY ($1) FOR UPDATE"), [][]byte{[]byte("done"), []byte("held")}); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name, key, fp string
		check         func(idempotency.Record) bool
	}{
		{"replay", "done", "fp", func(r idempotency.Record) bool {
			return r.State == idempotency.Done && string(r.Response.Body) == "made"
		}},
		{"in flight", "held", "fp", func(r idempotency.Record) bool {
			return r.State == idempotency.Processing && r.Token == held.Token
		}},
		{"conflict on a done key", "done", "other", func(r idempotency.Record) bool { return r.State == idempotency.Conflict }},
		{"conflict on a held key", "held", "other", func(r idempotency.Record) bool { return r.State == idempotency.Conflict }},
	} {
		rec, claimed, err := s.Begin(ctx, tc.key, tc.fp, now.Add(time.Second), time.Minute, time.Hour)
		if err != nil || claimed || !tc.check(rec) {
			t.Errorf("%s with the row locked elsewhere: Begin = %+v, %v, %v", tc.name, rec, claimed, err)
		}
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for key, x := range before {
		if got := xmin(key); got != x {
			t.Errorf("row %q was written by an answer that claims nothing (xmin %s, was %s)", key, got, x)
		}
	}
}

// TestKeyTooLongForIndex: a key that does not fit the primary key's index
// (about 2.7 kB, after compression: random bytes do not compress) fails
// with ErrUnavailable wrapping SQLSTATE 54000, every time; the Guard does
// not run fn.
func TestKeyTooLongForIndex(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	ctx := context.Background()
	b := make([]byte, 3000)
	rand.Read(b)
	key := string(b)
	g, err := idempotency.NewGuard(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		ran := false
		_, _, err := g.Do(ctx, key, "fp", func(context.Context) (idempotency.Response, error) {
			ran = true
			return idempotency.Response{Status: 200}, nil
		})
		var pe *pgconn.PgError
		if ran || !errors.Is(err, idempotency.ErrUnavailable) || !errors.As(err, &pe) || pe.Code != "54000" {
			t.Fatalf("Guard.Do with a 3000-byte key: ran %v, %v; want ErrUnavailable wrapping SQLSTATE 54000 without running fn", ran, err)
		}
	}
}

// TestWatchDeletesConnectionBeyondMaxConns: WatchDeletes takes its
// connection out of the pool, so a pool of one connection still serves
// the store's operations while it listens (a watcher that kept the pool's
// connection would leave them waiting until OpTimeout).
func TestWatchDeletesConnectionBeyondMaxConns(t *testing.T) {
	pool := testPool(t, 1, nil)
	s := migratedStore(t, pool, freshSchema(t, pool), Options{OpTimeout: 2 * time.Second})
	w := testenv.Watch(t, s.WatchDeletes)
	ctx := context.Background()
	mustFinish(t, s, "k")
	mustDelete(t, s, "k")
	w.WantForgot(t, "k")
	if _, err := s.Get(ctx, "k", time.Now()); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("Get while WatchDeletes runs = %v, want ErrNotFound", err)
	}
}

// TestDefaults: nil Options mean the documented defaults.
func TestDefaults(t *testing.T) {
	s, err := New(new(pgxpool.Pool), nil) // New does not touch the database
	if err != nil {
		t.Fatal(err)
	}
	if s.schema != "public" || s.table != "idempotency_keys" || s.batch != 1000 ||
		s.timeout != DefaultOpTimeout || DefaultOpTimeout != 5*time.Second || s.clock != CallerClock {
		t.Fatalf("defaults: schema %q, table %q, SweepBatch %d, OpTimeout %v, clock %d", s.schema, s.table, s.batch, s.timeout, s.clock)
	}
	if want := "public.idempotency_keys.deleted"; s.channel != want {
		t.Fatalf("deletion channel %q, want %q", s.channel, want)
	}
}

// cancelAfterDelete cancels a context once a DELETE (a Sweep batch) has
// been answered.
type cancelAfterDelete struct {
	sweepTracer
	cancel context.CancelFunc
}

func (c *cancelAfterDelete) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryEndData) {
	c.sweepTracer.TraceQueryEnd(ctx, conn, d)
	if sql, _ := ctx.Value(traceSQLKey{}).(string); strings.HasPrefix(sql, "DELETE FROM") {
		c.cancel()
	}
}

// TestSweepCountsWhenItFailsPartWay: a Sweep that fails after some batches
// returns the rows those batches deleted with its error.
func TestSweepCountsWhenItFailsPartWay(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tracer := &cancelAfterDelete{cancel: cancel}
	pool := testPool(t, 4, tracer)
	const batch = 10
	s := migratedStore(t, pool, freshSchema(t, pool), Options{SweepBatch: batch})
	now := time.Now()
	mustExec(t, pool, s.names.Replace(`INSERT INTO {{table}} (key, fingerprint, state, token, expires_at, status)
		SELECT convert_to('old-' || g, 'UTF8'), 'fp', 'DONE', nextval('{{seq}}'), $1, 200 FROM generate_series(1, $2) g`),
		now.UnixNano(), 3*batch)
	n, err := s.Sweep(ctx, now, 0)
	if !errors.Is(err, context.Canceled) || n != batch {
		t.Fatalf("Sweep cut short after its first batch = %d, %v; want %d and the cancellation", n, err, batch)
	}
	var left int
	if err := pool.QueryRow(context.Background(), s.names.Replace("SELECT count(*) FROM {{table}}")).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 2*batch {
		t.Fatalf("%d rows left, want %d", left, 2*batch)
	}
}
