package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/archlab/idempotency"
)

// TestLateBeginAfterReleaseGetsLargerToken pins the interleaving behind
// commit 4318f67: a Begin builds the row it would insert, pauses before the
// row meets the key's unique index, and meanwhile another claim of the key
// is made (a larger token) and ended: released, deleted, or completed or
// abandoned and then swept once expired. When the late Begin goes on, its
// token must still be larger than every token handed out for the key. A
// Begin used to draw its token as it built the row: when Release and
// Delete removed the row, or Sweep removed an expired one, the late Begin
// found no row and inserted that token, which is smaller. It now draws it
// after the insert, under the row's lock.
//
// The pause is a BEFORE INSERT trigger that waits for an advisory lock the
// test holds. Such a trigger runs after the statement has built the row
// and before the row meets the key's unique index: just where the race
// left the late Begin. Each step runs through Store methods.
func TestLateBeginAfterReleaseGetsLargerToken(t *testing.T) {
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	ends := []struct {
		name string
		end  func(ctx context.Context, s *Store, key string, token uint64) error
	}{
		{"Release", func(ctx context.Context, s *Store, key string, token uint64) error {
			return s.Release(ctx, key, token)
		}},
		{"Delete", func(ctx context.Context, s *Store, key string, _ uint64) error {
			return s.Delete(ctx, key)
		}},
		// Sweep must not take the tombstone away from under the late Begin.
		{"ReleaseSweep", func(ctx context.Context, s *Store, key string, token uint64) error {
			if err := s.Release(ctx, key, token); err != nil {
				return err
			}
			_, err := s.Sweep(ctx, start.Add(2*retention), 0)
			return err
		}},
		// Nor the record of a claim that completed and expired: a Done
		// record is no tombstone, and Sweep deletes it once expired.
		{"CompleteSweep", func(ctx context.Context, s *Store, key string, token uint64) error {
			if err := s.Complete(ctx, key, token, idempotency.Response{Status: 200}, start, retention); err != nil {
				return err
			}
			_, err := s.Sweep(ctx, start.Add(2*retention), 0)
			return err
		}},
		// Nor the claim of a holder that crashed, once expired.
		{"ExpireSweep", func(ctx context.Context, s *Store, key string, token uint64) error {
			_, err := s.Sweep(ctx, start.Add(2*retention), 0)
			return err
		}},
	}
	befores := []struct {
		name string
		// before gives the key its history and returns the tokens handed
		// out; at start the key must be claimable.
		before func(ctx context.Context, t *testing.T, s *Store, key string) []uint64
	}{
		{"absent", func(context.Context, *testing.T, *Store, string) []uint64 { return nil }},
		{"expired", func(ctx context.Context, t *testing.T, s *Store, key string) []uint64 {
			then := start.Add(-2 * retention)
			rec, claimed, err := s.Begin(ctx, key, "first", then, lease, retention)
			if err != nil || !claimed {
				t.Fatalf("first Begin = %+v, %v, %v; want a claim", rec, claimed, err)
			}
			if err := s.Complete(ctx, key, rec.Token, idempotency.Response{Status: 200}, then, retention); err != nil {
				t.Fatalf("first Complete: %v", err)
			}
			return []uint64{rec.Token}
		}},
	}
	for _, b := range befores {
		for _, e := range ends {
			t.Run(b.name+"/"+e.name, func(t *testing.T) {
				s, pool := newTestStore(t, Options{})
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				const key = "late-begin"
				handed := b.before(ctx, t, s, key)
				lateBeginAfterEnd(ctx, t, s, pool, key, start, handed, e.end)
			})
		}
	}
}

// lateBeginAfterEnd runs the interleaving on a claimable key whose earlier
// tokens are handed: a Begin with fingerprint "late" builds its row and
// pauses; a Begin with fingerprint "fp" claims the key and end gives it up;
// then the late Begin goes on.
func lateBeginAfterEnd(ctx context.Context, t *testing.T, s *Store, pool *pgxpool.Pool, key string, now time.Time, handed []uint64,
	end func(ctx context.Context, s *Store, key string, token uint64) error) {
	lock1, lock2 := int32(0x1de7), rand.Int32N(1<<30)
	pauseLateInserts(ctx, t, s, lock1, lock2)

	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(context.Background())
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_xact_lock($1, $2)", lock1, lock2); err != nil {
		t.Fatalf("taking the advisory lock: %v", err)
	}

	type result struct {
		rec     idempotency.Record
		claimed bool
		err     error
	}
	late := make(chan result, 1)
	go func() {
		rec, claimed, err := s.Begin(ctx, key, "late", now, lease, retention)
		late <- result{rec, claimed, err}
	}()
	waitForAdvisoryWaiter(ctx, t, pool, lock1, lock2, func() {
		select {
		case r := <-late:
			t.Fatalf("late Begin returned %+v, %v, %v without pausing", r.rec, r.claimed, r.err)
		default:
		}
	})
	// The late Begin is paused and nothing else draws tokens: the
	// sequence's last value is at least any token in its pending row (it
	// had one when Begin drew it before the row met the key's index).
	var drawn uint64
	if err := pool.QueryRow(ctx, s.names.Replace("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {{seq}}")).Scan(&drawn); err != nil {
		t.Fatalf("reading the sequence: %v", err)
	}

	rec, claimed, err := s.Begin(ctx, key, "fp", now, lease, retention)
	if err != nil || !claimed {
		t.Fatalf("Begin while the late one is paused = %+v, %v, %v; want a claim", rec, claimed, err)
	}
	released := rec.Token
	if released <= drawn {
		t.Fatalf("claim token %d is not above the paused Begin's %d: the interleaving did not happen", released, drawn)
	}
	handed = append(handed, released)
	if err := end(ctx, s, key, released); err != nil {
		t.Fatalf("giving up token %d: %v", released, err)
	}

	if err := holder.Commit(ctx); err != nil {
		t.Fatalf("releasing the advisory lock: %v", err)
	}
	var r result
	select {
	case r = <-late:
	case <-ctx.Done():
		t.Fatalf("late Begin did not return: %v", ctx.Err())
	}
	if r.err != nil || !r.claimed {
		t.Fatalf("late Begin = %+v, %v, %v; want a claim", r.rec, r.claimed, r.err)
	}
	for _, h := range handed {
		if r.rec.Token <= h {
			t.Fatalf("late Begin got token %d (it drew %d before the release), not above %d handed out before; all handed out: %v",
				r.rec.Token, drawn, h, handed)
		}
	}

	resp := idempotency.Response{Status: 200, Body: []byte("late")}
	for _, h := range handed {
		if err := s.Complete(ctx, key, h, idempotency.Response{Status: 500}, now, retention); !errors.Is(err, idempotency.ErrLeaseLost) {
			t.Errorf("Complete with stale token %d = %v, want ErrLeaseLost", h, err)
		}
		if err := s.Extend(ctx, key, h, now, lease); !errors.Is(err, idempotency.ErrLeaseLost) {
			t.Errorf("Extend with stale token %d = %v, want ErrLeaseLost", h, err)
		}
		if err := s.Release(ctx, key, h); !errors.Is(err, idempotency.ErrLeaseLost) {
			t.Errorf("Release with stale token %d = %v, want ErrLeaseLost", h, err)
		}
	}
	if err := s.Complete(ctx, key, r.rec.Token, resp, now, retention); err != nil {
		t.Fatalf("Complete with the late token %d: %v", r.rec.Token, err)
	}
	got, err := s.Get(ctx, key, now)
	if err != nil || got.State != idempotency.Done || got.Token != r.rec.Token || string(got.Response.Body) != "late" {
		t.Fatalf("Get after the late Complete = %+v, %v; want Done with token %d and body %q", got, err, r.rec.Token, "late")
	}
}

// pauseLateInserts makes every row that s's Begin proposes with fingerprint
// "late" wait, before it meets the unique index, until the advisory lock
// (lock1, lock2) is free. The trigger is dropped with the test's schema.
func pauseLateInserts(ctx context.Context, t *testing.T, s *Store, lock1, lock2 int32) {
	t.Helper()
	fn := s.names.Replace("{{schema}}.pause_late")
	ddl := []string{
		fmt.Sprintf(`CREATE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.fingerprint = 'late'::bytea THEN
		PERFORM pg_advisory_xact_lock(%d, %d);
	END IF;
	RETURN NEW;
END $$`, fn, lock1, lock2),
		s.names.Replace(`CREATE TRIGGER pause_late BEFORE INSERT ON {{table}} FOR EACH ROW EXECUTE FUNCTION ` + fn + `()`),
	}
	for _, q := range ddl {
		if _, err := s.pool.Exec(ctx, q); err != nil {
			t.Fatalf("installing the pause trigger: %v", err)
		}
	}
}

// waitForAdvisoryWaiter returns once a backend waits for the advisory lock
// (lock1, lock2), calling check between polls; it fails t after 10 seconds.
func waitForAdvisoryWaiter(ctx context.Context, t *testing.T, pool *pgxpool.Pool, lock1, lock2 int32, check func()) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var waiting bool
		// The two-int4 form of an advisory lock shows as classid, objid
		// and objsubid 2.
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks
			WHERE locktype = 'advisory' AND NOT granted
			AND classid = $1::int4::oid AND objid = $2::int4::oid AND objsubid = 2)`, lock1, lock2).Scan(&waiting)
		if err != nil {
			t.Fatalf("polling pg_locks: %v", err)
		}
		if waiting {
			return
		}
		check()
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("the late Begin did not wait for the advisory lock within 10s")
}
