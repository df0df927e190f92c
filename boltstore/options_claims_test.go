package boltstore

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/archlab/idempotency"
)

// TestMaxBatchSizeBoundsATransaction: with a MaxBatchDelay far longer than
// the test, a batch commits only when it is full, so six writes with a
// MaxBatchSize of 3 take exactly two transactions, and none waits for the
// delay. A batch bound of more than 3 would leave writes waiting for the
// delay (their ctx ends them, failing the test); one of less would take
// more transactions.
func TestMaxBatchSizeBoundsATransaction(t *testing.T) {
	s := openTest(t, &Options{MaxBatchSize: 3, MaxBatchDelay: time.Hour})
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	before := s.commits.Load()
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		wg.Go(func() {
			_, ok, err := s.Begin(cctx, fmt.Sprint("k", i), "fp", t0, lease, retention)
			if err == nil && !ok {
				err = errors.New("not claimed")
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Begin k%d: %v", i, err)
		}
	}
	if n := s.commits.Load() - before; n != 2 {
		t.Errorf("6 writes with MaxBatchSize 3 took %d transactions; want 2", n)
	}
}

// TestSweepBatchBoundsATransaction: Sweep removes in transactions of at
// most Options.SweepBatch records.
func TestSweepBatchBoundsATransaction(t *testing.T) {
	s := openTest(t, &Options{SweepPerWrite: -1, SweepBatch: 7})
	const n = 50
	for i := range n {
		if _, _, err := s.Begin(ctx, fmt.Sprint("k", i), "fp", t0, lease, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	before := s.commits.Load()
	got, err := s.Sweep(ctx, t0.Add(time.Hour), 0)
	if err != nil || got != n {
		t.Fatalf("Sweep = %d, %v; want %d", got, err, n)
	}
	if txs, want := s.commits.Load()-before, uint64((n+6)/7); txs != want {
		t.Errorf("Sweep of %d records with SweepBatch 7 took %d transactions; want %d", n, txs, want)
	}
}

// TestCompleteSweeps: each Complete removes SweepPerWrite expired records,
// as each Begin that writes does (TestSweepOnWrite).
func TestCompleteSweeps(t *testing.T) {
	s := openTest(t, &Options{SweepPerWrite: 2})
	rec, ok, err := s.Begin(ctx, "live", "fp", t0, 2*time.Hour, 3*time.Hour)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	for i := range 10 {
		if _, _, err := s.Begin(ctx, fmt.Sprint("old", i), "fp", t0, lease, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Complete(ctx, "live", rec.Token, idempotency.Response{Status: 200}, t0.Add(time.Hour), retention); err != nil {
		t.Fatal(err)
	}
	if r, x := counts(t, s); r != 1+10-2 || x != r {
		t.Errorf("after a Complete: %d records, %d index entries; want %d of each", r, x, 1+10-2)
	}
}

// TestDefaultSweepPerWrite: with nil Options a write removes
// DefaultSweepPerWrite expired records.
func TestDefaultSweepPerWrite(t *testing.T) {
	s := openTest(t, nil)
	for i := range 10 {
		if _, _, err := s.Begin(ctx, fmt.Sprint("old", i), "fp", t0, lease, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok, err := s.Begin(ctx, "new", "fp", t0.Add(time.Hour), lease, retention); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if r, _ := counts(t, s); r != 10-DefaultSweepPerWrite+1 {
		t.Errorf("after one write: %d records; want %d", r, 10-DefaultSweepPerWrite+1)
	}
}

// TestReadsWriteNothing: Get, and Begin's answers (a replay, a conflict,
// a key in flight), come from read transactions: no commit, no fsync.
func TestReadsWriteNothing(t *testing.T) {
	s := openTest(t, nil)
	rec, _, err := s.Begin(ctx, "done", "fp", t0, lease, retention)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, "done", rec.Token, idempotency.Response{Status: 200}, t0, retention); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Begin(ctx, "busy", "fp", t0, lease, retention); err != nil {
		t.Fatal(err)
	}
	before := s.commits.Load()
	if _, err := s.Get(ctx, "done", t0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "absent", t0); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key, fp string
		want    idempotency.State
	}{{"done", "fp", idempotency.Done}, {"done", "other", idempotency.Conflict}, {"busy", "fp", idempotency.Processing}} {
		r, claimed, err := s.Begin(ctx, tc.key, tc.fp, t0, lease, retention)
		if err != nil || claimed || r.State != tc.want {
			t.Fatalf("Begin(%s, %s) = %s, %v, %v; want %s", tc.key, tc.fp, r.State, claimed, err, tc.want)
		}
	}
	if n := s.commits.Load() - before; n != 0 {
		t.Errorf("reads and Begin's answers took %d write transactions; want none", n)
	}
}

// TestDefaults: nil Options mean the documented defaults; Open's Store
// keeps its records in DefaultBucket.
func TestDefaults(t *testing.T) {
	o, err := (*Options)(nil).resolve()
	if err != nil {
		t.Fatal(err)
	}
	want := Options{Bucket: DefaultBucket, OpenTimeout: DefaultOpenTimeout, MaxBatchSize: DefaultMaxBatchSize,
		SweepPerWrite: DefaultSweepPerWrite, SweepBatch: DefaultSweepBatch}
	if o != want {
		t.Errorf("nil Options resolve to %+v; want %+v", o, want)
	}
	if DefaultOpenTimeout != 5*time.Second || DefaultBucket != "idempotency" {
		t.Errorf("DefaultOpenTimeout %v, DefaultBucket %q; the docs say 5s and idempotency", DefaultOpenTimeout, DefaultBucket)
	}
	s := openTest(t, nil)
	if _, _, err := s.Begin(ctx, "k", "fp", t0, lease, retention); err != nil {
		t.Fatal(err)
	}
	err = s.DB().View(func(tx *bolt.Tx) error {
		top := tx.Bucket([]byte(DefaultBucket))
		if top == nil || top.Bucket(recordsBucket) == nil || top.Bucket(recordsBucket).Get(recordKey("k")) == nil {
			return fmt.Errorf("no record k in bucket %q", DefaultBucket)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

// TestNewRefusesWhatItCannotUse: New refuses a read-only DB and Options
// with a bucket name bbolt cannot take, with ErrInvalidConfig.
func TestNewRefusesWhatItCannotUse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ro.db")
	s, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	ro, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if s, err := New(ro, nil); !errors.Is(err, idempotency.ErrInvalidConfig) {
		if s != nil {
			s.Close()
		}
		t.Errorf("New(read-only DB) = %v; want ErrInvalidConfig", err)
	}
	long := &Options{Bucket: strings.Repeat("b", bolt.MaxKeySize+1)}
	if s, err := Open(filepath.Join(t.TempDir(), "long.db"), long); !errors.Is(err, idempotency.ErrInvalidConfig) {
		if s != nil {
			s.Close()
		}
		t.Errorf("Open with a bucket name of %d bytes = %v; want ErrInvalidConfig", len(long.Bucket), err)
	}
}
