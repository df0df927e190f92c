package boltstore

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/google/go-cmp/cmp"
	bolt "go.etcd.io/bbolt"
)

// openTest opens a Store on a fresh file that is closed, and checked for
// consistency, when the test ends.
func openTest(t testing.TB, opts *Options) *Store {
	t.Helper()
	path := filepath.Join(t.TempDir(), "idem.db")
	s, err := Open(path, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() {
		if s.closed.Load() {
			return
		}
		checkFile(t, s.DB())
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// checkFile runs bbolt's consistency check.
func checkFile(t testing.TB, db *bolt.DB) {
	t.Helper()
	err := db.View(func(tx *bolt.Tx) error {
		var errs []error
		for err := range tx.Check() {
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	})
	if err != nil {
		t.Errorf("bbolt consistency check of %s: %v", db.Path(), err)
	}
}

// counts returns the number of records and of expiry index entries.
func counts(t testing.TB, s *Store) (recs, index int) {
	t.Helper()
	err := s.db.View(func(tx *bolt.Tx) error {
		b, err := s.buckets(tx)
		if err != nil {
			return err
		}
		recs, index = b.recs.Stats().KeyN, b.exp.Stats().KeyN
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return recs, index
}

var (
	ctx = context.Background()
	t0  = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
)

const (
	lease     = 10 * time.Second
	retention = time.Hour
)

func TestOptionsValidated(t *testing.T) {
	cases := []Options{
		{OpenTimeout: -1},
		{MaxBatchSize: -1},
		{MaxBatchDelay: -time.Millisecond},
		{SweepBatch: -1},
	}
	for _, o := range cases {
		path := filepath.Join(t.TempDir(), "x.db")
		if s, err := Open(path, &o); !errors.Is(err, idempotency.ErrInvalidConfig) {
			if s != nil {
				s.Close()
			}
			t.Errorf("Open(%+v) error = %v, want ErrInvalidConfig", o, err)
		}
	}
	if _, err := New(nil, nil); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("New(nil) error = %v, want ErrInvalidConfig", err)
	}
	db, err := bolt.Open(filepath.Join(t.TempDir(), "nosync.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.NoSync = true
	if _, err := New(db, nil); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("New(NoSync DB) error = %v, want ErrInvalidConfig", err)
	}
}

// A second Open of a locked file fails after OpenTimeout with
// ErrUnavailable and bbolt's ErrTimeout: one process per file.
func TestOpenLocked(t *testing.T) {
	s := openTest(t, nil)
	other, err := Open(s.DB().Path(), &Options{OpenTimeout: 100 * time.Millisecond})
	if err == nil {
		other.Close()
		t.Fatal("second Open of a locked file succeeded")
	}
	if !errors.Is(err, idempotency.ErrUnavailable) || !errors.Is(err, bolt.ErrTimeout) {
		t.Errorf("second Open error = %v, want ErrUnavailable and bolt.ErrTimeout", err)
	}
}

func TestLifecycle(t *testing.T) {
	s := openTest(t, nil)
	rec, ok, err := s.Begin(ctx, "k", "fp", t0, lease, retention)
	if err != nil || !ok || rec.State != idempotency.Processing || rec.Token == 0 {
		t.Fatalf("Begin = %+v, %v, %v; want a Processing claim", rec, ok, err)
	}
	if want := t0.Add(lease); !rec.LeaseUntil.Equal(want) {
		t.Errorf("LeaseUntil = %v, want %v", rec.LeaseUntil, want)
	}
	if _, ok, _ := s.Begin(ctx, "k", "fp", t0.Add(lease-1), lease, retention); ok {
		t.Fatal("Begin inside the lease claimed the key")
	}
	if got, ok, _ := s.Begin(ctx, "k", "other", t0, lease, retention); ok || got.State != idempotency.Conflict {
		t.Fatalf("Begin with another fingerprint = %+v, %v; want Conflict", got, ok)
	}
	resp := idempotency.Response{Status: 201, Header: map[string][]string{"A": {"b"}}, Body: []byte("hi")}
	if err := s.Complete(ctx, "k", rec.Token, resp, t0.Add(time.Second), retention); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	resp.Body[0] = 'X' // the store keeps its own copy
	got, ok, err := s.Begin(ctx, "k", "fp", t0.Add(2*time.Second), lease, retention)
	if err != nil || ok || got.State != idempotency.Done {
		t.Fatalf("Begin after Complete = %+v, %v, %v; want Done", got, ok, err)
	}
	want := idempotency.Response{Status: 201, Header: map[string][]string{"A": {"b"}}, Body: []byte("hi")}
	if diff := cmp.Diff(want, got.Response); diff != "" {
		t.Errorf("replayed response (-want +got):\n%s", diff)
	}
	if !got.ExpiresAt.Equal(t0.Add(time.Second + retention)) {
		t.Errorf("ExpiresAt = %v, want Complete's now + retention", got.ExpiresAt)
	}
	// Past the window the key is new again, with a larger token.
	again, ok, err := s.Begin(ctx, "k", "other", t0.Add(time.Second+retention), lease, retention)
	if err != nil || !ok || again.Token <= rec.Token {
		t.Fatalf("Begin after expiry = %+v, %v, %v; want a claim with a token > %d", again, ok, err, rec.Token)
	}
}

// Tokens grow across takeover, release, delete and expiry, and survive a
// reopen of the file.
func TestTokensIncrease(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tok.db")
	s, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	var last uint64
	now := t0
	claim := func(step string) idempotency.Record {
		t.Helper()
		rec, ok, err := s.Begin(ctx, "k", "fp", now, lease, retention)
		if err != nil || !ok {
			t.Fatalf("%s: Begin = %+v, %v, %v; want a claim", step, rec, ok, err)
		}
		if rec.Token <= last {
			t.Fatalf("%s: token %d is not larger than %d", step, rec.Token, last)
		}
		last = rec.Token
		return rec
	}
	rec := claim("first")
	now = now.Add(lease)
	rec = claim("takeover")
	if err := s.Extend(ctx, "k", rec.Token-1, now, lease); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("Extend with the old token: %v, want ErrLeaseLost", err)
	}
	if err := s.Release(ctx, "k", rec.Token); err != nil {
		t.Fatal(err)
	}
	rec = claim("after release")
	if err := s.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, "k", rec.Token, idempotency.Response{}, now, retention); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("Complete after Delete: %v, want ErrLeaseLost", err)
	}
	claim("after delete")
	now = now.Add(retention + lease)
	claim("after expiry")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now = now.Add(retention + lease)
	claim("after reopen")
}

// Writes sweep expired records and their index entries, a few per write.
func TestSweepOnWrite(t *testing.T) {
	s := openTest(t, &Options{SweepPerWrite: 2})
	const n = 20
	for i := range n {
		if _, ok, err := s.Begin(ctx, fmt.Sprint("old", i), "fp", t0, lease, time.Minute); err != nil || !ok {
			t.Fatalf("Begin: %v %v", ok, err)
		}
	}
	if r, x := counts(t, s); r != n || x != n {
		t.Fatalf("after %d Begins: %d records, %d index entries", n, r, x)
	}
	later := t0.Add(time.Hour)
	for i := range 5 {
		if _, _, err := s.Begin(ctx, fmt.Sprint("new", i), "fp", later, lease, retention); err != nil {
			t.Fatal(err)
		}
	}
	// 5 writes sweep 2 each: 10 old records gone, 5 new ones added.
	if r, x := counts(t, s); r != n-10+5 || x != r {
		t.Errorf("after 5 writes: %d records, %d index entries; want %d of each", r, x, n-10+5)
	}
	if _, err := s.Get(ctx, "old19", later); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Get of an expired record: %v, want ErrNotFound", err)
	}
}

func TestSweep(t *testing.T) {
	s := openTest(t, &Options{SweepPerWrite: -1, SweepBatch: 7})
	const n = 50
	for i := range n {
		ret := time.Minute
		if i%2 == 1 {
			ret = 2 * time.Hour
		}
		if _, _, err := s.Begin(ctx, fmt.Sprint("k", i), "fp", t0, lease, ret); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Sweep(ctx, t0.Add(time.Hour), 10)
	if err != nil || got != 10 {
		t.Fatalf("Sweep(max 10) = %d, %v; want 10", got, err)
	}
	got, err = s.Sweep(ctx, t0.Add(time.Hour), 0)
	if err != nil || got != n/2-10 {
		t.Fatalf("Sweep(all) = %d, %v; want %d", got, err, n/2-10)
	}
	if r, x := counts(t, s); r != n/2 || x != n/2 {
		t.Errorf("after sweeping: %d records, %d index entries; want %d", r, x, n/2)
	}
	for i := 1; i < n; i += 2 {
		if _, err := s.Get(ctx, fmt.Sprint("k", i), t0.Add(time.Hour)); err != nil {
			t.Errorf("live record k%d: %v", i, err)
		}
	}
	// A record whose expiry moved (takeover, Complete) is swept by its new
	// expiry only.
	rec, _, _ := s.Begin(ctx, "moved", "fp", t0, lease, time.Minute)
	if err := s.Complete(ctx, "moved", rec.Token, idempotency.Response{Status: 1}, t0, retention); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sweep(ctx, t0.Add(30*time.Minute), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "moved", t0.Add(30*time.Minute)); err != nil {
		t.Errorf("Get of a completed record after sweeping its old expiry: %v", err)
	}
	if _, x := counts(t, s); x != n/2+1 {
		t.Errorf("%d index entries, want %d (one per record)", x, n/2+1)
	}
}

func TestContextDone(t *testing.T) {
	s := openTest(t, nil)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := s.Begin(cctx, "k", "fp", t0, lease, retention); !errors.Is(err, context.Canceled) {
		t.Fatalf("Begin with a done ctx: %v, want context.Canceled", err)
	}
	if _, err := s.Get(ctx, "k", t0); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("Begin with a done ctx changed the store: Get = %v", err)
	}
	if _, err := s.Sweep(cctx, t0, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sweep with a done ctx: %v", err)
	}
}

func TestClosed(t *testing.T) {
	s := openTest(t, nil)
	rec, _, err := s.Begin(ctx, "k", "fp", t0, lease, retention)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	checks := map[string]error{}
	_, _, checks["begin"] = s.Begin(ctx, "k2", "fp", t0, lease, retention)
	checks["complete"] = s.Complete(ctx, "k", rec.Token, idempotency.Response{}, t0, retention)
	checks["extend"] = s.Extend(ctx, "k", rec.Token, t0, lease)
	checks["release"] = s.Release(ctx, "k", rec.Token)
	checks["delete"] = s.Delete(ctx, "k")
	_, checks["get"] = s.Get(ctx, "k", t0)
	for op, err := range checks {
		if !errors.Is(err, idempotency.ErrUnavailable) || !errors.Is(err, bolt.ErrDatabaseNotOpen) {
			t.Errorf("%s after Close: %v, want ErrUnavailable and bolt.ErrDatabaseNotOpen", op, err)
		}
	}
}

// A Store from New on a DB the caller closed reports ErrUnavailable with
// bbolt's error.
func TestCallerClosedDB(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "c.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Begin(ctx, "k", "fp", t0, lease, retention); !errors.Is(err, idempotency.ErrUnavailable) || !errors.Is(err, bolt.ErrDatabaseNotOpen) {
		t.Errorf("Begin on a closed DB: %v", err)
	}
	if _, err := s.Get(ctx, "k", t0); !errors.Is(err, idempotency.ErrUnavailable) || !errors.Is(err, bolt.ErrDatabaseNotOpen) {
		t.Errorf("Get on a closed DB: %v", err)
	}
}

// Two stores with different buckets share a file without sharing keys; New
// leaves the DB open on Close.
func TestBucketsApart(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "shared.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	a, err := New(db, &Options{Bucket: "a"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(db, &Options{Bucket: "b"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, ok, err := a.Begin(ctx, "k", "fp", t0, lease, retention); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if _, ok, err := b.Begin(ctx, "k", "other", t0, lease, retention); !ok || err != nil {
		t.Fatalf("Begin in bucket b = %v, %v; want a claim independent of bucket a", ok, err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Get(ctx, "k", t0); err != nil {
		t.Errorf("Get through b after a.Close: %v (New must not close the caller's DB)", err)
	}
}

func TestKeys(t *testing.T) {
	s := openTest(t, nil)
	for _, key := range []string{"", "\x00", string(make([]byte, maxKeyLen))} {
		rec, ok, err := s.Begin(ctx, key, "fp", t0, lease, retention)
		if err != nil || !ok {
			t.Fatalf("Begin(key of %d bytes) = %v, %v", len(key), ok, err)
		}
		if err := s.Complete(ctx, key, rec.Token, idempotency.Response{Body: []byte(key)}, t0, retention); err != nil {
			t.Fatal(err)
		}
		if got, err := s.Get(ctx, key, t0); err != nil || string(got.Response.Body) != key {
			t.Fatalf("Get(key of %d bytes) = %v", len(key), err)
		}
	}
	long := string(make([]byte, maxKeyLen+1))
	if _, _, err := s.Begin(ctx, long, "fp", t0, lease, retention); !errors.Is(err, idempotency.ErrUnavailable) || !errors.Is(err, bolt.ErrKeyTooLarge) {
		t.Errorf("Begin with a key over the limit: %v, want ErrUnavailable and bolt.ErrKeyTooLarge", err)
	}
}

// Concurrent writers share transactions (group commit) and each gets the
// answer decided for it: exactly one claim per key.
func TestConcurrentClaims(t *testing.T) {
	s := openTest(t, nil)
	const workers, keys = 32, 50
	var mu sync.Mutex
	claims := map[string]int{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for k := range keys {
				key := fmt.Sprint("k", (k+w)%keys)
				rec, ok, err := s.Begin(ctx, key, "fp", t0, lease, retention)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					mu.Lock()
					claims[key]++
					mu.Unlock()
					if err := s.Complete(ctx, key, rec.Token, idempotency.Response{Body: []byte(key)}, t0, retention); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}
	wg.Wait()
	if len(claims) != keys {
		t.Errorf("%d keys claimed, want %d", len(claims), keys)
	}
	for k, n := range claims {
		if n != 1 {
			t.Errorf("key %s claimed %d times", k, n)
		}
	}
}

// A write that fails in the engine (here a value over bbolt's limit is
// simulated by a failing op) fails alone: its batch neighbours commit.
func TestFailingWriteFailsAlone(t *testing.T) {
	s := openTest(t, nil)
	boom := errors.New("boom")
	ops := []*op{
		{ctx: ctx, done: make(chan struct{}), fn: func(b buckets) error {
			r := rec{state: stateProcessing, token: 1, expiresAt: t0.Add(time.Hour).UnixNano(), fp: "a"}
			return b.put("a", &r, 0, false)
		}},
		{ctx: ctx, done: make(chan struct{}), fn: func(b buckets) error {
			r := rec{state: stateProcessing, token: 2, expiresAt: t0.Add(time.Hour).UnixNano(), fp: "b"}
			if err := b.put("b", &r, 0, false); err != nil {
				return err
			}
			return boom
		}},
	}
	s.commit(ops)
	if !errors.Is(ops[1].err, boom) {
		t.Errorf("failing op err = %v, want boom", ops[1].err)
	}
	if ops[0].err != nil {
		t.Errorf("neighbour op err = %v", ops[0].err)
	}
	if _, err := s.Get(ctx, "a", t0); err != nil {
		t.Errorf("neighbour's write is missing: %v", err)
	}
	if _, err := s.Get(ctx, "b", t0); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("failing op's write was committed: %v", err)
	}
}

// A write whose ctx ends while it waits for its batch returns at once with
// ErrUnavailable and ctx's error; the committer then skips it.
func TestContextEndsWhileQueued(t *testing.T) {
	const delay = 300 * time.Millisecond
	s := openTest(t, &Options{MaxBatchDelay: delay})
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _, err := s.Begin(cctx, "k", "fp", t0, lease, retention)
	if took := time.Since(start); took >= delay {
		t.Errorf("Begin returned after %v, not when its ctx ended", took)
	}
	if !errors.Is(err, idempotency.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Begin whose ctx ended in the queue: %v, want ErrUnavailable and DeadlineExceeded", err)
	}
	// The next write commits after the queued one was considered.
	if _, ok, err := s.Begin(ctx, "other", "fp", t0, lease, retention); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if _, err := s.Get(ctx, "k", t0); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("the abandoned Begin was applied: Get = %v", err)
	}
}

// Close does not wait out MaxBatchDelay with writes queued.
func TestCloseWithDelay(t *testing.T) {
	s := openTest(t, &Options{MaxBatchDelay: time.Hour})
	errc := make(chan error, 1)
	go func() {
		_, _, err := s.Begin(ctx, "k", "fp", t0, lease, retention)
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond) // let the Begin join the batch
	checkFile(t, s.DB())
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited for MaxBatchDelay")
	}
	// Whether the Begin made it into the last batch or not, it has an answer.
	if err := <-errc; err != nil && !errors.Is(err, idempotency.ErrUnavailable) {
		t.Errorf("Begin during Close: %v", err)
	}
}

// A panicking write fails alone, with an error, instead of killing the
// committer or failing its batch: its neighbours, before and after it in
// the batch, commit, and later writes still commit.
func TestPanicInWrite(t *testing.T) {
	s := openTest(t, nil)
	before := &op{ctx: ctx, done: make(chan struct{}), fn: putDone("before")}
	o := &op{ctx: ctx, done: make(chan struct{}), fn: func(buckets) error { panic("bug") }}
	after := &op{ctx: ctx, done: make(chan struct{}), fn: putDone("after")}
	s.commit([]*op{before, o, after})
	if o.err == nil {
		t.Fatal("a panicking write reported no error")
	}
	for _, n := range []struct {
		key string
		o   *op
	}{{"before", before}, {"after", after}} {
		if n.o.err != nil {
			t.Errorf("the write %s the panicking one failed: %v", n.key, n.o.err)
		}
		if _, err := s.Get(ctx, n.key, t0); err != nil {
			t.Errorf("the write %s the panicking one is missing: %v", n.key, err)
		}
	}
	if _, ok, err := s.Begin(ctx, "k", "fp", t0, lease, retention); err != nil || !ok {
		t.Fatalf("Begin after a panicking write: %v, %v", ok, err)
	}
}

// A read must not answer from a commit that has not returned. bbolt shows
// a commit to new read transactions once its meta page is written, before
// that page is synced; until Update returns, a power cut may still undo it.
// The commit is held open here after its meta page (an OnCommit hook), so a
// Get or a replaying Begin that answers from it is caught.
func TestReadWaitsForCommit(t *testing.T) {
	s := openTest(t, nil)
	claim, _, err := s.Begin(ctx, "k", "fp", t0, lease, retention)
	if err != nil {
		t.Fatal(err)
	}
	release := holdCommit(t, s, func(b buckets) error {
		cur, _, err := b.get("k")
		if err != nil {
			return err
		}
		old := cur.expiresAt
		cur.state, cur.leaseUntil = stateDone, 0
		return b.put("k", &cur, old, true)
	})
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if got, err := s.Get(short, "k", t0); err == nil {
		t.Errorf("Get answered %s from a commit under way", got.State)
	}
	if got, _, err := s.Begin(short, "k", "fp", t0, lease, retention); err == nil {
		t.Errorf("Begin answered %s from a commit under way", got.State)
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	got, ok, err := s.Begin(ctx, "k", "fp", t0, lease, retention)
	if err != nil || ok || got.State != idempotency.Done || got.Token != claim.Token {
		t.Errorf("Begin after the commit = %+v, %v, %v; want the Done record replayed", got, ok, err)
	}
}

// holdCommit starts the write fn that stays in its commit, after the meta
// page is synced and before Update returns, until release is called: the
// commit under way that reads see but must not answer from.
func holdCommit(t *testing.T, s *Store, fn func(b buckets) error) (release func() error) {
	t.Helper()
	committing, finish := make(chan struct{}), make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- s.write(ctx, "hold", func(b buckets) error {
			if err := fn(b); err != nil {
				return err
			}
			b.recs.Tx().OnCommit(func() {
				close(committing)
				<-finish
			})
			return nil
		})
	}()
	<-committing
	return func() error {
		close(finish)
		return <-errc
	}
}

// A Begin that will claim does not wait for the commit under way before
// queueing its write: only answers (replays, conflicts, in flight) must
// rest on a synced snapshot. Before, a new key waited a whole commit in its
// read and then another for its own write.
func TestClaimQueuesDuringCommit(t *testing.T) {
	s := openTest(t, nil)
	release := holdCommit(t, s, putDone("held"))
	type answer struct {
		claimed bool
		err     error
	}
	got := make(chan answer, 1)
	go func() {
		_, claimed, err := s.Begin(ctx, "new", "fp", t0, lease, retention)
		got <- answer{claimed, err}
	}()
	queued := false
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if len(s.reqs) == 1 {
			queued = true
			break
		}
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	if !queued {
		t.Error("a claiming Begin did not queue its write while a commit was under way")
	}
	if a := <-got; a.err != nil || !a.claimed {
		t.Errorf("Begin(new) = %v, %v; want a claim", a.claimed, a.err)
	}
	// The held record is answered once synced.
	if rec, ok, err := s.Begin(ctx, "held", "fp", t0, lease, retention); err != nil || ok || rec.State != idempotency.Done {
		t.Errorf("Begin(held) = %+v, %v, %v; want a replay", rec, ok, err)
	}
}

// Writes still queued when the committer stops get an answer: applied, or
// ErrUnavailable; none waits forever.
func TestCloseAnswersQueuedWrites(t *testing.T) {
	s := openTest(t, nil)
	release := holdCommit(t, s, putDone("held"))
	const n = 8
	errc := make(chan error, n)
	for i := range n {
		go func() {
			_, _, err := s.Begin(ctx, fmt.Sprint("k", i), "fp", t0, lease, retention)
			errc <- err
		}()
	}
	for deadline := time.Now().Add(5 * time.Second); len(s.reqs) < n && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	for !s.closed.Load() {
		time.Sleep(time.Millisecond)
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	for range n {
		select {
		case err := <-errc:
			if err != nil && !errors.Is(err, idempotency.ErrUnavailable) {
				t.Errorf("Begin queued at Close: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a Begin queued at Close got no answer")
		}
	}
}

// putDone writes a done record of key, fingerprint "fp".
func putDone(key string) func(b buckets) error {
	return func(b buckets) error {
		r := rec{state: stateDone, token: 1, expiresAt: unixNano(t0.Add(retention)), fp: "fp"}
		return b.put(key, &r, 0, false)
	}
}
