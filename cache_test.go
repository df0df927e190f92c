package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemtest"
)

func newCache(t *testing.T, s idempotency.Store, opts *idempotency.CacheOptions) *idempotency.ReplayCache {
	t.Helper()
	c, err := idempotency.NewReplayCache(s, opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestReplayCacheConformance(t *testing.T) {
	idemtest.Run(t, idemtest.Harness{
		New: func(t *testing.T) idempotency.Store { return newCache(t, idempotency.NewMemoryStore(), nil) },
		Broken: func(t *testing.T) idempotency.Store {
			s := idempotency.NewMemoryStore()
			s.Fault = func(op string) error { return errors.New("injected: backend down on " + op) }
			return newCache(t, s, nil)
		},
	})
}

// countingStore counts the Begins that reach the store and can hold one
// after the store answered it.
type countingStore struct {
	idempotency.Store
	begins atomic.Int64
	// afterBegin, when set, runs after the store answered a Begin and
	// before the answer goes back.
	afterBegin func()
}

func (s *countingStore) Begin(ctx context.Context, key, fp string, now time.Time, lease, retention time.Duration) (idempotency.Record, bool, error) {
	s.begins.Add(1)
	rec, ok, err := s.Store.Begin(ctx, key, fp, now, lease, retention)
	if s.afterBegin != nil {
		s.afterBegin()
	}
	return rec, ok, err
}

var t0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

// finish claims and completes key with body at now.
func finish(t *testing.T, s idempotency.Store, key, fp, body string, now time.Time, retention time.Duration) {
	t.Helper()
	ctx := context.Background()
	rec, ok, err := s.Begin(ctx, key, fp, now, time.Minute, retention)
	if err != nil || !ok {
		t.Fatalf("Begin(%s) = %v, %v, %v; want a claim", key, rec.State, ok, err)
	}
	resp := idempotency.Response{Status: 201, Header: map[string][]string{"X-Body": {body}}, Body: []byte(body)}
	if err := s.Complete(ctx, key, rec.Token, resp, now, retention); err != nil {
		t.Fatal(err)
	}
}

// begin is Begin through s, failing the test on an error.
func begin(t *testing.T, s idempotency.Store, key, fp string, now time.Time) (idempotency.Record, bool) {
	t.Helper()
	rec, ok, err := s.Begin(context.Background(), key, fp, now, time.Minute, time.Hour)
	if err != nil {
		t.Fatalf("Begin(%s): %v", key, err)
	}
	return rec, ok
}

func TestReplayCacheAnswersFinishedRecordsFromMemory(t *testing.T) {
	cs := &countingStore{Store: idempotency.NewMemoryStore()}
	c := newCache(t, cs, &idempotency.CacheOptions{TTL: time.Second})
	finish(t, c, "k", "fp", "one", t0, time.Hour)

	for i := range 5 {
		rec, ok := begin(t, c, "k", "fp", t0.Add(time.Duration(i)*100*time.Millisecond))
		if ok || rec.State != idempotency.Done || string(rec.Response.Body) != "one" {
			t.Fatalf("replay %d = %v %v %q", i, ok, rec.State, rec.Response.Body)
		}
	}
	// The first replay read the store; the four after it, inside the TTL, did not.
	if got := cs.begins.Load(); got != 2 {
		t.Errorf("Begins that reached the store: %d, want 2 (the claim and the first replay)", got)
	}
	if st := c.Stats(); st.Hits != 4 || st.Entries != 1 || st.Bytes <= 0 {
		t.Errorf("Stats = %+v, want 4 hits and one entry", st)
	}
	// Past the TTL the store is asked again.
	begin(t, c, "k", "fp", t0.Add(time.Second))
	if got := cs.begins.Load(); got != 3 {
		t.Errorf("after the TTL: %d Begins reached the store, want 3", got)
	}
}

func TestReplayCacheNeverAnswersAnotherFingerprint(t *testing.T) {
	c := newCache(t, idempotency.NewMemoryStore(), nil)
	finish(t, c, "k", "fp", "one", t0, time.Hour)
	begin(t, c, "k", "fp", t0) // cached
	rec, ok := begin(t, c, "k", "other", t0)
	if ok || rec.State != idempotency.Conflict {
		t.Fatalf("Begin with another fingerprint = %v %v, want the store's conflict", ok, rec.State)
	}
}

func TestReplayCacheKeepsTheWindow(t *testing.T) {
	c := newCache(t, idempotency.NewMemoryStore(), &idempotency.CacheOptions{TTL: time.Hour})
	finish(t, c, "k", "fp", "one", t0, 10*time.Second)
	begin(t, c, "k", "fp", t0.Add(9*time.Second)) // cached until the record expires, not for the TTL
	rec, ok := begin(t, c, "k", "fp", t0.Add(10*time.Second))
	if !ok {
		t.Fatalf("Begin at the end of the window = %v, want a new claim: the cache outlived the record", rec.State)
	}
}

func TestReplayCacheDeleteThroughItIsSeenAtOnce(t *testing.T) {
	c := newCache(t, idempotency.NewMemoryStore(), &idempotency.CacheOptions{TTL: time.Hour})
	finish(t, c, "k", "fp", "one", t0, time.Hour)
	begin(t, c, "k", "fp", t0)
	if err := c.Delete(context.Background(), "k"); err != nil {
		t.Fatal(err)
	}
	if rec, ok := begin(t, c, "k", "fp", t0); !ok {
		t.Fatalf("Begin after Delete = %v %q, want a claim", rec.State, rec.Response.Body)
	}
}

// TestReplayCacheDeleteElsewhereSeenWithinTTL is the documented limit: a
// deletion made behind the cache's back replays until the TTL runs out.
func TestReplayCacheDeleteElsewhereSeenWithinTTL(t *testing.T) {
	s := idempotency.NewMemoryStore()
	c := newCache(t, s, &idempotency.CacheOptions{TTL: time.Second})
	finish(t, c, "k", "fp", "one", t0, time.Hour)
	begin(t, c, "k", "fp", t0)
	if err := s.Delete(context.Background(), "k"); err != nil {
		t.Fatal(err)
	}
	if _, ok := begin(t, c, "k", "fp", t0.Add(999*time.Millisecond)); ok {
		t.Fatal("the cache asked the store inside its TTL")
	}
	if rec, ok := begin(t, c, "k", "fp", t0.Add(time.Second)); !ok {
		t.Fatalf("Begin past the TTL = %v, want a claim", rec.State)
	}
	c.Forget("k") // nothing cached: a no-op
}

func TestReplayCacheForget(t *testing.T) {
	s := idempotency.NewMemoryStore()
	c := newCache(t, s, &idempotency.CacheOptions{TTL: time.Hour})
	finish(t, c, "k", "fp", "one", t0, time.Hour)
	begin(t, c, "k", "fp", t0)
	if err := s.Delete(context.Background(), "k"); err != nil {
		t.Fatal(err)
	}
	c.Forget("k")
	if _, ok := begin(t, c, "k", "fp", t0); !ok {
		t.Fatal("Begin after Forget replayed a deleted record")
	}
}

// TestReplayCacheDeleteDuringMiss: a Begin that read the finished record
// from the store before a Delete through the cache, and answers after it,
// must not put the deleted record back.
func TestReplayCacheDeleteDuringMiss(t *testing.T) {
	cs := &countingStore{Store: idempotency.NewMemoryStore()}
	c := newCache(t, cs, &idempotency.CacheOptions{TTL: time.Hour})
	finish(t, c, "k", "fp", "one", t0, time.Hour)
	var once sync.Once
	cs.afterBegin = func() {
		once.Do(func() {
			if err := c.Delete(context.Background(), "k"); err != nil {
				t.Error(err)
			}
		})
	}
	if rec, ok := begin(t, c, "k", "fp", t0); ok || rec.State != idempotency.Done {
		t.Fatalf("Begin = %v %v, want the replay read before the Delete", ok, rec.State)
	}
	cs.afterBegin = nil
	if rec, ok := begin(t, c, "k", "fp", t0); !ok {
		t.Fatalf("Begin after the Delete = %v %q: the deleted record was cached", rec.State, rec.Response.Body)
	}
}

// TestReplayCacheClaimForgetsStaleEntry: a record deleted elsewhere and
// claimed again through this cache with another fingerprint is no longer
// answered from memory for the old fingerprint.
func TestReplayCacheClaimForgetsStaleEntry(t *testing.T) {
	s := idempotency.NewMemoryStore()
	c := newCache(t, s, &idempotency.CacheOptions{TTL: time.Hour})
	finish(t, c, "k", "a", "one", t0, time.Hour)
	begin(t, c, "k", "a", t0)
	if err := s.Delete(context.Background(), "k"); err != nil {
		t.Fatal(err)
	}
	if _, ok := begin(t, c, "k", "b", t0); !ok {
		t.Fatal("Begin with b after the Delete: want a claim")
	}
	if rec, ok := begin(t, c, "k", "a", t0); ok || rec.State != idempotency.Conflict {
		t.Fatalf("Begin with a = %v %v, want the store's conflict (b holds the key)", ok, rec.State)
	}
}

func TestReplayCacheAnswersAreTheCallers(t *testing.T) {
	c := newCache(t, idempotency.NewMemoryStore(), nil)
	finish(t, c, "k", "fp", "one", t0, time.Hour)
	for range 3 {
		rec, _ := begin(t, c, "k", "fp", t0)
		if string(rec.Response.Body) != "one" || rec.Response.Header["X-Body"][0] != "one" {
			t.Fatalf("replay = %q %v: an earlier caller's edits leaked into the cache", rec.Response.Body, rec.Response.Header)
		}
		rec.Response.Body[0] = 'X'
		rec.Response.Header["X-Body"][0] = "edited"
		rec.Response.Header["X-New"] = []string{"x"}
	}
	rec, _ := begin(t, c, "k", "fp", t0)
	if _, ok := rec.Response.Header["X-New"]; ok {
		t.Fatal("a caller's new header reached the cache")
	}
}

func TestReplayCacheMemoryBounded(t *testing.T) {
	const max = 1 << 20
	c := newCache(t, idempotency.NewMemoryStore(), &idempotency.CacheOptions{TTL: time.Hour, MaxBytes: max})
	body := string(make([]byte, 1000))
	for i := range 5000 {
		k := fmt.Sprint("k", i)
		finish(t, c, k, "fp", body, t0, time.Hour)
		begin(t, c, k, "fp", t0)
	}
	st := c.Stats()
	if st.Bytes > max || st.Bytes < max/2 {
		t.Errorf("Stats = %+v, want between %d and %d bytes", st, max/2, max)
	}
	if st.Entries >= 5000 || st.Entries == 0 {
		t.Errorf("%d entries held of 5000 inserted under a %d-byte budget", st.Entries, max)
	}
	// A record larger than a shard's budget is not cached, and still replays.
	big := string(make([]byte, max))
	finish(t, c, "big", "fp", big, t0, time.Hour)
	before := c.Stats().Entries
	if rec, _ := begin(t, c, "big", "fp", t0); len(rec.Response.Body) != max {
		t.Fatalf("big replay has %d bytes", len(rec.Response.Body))
	}
	if after := c.Stats(); after.Entries > before || after.Bytes > max {
		t.Errorf("the big record was cached: %+v", after)
	}
}

func TestReplayCacheRejectsBadOptions(t *testing.T) {
	for name, tc := range map[string]struct {
		store idempotency.Store
		opts  *idempotency.CacheOptions
	}{
		"nil store":      {nil, nil},
		"negative TTL":   {idempotency.NewMemoryStore(), &idempotency.CacheOptions{TTL: -1}},
		"negative bytes": {idempotency.NewMemoryStore(), &idempotency.CacheOptions{MaxBytes: -1}},
		"too small":      {idempotency.NewMemoryStore(), &idempotency.CacheOptions{MaxBytes: 1000}},
	} {
		if _, err := idempotency.NewReplayCache(tc.store, tc.opts); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("%s: err = %v, want ErrInvalidConfig", name, err)
		}
	}
}

// TestReplayCacheGuardRunsOnce drives a Guard over the cache from many
// goroutines with deletions through the cache in between: every delete
// lets exactly one more execution happen, and no replay after a delete
// returned shows a response from before it.
func TestReplayCacheGuardRunsOnce(t *testing.T) {
	c := newCache(t, idempotency.NewMemoryStore(), &idempotency.CacheOptions{TTL: time.Hour})
	g, err := idempotency.NewGuard(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	fn := func(context.Context) (idempotency.Response, error) {
		n := runs.Add(1)
		return idempotency.Response{Status: 200, Body: []byte(fmt.Sprint(n))}, nil
	}
	ctx := context.Background()
	for round := int64(1); round <= 20; round++ {
		var wg sync.WaitGroup
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, out, err := g.Do(ctx, "k", "fp", fn)
				if errors.Is(err, idempotency.ErrInFlight) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				if got := string(resp.Body); got != fmt.Sprint(round) {
					t.Errorf("round %d: %v answered %q", round, out, got)
				}
			}()
		}
		wg.Wait()
		if got := runs.Load(); got != round {
			t.Fatalf("round %d: %d executions in all", round, got)
		}
		if err := c.Delete(ctx, "k"); err != nil {
			t.Fatal(err)
		}
	}
}
