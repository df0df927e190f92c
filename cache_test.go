package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
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
		"nil store":       {nil, nil},
		"typed-nil store": {(*idempotency.MemoryStore)(nil), nil},
		"negative TTL":    {idempotency.NewMemoryStore(), &idempotency.CacheOptions{TTL: -1}},
		"negative bytes":  {idempotency.NewMemoryStore(), &idempotency.CacheOptions{MaxBytes: -1}},
		"too small":       {idempotency.NewMemoryStore(), &idempotency.CacheOptions{MaxBytes: 1000}},
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

// TestReplayCacheKeepsEmptyBody: an answer from memory is the store's, an
// empty body included: the MemoryStore tells nil from empty, so must the
// cache, or a replay changes with whether it was cached.
func TestReplayCacheKeepsEmptyBody(t *testing.T) {
	c := newCache(t, idempotency.NewMemoryStore(), &idempotency.CacheOptions{TTL: time.Hour})
	ctx := context.Background()
	rec, _ := begin(t, c, "k", "fp", t0)
	if err := c.Complete(ctx, "k", rec.Token, idempotency.Response{Status: 204, Body: []byte{}}, t0, time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, what := range []string{"from the store", "from memory"} {
		if rec, _ := begin(t, c, "k", "fp", t0); rec.Response.Body == nil {
			t.Errorf("replay %s: Body is nil, want the empty body stored", what)
		}
	}
	if st := c.Stats(); st.Hits != 1 {
		t.Fatalf("Stats = %+v, want one hit", st)
	}
}

// TestReplayCacheGetForgetsWhatTheStoreLost: when Get finds that the store
// no longer holds the record the cache holds (deleted through another
// instance, or claimed again), the cache forgets it. The proxy's admin API
// reads a key before deleting it and answers 404 for a key the store does
// not hold: without this, an operator could not make an instance stop
// replaying a key deleted elsewhere.
func TestReplayCacheGetForgetsWhatTheStoreLost(t *testing.T) {
	ctx := context.Background()
	for _, then := range []string{"deleted", "claimed again"} {
		t.Run(then, func(t *testing.T) {
			s := idempotency.NewMemoryStore()
			c := newCache(t, s, &idempotency.CacheOptions{TTL: time.Hour})
			finish(t, c, "k", "fp", "one", t0, time.Hour)
			begin(t, c, "k", "fp", t0) // cached
			if err := s.Delete(ctx, "k"); err != nil {
				t.Fatal(err)
			}
			want := error(idempotency.ErrNotFound)
			if then == "claimed again" {
				want = nil
				if _, ok, err := s.Begin(ctx, "k", "fp", t0, time.Minute, time.Hour); err != nil || !ok {
					t.Fatalf("claim behind the cache = %v, %v", ok, err)
				}
			}
			if _, err := c.Get(ctx, "k", t0); !errors.Is(err, want) {
				t.Fatalf("Get = %v, want %v", err, want)
			}
			rec, ok := begin(t, c, "k", "fp", t0)
			if rec.State == idempotency.Done {
				t.Fatalf("Begin after Get saw the record %s = %v %q: replayed from memory", then, ok, rec.Response.Body)
			}
		})
	}
}

// TestReplayCacheGetKeepsTheSameRecord: a Get that finds the record the
// cache holds leaves it cached.
func TestReplayCacheGetKeepsTheSameRecord(t *testing.T) {
	cs := &countingStore{Store: idempotency.NewMemoryStore()}
	c := newCache(t, cs, &idempotency.CacheOptions{TTL: time.Hour})
	finish(t, c, "k", "fp", "one", t0, time.Hour)
	begin(t, c, "k", "fp", t0)
	if _, err := c.Get(context.Background(), "k", t0); err != nil {
		t.Fatal(err)
	}
	before := cs.begins.Load()
	begin(t, c, "k", "fp", t0)
	if cs.begins.Load() != before {
		t.Error("a Get of the cached record made the next replay ask the store")
	}
}

// TestReplayCacheMemoryWithinMaxBytes: what the cache holds on the heap
// (entries, their map and queue, copies of keys, bodies and headers) stays
// within MaxBytes, for records shaped like HTTP responses (a short body and
// a few header fields), where the memory beyond the bytes themselves counts
// most.
func TestReplayCacheMemoryWithinMaxBytes(t *testing.T) {
	const max = 4 << 20
	s := idempotency.NewMemoryStore()
	ctx := context.Background()
	hdr := map[string][]string{
		"Content-Type": {"application/json"},
		"Date":         {"Thu, 03 Dec 2026 12:00:00 GMT"},
		"X-Request-Id": {"0123456789abcdef"},
	}
	body := []byte(`{"id":"order-0123456789","state":"accepted","amount":1200,"currency":"EUR"}`)
	const n = 30000 // several times what fits
	for i := range n {
		k := fmt.Sprint("order-", i)
		rec, _, err := s.Begin(ctx, k, "fp-0123456789abcdef", t0, time.Minute, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, k, rec.Token, idempotency.Response{Status: 201, Header: hdr, Body: body}, t0, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	c := newCache(t, s, &idempotency.CacheOptions{TTL: time.Hour, MaxBytes: max})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range n {
		if _, _, err := c.Begin(ctx, fmt.Sprint("order-", i), "fp-0123456789abcdef", t0, time.Minute, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	st := c.Stats()
	if held > max*11/10 {
		t.Errorf("the cache holds %d bytes of heap for %d entries under MaxBytes %d (it counts %d)", held, st.Entries, max, st.Bytes)
	}
	if st.Entries == 0 || st.Entries == n {
		t.Errorf("%d entries of %d cached: the test does not fill the cache", st.Entries, n)
	}
	runtime.KeepAlive(c)
}

func TestReplayCacheForgetAll(t *testing.T) {
	cs := &countingStore{Store: idempotency.NewMemoryStore()}
	c := newCache(t, cs, &idempotency.CacheOptions{TTL: time.Hour})
	for i := range 100 {
		k := fmt.Sprint("k", i)
		finish(t, c, k, "fp", "x", t0, time.Hour)
		begin(t, c, k, "fp", t0)
	}
	if st := c.Stats(); st.Entries != 100 {
		t.Fatalf("Stats = %+v, want 100 entries", st)
	}
	c.ForgetAll()
	if st := c.Stats(); st.Entries != 0 || st.Bytes != 0 {
		t.Fatalf("Stats after ForgetAll = %+v", st)
	}
	before := cs.begins.Load()
	begin(t, c, "k7", "fp", t0)
	if cs.begins.Load() != before+1 {
		t.Error("a replay after ForgetAll did not ask the store")
	}
	begin(t, c, "k7", "fp", t0) // cached again
	if cs.begins.Load() != before+1 {
		t.Error("the cache does not fill again after ForgetAll")
	}
}

// TestReplayCacheGetDuringMiss: a Begin that read the finished record from
// the store before it was deleted elsewhere, and answers after a Get
// through the cache found the key gone, must not cache the deleted record:
// a Get that finds a record gone stops it being replayed here at once,
// whether or not the cache held it when the Get looked. The same holds when
// the key was finished again elsewhere and the Get found the new record,
// already cached.
func TestReplayCacheGetDuringMiss(t *testing.T) {
	ctx := context.Background()
	for _, then := range []string{"deleted", "finished again"} {
		t.Run(then, func(t *testing.T) {
			ms := idempotency.NewMemoryStore()
			cs := &countingStore{Store: ms}
			c := newCache(t, cs, &idempotency.CacheOptions{TTL: time.Hour})
			finish(t, ms, "k", "fp", "old", t0, time.Hour)
			cs.afterBegin = func() {
				cs.afterBegin = nil // once; the hook runs on the test's goroutine
				func() {
					// The store answered the old record; before the answer
					// is cached, the key is deleted elsewhere and an
					// operator looks it up through this process.
					if err := ms.Delete(ctx, "k"); err != nil {
						t.Error(err)
					}
					want := error(idempotency.ErrNotFound)
					if then == "finished again" {
						want = nil
						finish(t, ms, "k", "fp", "new", t0, time.Hour)
						if rec, _ := begin(t, c, "k", "fp", t0); string(rec.Response.Body) != "new" { // cached
							t.Errorf("the new record replays %q", rec.Response.Body)
						}
					}
					if _, err := c.Get(ctx, "k", t0); !errors.Is(err, want) {
						t.Errorf("Get = %v, want %v", err, want)
					}
				}()
			}
			if rec, _ := begin(t, c, "k", "fp", t0); string(rec.Response.Body) != "old" {
				t.Fatalf("Begin = %v %q, want the old record, read before the Delete", rec.State, rec.Response.Body)
			}
			rec, ok := begin(t, c, "k", "fp", t0)
			if string(rec.Response.Body) == "old" {
				t.Fatalf("Begin after the Get = %v %v %q: the record the Get found gone was cached", ok, rec.State, rec.Response.Body)
			}
		})
	}
}
