package idempotency

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// serialStore runs every call of the store it wraps under one lock, and
// records which token each Delete removed, so that a test knows which
// record each deletion made elsewhere took away. The concurrency under
// test is the cache's, not the store's.
type serialStore struct {
	mu      sync.Mutex
	s       *MemoryStore
	deleted func(key string, token uint64) // called under mu
	// afterBegin, when set, is called with the store's answer before the
	// cache has it, outside mu.
	afterBegin func(key string, rec Record)
}

func (s *serialStore) Begin(ctx context.Context, key, fp string, now time.Time, lease, retention time.Duration) (Record, bool, error) {
	s.mu.Lock()
	rec, claimed, err := s.s.Begin(ctx, key, fp, now, lease, retention)
	s.mu.Unlock()
	// Between the store's answer and the cache's use of it, where a
	// deletion must not be missed: let the others run, or delete.
	runtime.Gosched()
	if s.afterBegin != nil && err == nil {
		s.afterBegin(key, rec)
	}
	return rec, claimed, err
}

func (s *serialStore) Complete(ctx context.Context, key string, token uint64, resp Response, now time.Time, retention time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.s.Complete(ctx, key, token, resp, now, retention)
}

func (s *serialStore) Extend(ctx context.Context, key string, token uint64, now time.Time, lease time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.s.Extend(ctx, key, token, now, lease)
}

func (s *serialStore) Release(ctx context.Context, key string, token uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.s.Release(ctx, key, token)
}

func (s *serialStore) Get(ctx context.Context, key string, now time.Time) (Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.s.Get(ctx, key, now)
}

func (s *serialStore) Delete(ctx context.Context, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Any record, expired or not: far past every now the test uses.
	if rec, err := s.s.Get(ctx, key, time.Unix(0, 1)); err == nil {
		s.deleted(key, rec.Token)
	}
	return s.s.Delete(ctx, key)
}

// checkCacheShards checks each shard's bookkeeping: bytes is the sum of
// the sizes of the entries in its map, within the shard's budget; every
// entry of the map is in the queue, from its head, and not marked gone;
// every entry of the queue not marked gone is the map's entry for its key.
func checkCacheShards(t *testing.T, c *ReplayCache) {
	t.Helper()
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		var sum int64
		for k, e := range sh.m {
			if e.gone || e.key != k {
				t.Errorf("shard %d: map entry %q is %q, gone %v", i, k, e.key, e.gone)
			}
			sum += e.size
		}
		if sum != sh.bytes || sh.bytes < 0 || sh.bytes > c.maxShard {
			t.Errorf("shard %d: bytes %d, entries sum to %d, budget %d", i, sh.bytes, sum, c.maxShard)
		}
		queued := 0
		for j, e := range sh.queue {
			switch {
			case j < sh.head:
				if e != nil {
					t.Errorf("shard %d: slot %d before the head %d still holds %q", i, j, sh.head, e.key)
				}
			case e == nil:
				t.Errorf("shard %d: slot %d after the head %d is nil", i, j, sh.head)
			case !e.gone:
				queued++
				if sh.m[e.key] != e {
					t.Errorf("shard %d: queued entry %q is not the map's", i, e.key)
				}
			}
		}
		if queued != len(sh.m) {
			t.Errorf("shard %d: %d entries queued, %d in the map", i, queued, len(sh.m))
		}
		sh.mu.Unlock()
	}
}

// TestReplayCacheChurn runs Begins, Completes and Releases through a small
// cache from many goroutines, against deletions through it (Delete) and
// behind it, each followed by what makes it take effect at once here:
// Forget, ForgetAll, or a Get through the cache. No Begin that started
// after a deletion took effect may answer the deleted record; every
// replay is of the caller's fingerprint, carries the body stored for its
// token and is the caller's to change; the shards' bookkeeping stays
// exact. In its second half the clock moves, with a short window and TTL,
// and no replay is of a record past its ExpiresAt.
//
//	IDEMPOTENCY_SEED=n   replay seed n (default: time-based, printed)
func TestReplayCacheChurn(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("IDEMPOTENCY_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d (replay: IDEMPOTENCY_SEED=%d go test -race -run TestReplayCacheChurn -count=1 .)", seed, seed)
	for _, moving := range []bool{false, true} {
		t.Run(fmt.Sprintf("moving clock %v", moving), func(t *testing.T) {
			cacheChurn(t, seed, moving)
		})
	}
}

type churnReplay struct {
	key   string
	token uint64
	start int64 // seq when the Begin was called
}

func cacheChurn(t *testing.T, seed uint64, moving bool) {
	ctx := context.Background()
	var (
		seq       atomic.Int64 // orders the test's events
		clock     atomic.Int64 // Unix nanoseconds
		mu        sync.Mutex
		goneAt    = map[uint64]int64{}  // token → seq when its deletion had taken effect here
		removed   = map[string]uint64{} // key → token its last deletion removed (under the store's lock)
		replays   []churnReplay
		nreplays  atomic.Int64
		nclaims   atomic.Int64
		ndeletes  atomic.Int64
		retention = time.Hour
		ttl       = time.Hour
	)
	clock.Store(time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC).UnixNano())
	if moving {
		retention, ttl = 3*time.Millisecond, time.Millisecond
	}
	ss := &serialStore{s: NewMemoryStore()}
	ss.deleted = func(key string, token uint64) { removed[key] = token }
	c, err := NewReplayCache(ss, &CacheOptions{TTL: ttl, MaxBytes: 64 * cacheShards * cacheOverhead * 4})
	if err != nil {
		t.Fatal(err)
	}
	now := func(r *rand.Rand) time.Time {
		if moving {
			return time.Unix(0, clock.Add(r.Int64N(int64(20*time.Microsecond))))
		}
		return time.Unix(0, clock.Load())
	}
	keys := make([]string, 200)
	for i := range keys {
		keys[i] = fmt.Sprint("key-", i)
	}
	bodyOf := func(key string, token uint64, n int) []byte {
		b := fmt.Appendf(nil, "%s/%d/", key, token)
		for len(b) < n {
			b = append(b, '.')
		}
		return b
	}
	// deleted records that the deletion of key, which removed the token
	// noted by the store, has taken effect in the cache.
	deleted := func(key string) {
		mu.Lock()
		defer mu.Unlock()
		ss.mu.Lock()
		tok, ok := removed[key]
		delete(removed, key)
		ss.mu.Unlock()
		if ok {
			goneAt[tok] = seq.Add(1)
			ndeletes.Add(1)
		}
	}
	var hook atomic.Uint64
	ss.afterBegin = func(key string, rec Record) {
		// Now and then a deletion lands where it is hardest to see: the
		// store has answered a replay that the cache has not yet kept.
		if rec.State == Done && hook.Add(1)%16 == 0 {
			r := rand.New(rand.NewPCG(seed, hook.Load()))
			deleteKey(t, ctx, c, ss, r, key, time.Unix(0, clock.Load()))
			deleted(key)
		}
	}
	var wg sync.WaitGroup
	for w := range 8 {
		r := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Go(func() {
			for range 2500 {
				key := keys[r.IntN(len(keys))]
				if r.IntN(2) == 0 {
					key = keys[r.IntN(4)] // hot keys, where deletions meet Begins
				}
				if w%4 == 3 { // a deleter, mostly of the hot keys
					if r.IntN(4) != 0 {
						key = keys[r.IntN(4)]
					}
					deleteKey(t, ctx, c, ss, r, key, now(r))
					deleted(key)
					continue
				}
				fp := "fp"
				if r.IntN(8) == 0 {
					fp = "other"
				}
				n := now(r)
				start := seq.Add(1)
				rec, claimed, err := c.Begin(ctx, key, fp, n, time.Minute, retention)
				switch {
				case err != nil:
					t.Errorf("Begin(%s): %v", key, err)
				case claimed:
					nclaims.Add(1)
					if r.IntN(6) == 0 {
						_ = c.Release(ctx, key, rec.Token)
						continue
					}
					size := 1 + r.IntN(200)
					if r.IntN(20) == 0 {
						size = int(c.maxShard) // too large to cache
					}
					resp := Response{Status: 200, Body: bodyOf(key, rec.Token, size),
						Header: map[string][]string{"Token": {fmt.Sprint(rec.Token)}}}
					if err := c.Complete(ctx, key, rec.Token, resp, now(r), retention); err != nil && !errors.Is(err, ErrLeaseLost) {
						t.Errorf("Complete(%s): %v", key, err)
					}
					resp.Body[0] = '!' // the caller's, after Complete
					resp.Header["Token"][0] = "changed"
				case rec.State == Done:
					nreplays.Add(1)
					body := string(rec.Response.Body)
					if want := string(bodyOf(key, rec.Token, 0)); rec.Fingerprint != fp || len(body) < len(want) || body[:len(want)] != want ||
						len(rec.Response.Header["Token"]) != 1 || rec.Response.Header["Token"][0] != fmt.Sprint(rec.Token) {
						t.Errorf("Begin(%s, %s) replayed token %d of %s: %q, header %v", key, fp, rec.Token, rec.Fingerprint, body, rec.Response.Header)
					}
					if !n.Before(rec.ExpiresAt) {
						t.Errorf("Begin(%s) at %v replayed a record that expired at %v", key, n, rec.ExpiresAt)
					}
					mu.Lock()
					replays = append(replays, churnReplay{key, rec.Token, start})
					mu.Unlock()
					// The answer is the caller's: changing it changes no
					// later replay.
					rec.Response.Body[0] = '!'
					rec.Response.Header["Token"][0] = "changed"
					rec.Response.Header["Added"] = []string{"x"}
				}
			}
		})
	}
	wg.Add(1)
	go func() { // Stats takes every shard's lock while the others work
		defer wg.Done()
		for range 200 {
			if st := c.Stats(); st.Bytes < 0 || st.Bytes > c.maxShard*cacheShards {
				t.Errorf("Stats = %+v", st)
			}
		}
	}()
	wg.Wait()
	for _, rp := range replays {
		if at, ok := goneAt[rp.token]; ok && at < rp.start {
			t.Errorf("%s: a Begin started at %d replayed token %d, whose deletion took effect at %d", rp.key, rp.start, rp.token, at)
		}
	}
	checkCacheShards(t, c)
	st := c.Stats()
	t.Logf("%d claims, %d replays (%d hits), %d deletions seen; %d entries, %d bytes held at the end",
		nclaims.Load(), nreplays.Load(), st.Hits, ndeletes.Load(), st.Entries, st.Bytes)
	if nreplays.Load() == 0 || st.Hits == 0 || ndeletes.Load() == 0 {
		t.Fatal("the test exercised nothing")
	}
}

// deleteKey deletes key through c, or behind it and then makes the
// deletion take effect in c by one of the ways that promise it at once.
func deleteKey(t *testing.T, ctx context.Context, c *ReplayCache, ss *serialStore, r *rand.Rand, key string, now time.Time) {
	t.Helper()
	if r.IntN(4) == 0 {
		if err := c.Delete(ctx, key); err != nil {
			t.Error(err)
		}
		return
	}
	if err := ss.Delete(ctx, key); err != nil {
		t.Error(err)
	}
	switch r.IntN(8) {
	case 0:
		c.ForgetAll()
	case 1, 2, 3:
		c.Forget(key)
	default:
		if _, err := c.Get(ctx, key, now); err != nil && !errors.Is(err, ErrNotFound) {
			t.Error(err)
		}
	}
}
