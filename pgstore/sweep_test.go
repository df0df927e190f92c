package pgstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/archlab/idempotency"
)

// sweepTracer records the rows each Sweep statement deleted.
type sweepTracer struct {
	mu      sync.Mutex
	batches []int64
}

func (st *sweepTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, traceSQLKey{}, d.SQL)
}

func (st *sweepTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if sql, _ := ctx.Value(traceSQLKey{}).(string); len(sql) > 11 && sql[:11] == "DELETE FROM" && d.Err == nil {
		st.mu.Lock()
		st.batches = append(st.batches, d.CommandTag.RowsAffected())
		st.mu.Unlock()
	}
}

// TestSweepDeletesOnlyExpiredInBatches: Sweep deletes the records expired
// at now (ExpiresAt <= now) and nothing live, a batch of at most
// SweepBatch rows per statement; it passes over a row a writer holds
// locked instead of waiting for it, and claims made while it runs, on the
// very keys it is sweeping, are never deleted.
func TestSweepDeletesOnlyExpiredInBatches(t *testing.T) {
	tracer := &sweepTracer{}
	pool := testPool(t, 8, tracer)
	const batch = 150
	s := migratedStore(t, pool, freshSchema(t, pool), Options{SweepBatch: batch})
	ctx := context.Background()
	t0 := time.Now()
	const expired = 1200
	// expired done records: ExpiresAt = t0+retention, swept at that time
	mustExec(t, pool, s.names.Replace(`INSERT INTO {{table}} (key, fingerprint, state, token, expires_at, status)
		SELECT convert_to('old-' || g, 'UTF8'), 'fp', 'DONE', nextval('{{seq}}'), $1, 200 FROM generate_series(1, $2) g`),
		t0.Add(retention).UnixNano(), expired)
	at := t0.Add(retention)
	live := map[string]bool{}
	for i := range 5 {
		// Done, and in flight with its lease over, both expiring a
		// nanosecond after at: live.
		key := fmt.Sprintf("live-%d", i)
		rec, _, err := s.Begin(ctx, key, "fp", t0, lease, retention+time.Nanosecond)
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if err := s.Complete(ctx, key, rec.Token, idempotency.Response{Status: 200}, t0, retention+time.Nanosecond); err != nil {
				t.Fatal(err)
			}
		}
		live[key] = true
	}
	// A writer holds an expired row: Sweep passes over it.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	lockRow := func(sql string, args ...any) {
		t.Helper()
		if _, err := tx.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	lockRow(s.names.Replace("SELECT FROM {{table}} WHERE key = $1 FOR UPDATE"), []byte("old-1"))

	// Claims of expired keys, made while Sweep runs.
	claimed := make(chan idempotency.Record, expired)
	claimedKeys := make(chan string, expired)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 2 + w; i <= expired; i += 40 {
				key := fmt.Sprintf("old-%d", i)
				rec, ok, err := s.Begin(ctx, key, "fp", at, lease, retention)
				if err != nil || !ok {
					t.Errorf("Begin %s = %v, %v; want a claim of the expired record", key, ok, err)
					return
				}
				claimed <- rec
				claimedKeys <- key
			}
		})
	}
	n, err := s.Sweep(ctx, at, 0)
	wg.Wait()
	close(claimed)
	close(claimedKeys)
	if err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	tracer.mu.Lock()
	for i, b := range tracer.batches {
		if b > batch {
			t.Errorf("Sweep statement %d deleted %d rows, more than SweepBatch %d", i, b, batch)
		}
	}
	t.Logf("Sweep deleted %d rows in %d statements: %v", n, len(tracer.batches), tracer.batches)
	tracer.mu.Unlock()
	for rec := range claimed {
		key := <-claimedKeys
		got, err := s.Get(ctx, key, at)
		if err != nil || got.Token != rec.Token || got.State != idempotency.Processing {
			t.Errorf("claim of %s (token %d) after Sweep: %+v, %v; want it kept", key, rec.Token, got, err)
		}
	}
	for key := range live {
		if _, err := s.Get(ctx, key, at); err != nil {
			t.Errorf("live %s after Sweep: %v", key, err)
		}
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var left int
	if err := pool.QueryRow(ctx, s.names.Replace("SELECT count(*) FROM {{table}} WHERE expires_at <= $1"), at.UnixNano()).Scan(&left); err != nil {
		t.Fatal(err)
	}
	// The locked row, and rows a claim held at the moment, are left.
	if left < 1 {
		t.Errorf("%d expired rows left, want at least the locked one", left)
	}
	if more, err := s.Sweep(ctx, at, 0); err != nil || more != left {
		t.Fatalf("second Sweep = %d, %v; want the %d left", more, err, left)
	}
	for key := range live {
		if _, err := s.Get(ctx, key, at); err != nil {
			t.Errorf("live %s after the second Sweep: %v", key, err)
		}
	}
	if _, err := s.Get(ctx, "live-0", at.Add(time.Nanosecond)); err == nil {
		t.Errorf("live-0 still live a nanosecond after its expiry")
	}
}
