package idempotency

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestMemoryQueueBoundedUnderReleases: a key claimed and given back many
// times inside its retention (fn failing with Retryable, as validation
// errors do) leaves the expiry queue about one entry per live record, so
// memory stays bounded by MaxRecords. Every release used to leave its
// claim's entry queued for the full retention (a day by default).
func TestMemoryQueueBoundedUnderReleases(t *testing.T) {
	s, err := NewMemoryStoreWith(&MemoryOptions{MaxRecords: 10})
	if err != nil {
		t.Fatal(err)
	}
	g := &Guard{Store: s}
	refused := Retryable(errors.New("validation failed"))
	const calls = 50000
	for i := range calls {
		key := fmt.Sprintf("k%d", i%8)
		_, out, err := g.Do(context.Background(), key, "fp", func(context.Context) (Response, error) {
			return Response{}, refused
		})
		if out != Executed || !errors.Is(err, refused) {
			t.Fatalf("call %d: %s %v", i, out, err)
		}
	}
	if s.Len() != 0 {
		t.Errorf("Len = %d after every claim was released, want 0", s.Len())
	}
	// Each shard may hold a bounded backlog of stale entries.
	if got, limit := queueLen(s), memShards*(compactMin+1); got > limit {
		t.Errorf("expiry queue holds %d entries for %d records after %d released claims, want at most %d", got, s.Len(), calls, limit)
	}
}

// slowBeginStore answers Begin after a delay and cannot be reached to renew.
type slowBeginStore struct {
	*MemoryStore
	delay time.Duration
}

func (s slowBeginStore) Begin(ctx context.Context, key, fp string, now time.Time, lease, retention time.Duration) (Record, bool, error) {
	time.Sleep(s.delay)
	return s.MemoryStore.Begin(ctx, key, fp, now, lease, retention)
}

func (s slowBeginStore) Extend(context.Context, string, uint64, time.Time, time.Duration) error {
	return fmt.Errorf("extend: %w", ErrUnavailable)
}

// overlapWatch returns an fn that runs until its ctx ends (at most a
// minute) and overlap, which reports whether two runs of it ever
// overlapped: a key run twice at once.
func overlapWatch() (fn func(context.Context) (Response, error), overlap func() bool) {
	var running atomic.Int32
	var overlapped atomic.Bool
	fn = func(ctx context.Context) (Response, error) {
		if running.Add(1) > 1 {
			overlapped.Store(true)
		}
		defer running.Add(-1)
		select {
		case <-ctx.Done():
			return Response{}, ctx.Err()
		case <-time.After(time.Minute):
			return Response{Status: 200}, nil
		}
	}
	return fn, overlapped.Load
}

// TestSlowBeginWithNowSetStopsFnBeforeLease: with Guard.Now set (here to
// the real clock, as a UTC wrapper would be), the lease the store grants
// runs from the Now read before Begin. When no renewal gets through, fn's
// ctx must end before that lease does, however long Begin took to answer;
// it used to be timed from Begin's return, so a second holder could take
// the key over while fn still ran.
func TestSlowBeginWithNowSetStopsFnBeforeLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemoryStore()
		const lease = 10 * time.Second
		g := &Guard{Store: slowBeginStore{mem, 5 * time.Second}, Lease: lease, Now: time.Now}
		other := &Guard{Store: mem, Lease: lease, Now: time.Now}
		fn, overlap := overlapWatch()
		start := time.Now()
		done := make(chan struct{})
		go func() {
			defer close(done)
			g.Do(context.Background(), "k", "fp", fn)
		}()
		time.Sleep(lease + time.Second) // past the lease granted at start
		_, out, err := other.Do(context.Background(), "k", "fp", func(ctx context.Context) (Response, error) {
			fn(ctx)
			return Response{Status: 201}, nil
		})
		<-done
		if out != Executed || err != nil {
			t.Fatalf("takeover %v after the claim: %s %v", time.Since(start), out, err)
		}
		if overlap() {
			t.Errorf("fn ran twice at once for one key: the first holder's ctx outlived its lease of %v", lease)
		}
	})
}

// TestRenewEveryAcceptedMeansRenewed: a RenewEvery that Validate accepts
// must renew the lease before the Guard gives up on it. With RenewEvery at
// or past nine tenths of the lease, the first renewal was due only after
// the Guard's own deadline, so fn's ctx was cancelled on a healthy store
// without a single renewal attempt.
func TestRenewEveryAcceptedMeansRenewed(t *testing.T) {
	for _, every := range []time.Duration{9 * time.Second, 9500 * time.Millisecond} {
		t.Run(every.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := &Guard{Store: NewMemoryStore(), Lease: 10 * time.Second, RenewEvery: every}
				if err := g.Validate(); err != nil {
					if !errors.Is(err, ErrInvalidConfig) {
						t.Fatalf("Validate = %v, want nil or ErrInvalidConfig", err)
					}
					return
				}
				resp, out, err := g.Do(context.Background(), "k", "fp", func(ctx context.Context) (Response, error) {
					select {
					case <-ctx.Done():
						return Response{}, ctx.Err()
					case <-time.After(30 * time.Second):
						return Response{Status: 200}, nil
					}
				})
				if out != Executed || err != nil || resp.Status != 200 {
					t.Errorf("Do with a 30s fn, Lease 10s, RenewEvery %v accepted by Validate: %d %s %v; want 200 Executed", every, resp.Status, out, err)
				}
			})
		})
	}
}

// The queue rebuilt after many releases is still a heap holding every live
// record: live records of many expiries among 20,000 released claims all
// leave at their time, none earlier.
func TestMemoryQueueRebuildKeepsLiveRecords(t *testing.T) {
	s := NewMemoryStore()
	ctx := context.Background()
	t0 := time.Unix(1_000_000, 0)
	const live = 300
	for i := range live {
		key := fmt.Sprintf("live%d", i)
		rec, ok, err := s.Begin(ctx, key, "fp", t0, time.Minute, time.Duration(1+(i*37)%97)*time.Hour)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		if err := s.Complete(ctx, key, rec.Token, Response{Status: 200}, t0, time.Duration(1+(i*37)%97)*time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 20000 {
		key := fmt.Sprintf("gone%d", i%16)
		// Due before every live record: these entries climb to the top of
		// the queue, above live ones, so that dropping them reorders it.
		rec, ok, err := s.Begin(ctx, key, "fp", t0, time.Minute, 30*time.Minute)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		if err := s.Release(ctx, key, rec.Token); err != nil {
			t.Fatal(err)
		}
	}
	for i := range s.shards {
		a := s.shards[i].exp
		for j := 1; j < len(a); j++ {
			if a[(j-1)/2].at > a[j].at {
				t.Fatalf("shard %d: queue is not a heap at %d", i, j)
			}
		}
	}
	// Half way through the expiries, exactly the records due are gone.
	mid := t0.Add(49 * time.Hour)
	for i := range live {
		key := fmt.Sprintf("live%d", i)
		_, err := s.Get(ctx, key, mid)
		due := time.Duration(1+(i*37)%97)*time.Hour <= 49*time.Hour
		if due != errors.Is(err, ErrNotFound) {
			t.Errorf("%s (expires after %dh) at 49h: %v", key, 1+(i*37)%97, err)
		}
	}
	// Sweeping at 49h removes exactly the records due by then: a queue
	// out of heap order hides due records behind one that is not.
	wantLeft := 0
	for i := range live {
		if time.Duration(1+(i*37)%97)*time.Hour > 49*time.Hour {
			wantLeft++
		}
	}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		s.sweep(sh, mid.UnixNano(), 1<<30)
		sh.mu.Unlock()
	}
	if got := s.Len(); got != wantLeft {
		t.Errorf("Len after sweeping everything due at 49h = %d, want %d", got, wantLeft)
	}
}

// dropStale leaves a heap even where dropping the stale entries moves a
// later-due record above an earlier one: a stale root over records due at
// 100 and 50 becomes [100, 50] when only filtered.
func TestDropStaleHeapifies(t *testing.T) {
	s := NewMemoryStore()
	ctx := context.Background()
	t0 := time.Unix(1_000_000, 0)
	sh, _ := s.shard("a")
	b := ""
	for i := 0; b == ""; i++ {
		if o, _ := s.shard(fmt.Sprint("b", i)); o == sh {
			b = fmt.Sprint("b", i)
		}
	}
	ra, _, errA := s.Begin(ctx, "a", "fp", t0, time.Minute, 100*time.Hour)
	rb, _, errB := s.Begin(ctx, b, "fp", t0, time.Minute, 50*time.Hour)
	if errA != nil || errB != nil || ra.Token == 0 || rb.Token == 0 {
		t.Fatal(errA, errB)
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	at := func(k string) int64 { r := sh.get(maphash.String(s.seed, k), k); return r.queuedAt }
	// A valid heap: a stale root, the two live records under it, and
	// enough stale entries below them to call for a rebuild.
	q := expiryHeap{{at: 1, key: "stale-root"}, {at: at("a"), key: "a"}, {at: at(b), key: b}}
	for i := range 2*compactMin + 8 {
		q = append(q, expiry{at: at("a") + int64(i+1), key: fmt.Sprint("stale", i)})
	}
	sh.exp = q
	s.dropStale(sh)
	if len(sh.exp) != 2 {
		t.Fatalf("queue after dropStale holds %d entries, want the 2 live ones", len(sh.exp))
	}
	if sh.exp[0].key != b {
		t.Errorf("queue after dropStale = %+v: the record due first is not on top", sh.exp)
	}
}

// A retention meant as "keep for ever" (past the year 2262 in Unix
// nanoseconds) must not wrap around to an expiry in the past: the retry
// would run again.
func TestHugeRetentionDoesNotWrap(t *testing.T) {
	s := NewMemoryStore()
	ctx := context.Background()
	now := time.Now()
	forever := time.Duration(math.MaxInt64)
	rec, ok, err := s.Begin(ctx, "k", "fp", now, forever, forever)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if _, again, err := s.Begin(ctx, "k", "fp", now.Add(time.Hour), time.Minute, forever); err != nil || again {
		t.Fatalf("Begin an hour into an endless lease claimed again (%v, %v)", again, err)
	}
	if err := s.Complete(ctx, "k", rec.Token, Response{Status: 201}, now, forever); err != nil {
		t.Fatal(err)
	}
	got, again, err := s.Begin(ctx, "k", "fp", now.Add(24*time.Hour), time.Minute, forever)
	if err != nil || again || got.State != Done {
		t.Fatalf("Begin a day after an endless retention = %+v, %v, %v; want the result replayed", got, again, err)
	}
}
