package pgstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/archlab/idempotency"
)

// TestCompleteTx: the business write and the stored result commit or roll
// back together.
func TestCompleteTx(t *testing.T) {
	s, pool := newTestStore(t, Options{})
	ctx := context.Background()
	orders := s.names.Replace("{{schema}}.orders")
	if _, err := pool.Exec(ctx, "CREATE TABLE "+orders+" (key text PRIMARY KEY, fence bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	resp := idempotency.Response{Status: 201, Body: []byte("created")}
	t0 := time.Now()
	// run claims key, writes the order and completes in one transaction,
	// committing when commit is true.
	run := func(key string, now time.Time, commit bool) idempotency.Record {
		t.Helper()
		rec, ok, err := s.Begin(ctx, key, "fp", now, lease, retention)
		if err != nil || !ok {
			t.Fatalf("Begin %s = %v, %v", key, ok, err)
		}
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO "+orders+" VALUES ($1, $2)", key, int64(rec.Token)); err != nil {
				return err
			}
			if err := s.CompleteTx(ctx, tx, key, rec.Token, resp, now, retention); err != nil {
				return err
			}
			if !commit {
				return errors.New("rollback")
			}
			return nil
		})
		if commit && err != nil {
			t.Fatalf("transaction: %v", err)
		}
		return rec
	}
	orderCount := func(key string) (n int) {
		t.Helper()
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+orders+" WHERE key = $1", key).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	t.Run("committed replays", func(t *testing.T) {
		run("committed", t0, true)
		rec, ok, err := s.Begin(ctx, "committed", "fp", t0.Add(time.Minute), lease, retention)
		if err != nil || ok || rec.State != idempotency.Done || string(rec.Response.Body) != "created" {
			t.Fatalf("Begin after commit = %+v, %v, %v; want a replay", rec, ok, err)
		}
		if n := orderCount("committed"); n != 1 {
			t.Fatalf("%d orders, want 1", n)
		}
	})

	t.Run("rolled back stays claimed until its lease ends", func(t *testing.T) {
		first := run("rolled-back", t0, false)
		if n := orderCount("rolled-back"); n != 0 {
			t.Fatalf("%d orders after rollback, want 0", n)
		}
		rec, ok, err := s.Begin(ctx, "rolled-back", "fp", t0.Add(lease-time.Millisecond), lease, retention)
		if err != nil || ok || rec.State != idempotency.Processing || rec.Token != first.Token {
			t.Fatalf("Begin inside the lease = %+v, %v, %v; want in flight", rec, ok, err)
		}
		second := run("rolled-back", t0.Add(lease), true)
		if second.Token <= first.Token {
			t.Fatalf("takeover token %d not above %d", second.Token, first.Token)
		}
		if n := orderCount("rolled-back"); n != 1 {
			t.Fatalf("%d orders, want 1", n)
		}
	})

	t.Run("lost lease keeps the transaction usable", func(t *testing.T) {
		rec, _, err := s.Begin(ctx, "lost", "fp", t0, lease, retention)
		if err != nil {
			t.Fatal(err)
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if err := s.CompleteTx(ctx, tx, "lost", rec.Token+1000, resp, t0, retention); !errors.Is(err, idempotency.ErrLeaseLost) {
			t.Fatalf("CompleteTx with a wrong token = %v, want ErrLeaseLost", err)
		}
		if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatalf("tx after ErrLeaseLost: %v", err)
		}
	})
}
