package boltstore

import (
	"errors"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/archlab/idempotency"
)

// tamperIndex changes the expiry index behind the Store's back, as an
// older build or a bug might have left it.
func tamperIndex(t *testing.T, s *Store, fn func(b buckets) error) {
	t.Helper()
	err := s.db.Update(func(tx *bolt.Tx) error {
		b, err := s.buckets(tx)
		if err != nil {
			return err
		}
		return fn(b)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A stale index entry of a key (an earlier expiry, left beside the current
// one) must not make the sweep remove the live record it names; the sweep
// drops the stale entry alone, and the record's own entry removes it once
// it expires.
func TestStaleIndexEntryKeepsRecord(t *testing.T) {
	s := openTest(t, &Options{SweepPerWrite: -1})
	rec, _, err := s.Begin(ctx, "k", "fp", t0, lease, retention)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, "k", rec.Token, idempotency.Response{Status: 200}, t0, retention); err != nil {
		t.Fatal(err)
	}
	stale := t0.Add(time.Minute)
	tamperIndex(t, s, func(b buckets) error { return b.exp.Put(expiryKey(unixNano(stale), "k"), nil) })
	if n, err := s.Sweep(ctx, stale, 0); err != nil || n != 0 {
		t.Errorf("Sweep at the stale entry's time = %d, %v; want nothing removed", n, err)
	}
	if got, ok, err := s.Begin(ctx, "k", "fp", stale, lease, retention); err != nil || ok || got.State != idempotency.Done {
		t.Errorf("Begin after sweeping the stale entry = %+v, %v, %v; want a replay", got, ok, err)
	}
	checkIndex(t, s) // the stale entry is gone
	if n, err := s.Sweep(ctx, t0.Add(retention), 0); err != nil || n != 1 {
		t.Errorf("Sweep at the record's expiry = %d, %v; want it removed", n, err)
	}
	if r, x := counts(t, s); r != 0 || x != 0 {
		t.Errorf("after the sweeps: %d records, %d index entries; want none", r, x)
	}
}

// A record whose index entry is missing gets it back with the next write
// of its key, even one that leaves its expiry as it was (an Extend within
// the retention), so that the sweep removes it once it expires instead of
// keeping it forever.
func TestMissingIndexEntryRestoredByWrite(t *testing.T) {
	s := openTest(t, &Options{SweepPerWrite: -1})
	rec, _, err := s.Begin(ctx, "k", "fp", t0, lease, retention)
	if err != nil {
		t.Fatal(err)
	}
	tamperIndex(t, s, func(b buckets) error { return b.exp.Delete(expiryKey(unixNano(rec.ExpiresAt), "k")) })
	// The lease moves, the expiry (retention) does not.
	if err := s.Extend(ctx, "k", rec.Token, t0.Add(time.Second), lease); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, "k", t0.Add(time.Second)); err != nil || !got.ExpiresAt.Equal(rec.ExpiresAt) {
		t.Fatalf("Get after Extend = %+v, %v; want the expiry unchanged", got, err)
	}
	checkIndex(t, s)
	if n, err := s.Sweep(ctx, rec.ExpiresAt, 0); err != nil || n != 1 {
		t.Errorf("Sweep at the record's expiry = %d, %v; want it removed", n, err)
	}
}

// Keys over the limit are refused by every write with ErrUnavailable and
// bbolt's ErrKeyTooLarge, before they reach a transaction (so they fail
// no batch), and Get finds no record under them; the Store goes on.
func TestKeyOverLimit(t *testing.T) {
	s := openTest(t, nil)
	long := string(make([]byte, maxKeyLen+1))
	checks := map[string]error{}
	_, _, checks["begin"] = s.Begin(ctx, long, "fp", t0, lease, retention)
	checks["complete"] = s.Complete(ctx, long, 1, idempotency.Response{}, t0, retention)
	checks["extend"] = s.Extend(ctx, long, 1, t0, lease)
	checks["release"] = s.Release(ctx, long, 1)
	checks["delete"] = s.Delete(ctx, long)
	for op, err := range checks {
		if !errors.Is(err, idempotency.ErrUnavailable) || !errors.Is(err, bolt.ErrKeyTooLarge) {
			t.Errorf("%s with a key of %d bytes: %v, want ErrUnavailable and bolt.ErrKeyTooLarge", op, len(long), err)
		}
	}
	if _, err := s.Get(ctx, long, t0); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Get with a key of %d bytes: %v, want ErrNotFound", len(long), err)
	}
	if n := s.commits.Load(); n != 0 {
		t.Errorf("the refused writes ran %d write transactions, want none", n)
	}
	if _, ok, err := s.Begin(ctx, long[:maxKeyLen], "fp", t0, lease, retention); err != nil || !ok {
		t.Errorf("Begin with a key at the limit after the refusals = %v, %v; want a claim", ok, err)
	}
	checkIndex(t, s)
}
