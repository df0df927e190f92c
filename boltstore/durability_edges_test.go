package boltstore

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	bolt "go.etcd.io/bbolt"
)

// checkIndex checks that the records and the expiry index agree: every
// record has the entry of its ExpiresAt, and every entry names a record
// that has that ExpiresAt.
func checkIndex(t *testing.T, s *Store) {
	t.Helper()
	err := s.db.View(func(tx *bolt.Tx) error {
		b, err := s.buckets(tx)
		if err != nil {
			return err
		}
		var errs []error
		err = b.recs.ForEach(func(k, v []byte) error {
			r, err := decode(v)
			if err != nil {
				errs = append(errs, fmt.Errorf("record %q: %w", k, err))
				return nil
			}
			if b.exp.Get(expiryKey(r.expiresAt, string(k[1:]))) == nil {
				errs = append(errs, fmt.Errorf("record %q has no index entry at %d", k[1:], r.expiresAt))
			}
			return nil
		})
		if err != nil {
			return err
		}
		err = b.exp.ForEach(func(k, _ []byte) error {
			if len(k) < 8 {
				errs = append(errs, fmt.Errorf("index entry %x is short", k))
				return nil
			}
			key := string(k[8:])
			r, found, err := b.get(key)
			switch {
			case err != nil:
				errs = append(errs, err)
			case !found:
				errs = append(errs, fmt.Errorf("index entry of %q at %d has no record", key, expiryAt(k)))
			case r.expiresAt != expiryAt(k):
				errs = append(errs, fmt.Errorf("index entry of %q at %d, record expires at %d", key, expiryAt(k), r.expiresAt))
			}
			return nil
		})
		if err != nil {
			return err
		}
		return errors.Join(errs...)
	})
	if err != nil {
		t.Fatalf("records and expiry index disagree: %v", err)
	}
}

// edgeSeed, when not 0, repeats a run of TestIndexFollowsRecords.
var edgeSeed int64

// A random mix of every operation, with a clock that moves forward by
// random steps, keeps the records and the expiry index in step and gives
// the same answers as the MemoryStore; tokens of a key only grow.
func TestIndexFollowsRecords(t *testing.T) {
	seed := edgeSeed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	t.Logf("seed %d (set edgeSeed to repeat)", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	s := openTest(t, &Options{SweepPerWrite: 1, SweepBatch: 3})
	m := idempotency.NewMemoryStore()
	keys := []string{"a", "b", "c", "d"}
	tokens := map[string][2]uint64{} // key: bolt's and memory's last token
	last := map[string]uint64{}      // key: bolt's largest token ever
	now := t0
	dur := func() time.Duration { return time.Duration(rng.IntN(40)) * time.Second }
	for i := range 3000 {
		key := keys[rng.IntN(len(keys))]
		fp := []string{"f1", "f2"}[rng.IntN(2)]
		tok := tokens[key]
		if rng.IntN(10) == 0 {
			tok[0]-- // a stale token now and then
			tok[1]--
		}
		var errB, errM error
		step := ""
		op := rng.IntN(7)
		if _, err := m.Get(ctx, key, now); err != nil && op >= 2 && op <= 4 {
			// A claim on an expired record that is not swept yet: the
			// stores sweep at different paces, so the answers may differ.
			continue
		}
		switch op {
		case 0, 1:
			l, r := dur()+time.Second, dur()+time.Minute
			rb, okB, eb := s.Begin(ctx, key, fp, now, l, r)
			rm, okM, em := m.Begin(ctx, key, fp, now, l, r)
			errB, errM = eb, em
			step = fmt.Sprintf("Begin(%s, %s)", key, fp)
			if okB != okM || rb.State != rm.State || !rb.ExpiresAt.Equal(rm.ExpiresAt) || !rb.LeaseUntil.Equal(rm.LeaseUntil) {
				t.Fatalf("step %d %s: bolt %+v %v, memory %+v %v", i, step, rb, okB, rm, okM)
			}
			if okB {
				if rb.Token <= last[key] {
					t.Fatalf("step %d %s: token %d not above %d", i, step, rb.Token, last[key])
				}
				last[key] = rb.Token
				tokens[key] = [2]uint64{rb.Token, rm.Token}
			}
		case 2:
			r := dur() + time.Minute
			errB = s.Complete(ctx, key, tok[0], idempotency.Response{Status: 200}, now, r)
			errM = m.Complete(ctx, key, tok[1], idempotency.Response{Status: 200}, now, r)
			step = "Complete " + key
		case 3:
			l := dur() + time.Second
			errB = s.Extend(ctx, key, tok[0], now, l)
			errM = m.Extend(ctx, key, tok[1], now, l)
			step = "Extend " + key
		case 4:
			errB = s.Release(ctx, key, tok[0])
			errM = m.Release(ctx, key, tok[1])
			step = "Release " + key
		case 5:
			if rng.IntN(4) == 0 {
				errB = s.Delete(ctx, key)
				errM = m.Delete(ctx, key)
				step = "Delete " + key
			} else {
				_, errB = s.Sweep(ctx, now, rng.IntN(3))
				step = "Sweep"
			}
		case 6:
			now = now.Add(dur())
			continue
		}
		if errors.Is(errB, idempotency.ErrLeaseLost) != errors.Is(errM, idempotency.ErrLeaseLost) ||
			errB != nil && !errors.Is(errB, idempotency.ErrLeaseLost) {
			t.Fatalf("step %d %s: bolt %v, memory %v", i, step, errB, errM)
		}
		for _, k := range keys {
			gb, eb := s.Get(ctx, k, now)
			gm, em := m.Get(ctx, k, now)
			if (eb == nil) != (em == nil) || gb.State != gm.State || !gb.ExpiresAt.Equal(gm.ExpiresAt) {
				t.Fatalf("step %d %s: Get(%s) bolt %+v %v, memory %+v %v", i, step, k, gb, eb, gm, em)
			}
		}
		checkIndex(t, s)
	}
}

// A key at the length limit goes through its whole life, the sweep
// included: its index entry is exactly bbolt's longest key.
func TestLongestKeyLifecycle(t *testing.T) {
	s := openTest(t, &Options{SweepPerWrite: -1})
	key := string(make([]byte, maxKeyLen))
	rec, ok, err := s.Begin(ctx, key, "fp", t0, lease, retention)
	if err != nil || !ok {
		t.Fatalf("Begin = %v, %v", ok, err)
	}
	if err := s.Extend(ctx, key, rec.Token, t0.Add(time.Second), retention+lease); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	checkIndex(t, s)
	if err := s.Complete(ctx, key, rec.Token, idempotency.Response{Status: 200}, t0, retention); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	checkIndex(t, s)
	if n, err := s.Sweep(ctx, t0.Add(retention), 0); err != nil || n != 1 {
		t.Fatalf("Sweep = %d, %v; want the record removed", n, err)
	}
	if r, x := counts(t, s); r != 0 || x != 0 {
		t.Fatalf("after the sweep: %d records, %d index entries", r, x)
	}
	again, ok, err := s.Begin(ctx, key, "fp", t0.Add(retention), lease, retention)
	if err != nil || !ok || again.Token <= rec.Token {
		t.Fatalf("Begin after the sweep = %+v, %v, %v; want a claim above token %d", again, ok, err, rec.Token)
	}
}

// Close while a long Sweep runs: the Sweep stops with ErrUnavailable (or
// ends first), nothing hangs, and the file reopens consistent.
func TestCloseDuringSweep(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sweep.db")
	s, err := Open(path, &Options{SweepPerWrite: -1, SweepBatch: 5})
	if err != nil {
		t.Fatal(err)
	}
	const n = 2000
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				if _, _, err := s.Begin(ctx, fmt.Sprint("k", i), "fp", t0, lease, time.Minute+time.Duration(i)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	type result struct {
		n   int
		err error
	}
	swept := make(chan result, 1)
	go func() {
		n, err := s.Sweep(ctx, t0.Add(time.Hour), 0)
		swept <- result{n, err}
	}()
	for {
		if r, _ := counts(t, s); r < n {
			break
		}
		time.Sleep(100 * time.Microsecond)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	var got result
	select {
	case got = <-swept:
	case <-time.After(10 * time.Second):
		t.Fatal("Sweep did not return after Close")
	}
	t.Logf("Sweep removed %d records before Close: %v", got.n, got.err)
	if got.err != nil && !errors.Is(got.err, idempotency.ErrUnavailable) {
		t.Errorf("Sweep cut by Close: %d, %v; want ErrUnavailable", got.n, got.err)
	}
	s, err = Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	checkFile(t, s.DB())
	checkIndex(t, s)
	if r, _ := counts(t, s); r != n-got.n {
		t.Errorf("%d records left, want %d less the %d Sweep reported", r, n, got.n)
	}
}

// New on a DB whose bucket of that name holds someone else's data refuses
// it rather than mix its own buckets into it (and sweep whatever it takes
// for its index).
func TestNewRefusesForeignBucket(t *testing.T) {
	cases := map[string]func(top *bolt.Bucket) error{
		"other keys": func(top *bolt.Bucket) error {
			return top.Put([]byte("user"), []byte("data"))
		},
		"other buckets": func(top *bolt.Bucket) error {
			_, err := top.CreateBucket([]byte("settings"))
			return err
		},
		"r is not a bucket": func(top *bolt.Bucket) error {
			return top.Put(recordsBucket, []byte("data"))
		},
	}
	for name, fill := range cases {
		t.Run(name, func(t *testing.T) {
			db, err := bolt.Open(filepath.Join(t.TempDir(), "foreign.db"), 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			err = db.Update(func(tx *bolt.Tx) error {
				top, err := tx.CreateBucket([]byte(DefaultBucket))
				if err != nil {
					return err
				}
				return fill(top)
			})
			if err != nil {
				t.Fatal(err)
			}
			s, err := New(db, nil)
			if err == nil {
				s.Close()
			}
			if !errors.Is(err, idempotency.ErrInvalidConfig) {
				t.Fatalf("New on a bucket with %s: %v, want ErrInvalidConfig", name, err)
			}
			err = db.View(func(tx *bolt.Tx) error {
				top := tx.Bucket([]byte(DefaultBucket))
				if top.Bucket(recordsBucket) != nil || top.Bucket(expiryBucket) != nil {
					return errors.New("New added its buckets to the foreign bucket")
				}
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
}

// A retention or lease that runs past the year 2262 (the end of int64
// nanoseconds; "keep forever" written as a huge Duration) must not wrap to
// an expiry in the past: the record would be dead at once and every retry
// would run the operation again.
func TestHugeDurations(t *testing.T) {
	const forever = time.Duration(1<<63 - 1)
	s := openTest(t, nil)
	rec, ok, err := s.Begin(ctx, "k", "fp", t0, forever, forever)
	if err != nil || !ok {
		t.Fatalf("Begin = %v, %v; want a claim", ok, err)
	}
	if got, ok, err := s.Begin(ctx, "k", "fp", t0.Add(time.Hour), lease, forever); err != nil || ok || got.State != idempotency.Processing {
		t.Fatalf("Begin during a lease of %v = %+v, %v, %v; want in flight", forever, got, ok, err)
	}
	if err := s.Extend(ctx, "k", rec.Token, t0.Add(time.Hour), forever); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if err := s.Complete(ctx, "k", rec.Token, idempotency.Response{Status: 200}, t0.Add(time.Hour), forever); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if got, ok, err := s.Begin(ctx, "k", "fp", t0.Add(2*time.Hour), lease, forever); err != nil || ok || got.State != idempotency.Done {
		t.Fatalf("Begin after Complete with retention %v = %+v, %v, %v; want a replay", forever, got, ok, err)
	}
	if _, err := s.Sweep(ctx, t0.Add(24*time.Hour), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "k", t0.Add(24*time.Hour)); err != nil {
		t.Errorf("Get a day later: %v; want the record kept", err)
	}
	checkIndex(t, s)
}
