package idempotency

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"time"
)

// CacheOptions configure NewReplayCache; nil means defaults.
type CacheOptions struct {
	// TTL is how long a finished record, once read from the store, is
	// answered from memory before the store is asked again (0: one
	// second). It is how late this process may notice that the record was
	// deleted through another process (an operator evicting the key on
	// another instance) or behind this module's back. Deletes, claims and
	// completions made through the cache itself take effect at once, and so
	// does a Get through it that finds the record gone. The TTL and the
	// record's ExpiresAt are judged by the wall clock of the now arguments
	// (as the store judges), and the TTL also by their monotonic clock when
	// they carry one. In front of a store that judges by its server's
	// clock (redisstore's ServerClock), a record may be answered after its
	// window ended by that clock, by as much as the now arguments run
	// behind it, and never for longer than the TTL after it was read.
	TTL time.Duration
	// MaxBytes bounds the memory held by cached records: keys,
	// fingerprints, bodies, headers and the cache's own bookkeeping, as
	// estimated (0: 64 MiB; at least 80 KiB). The oldest entries leave
	// first; a record whose estimate (its bytes and about 320 more) is
	// over MaxBytes/64 is not cached.
	MaxBytes int64
}

// ReplayCache is a Store that answers replays of finished records from
// process memory, in front of a store shared by several processes (Redis,
// PostgreSQL, bbolt on a slow disk). A finished record never changes
// until it is deleted or leaves the window, so the only cost of answering
// it from memory is how late a deletion made elsewhere is seen: at most
// TTL. Everything else (claims, in-flight answers, conflicts, Get) goes to
// the store every time, so the cache never lets a request run twice: a
// record it holds is one the store said was finished with the same
// fingerprint.
//
// A store that announces deletions keeps caches coherent across processes:
// run redisstore's or pgstore's WatchDeletes with Forget and ForgetAll
// (and a function that logs the feed's failures), and a deletion made
// anywhere is forgotten here within milliseconds; the TTL then only bounds what a
// broken feed or a lost announcement costs.
//
// Use it when replays are frequent (clients that retry hard, at-least-once
// consumers) and the shared store is the bottleneck. Do not use it in
// front of a MemoryStore, which is already in memory and which the Guard
// reaches by a faster path of its own.
type ReplayCache struct {
	store    Store
	ttl      time.Duration
	maxShard int64 // bytes per shard
	seed     maphash.Seed
	shards   [cacheShards]cacheShard
}

var _ Store = (*ReplayCache)(nil)

const (
	cacheShards = 64
	// cacheOverhead approximates an entry's memory beyond its strings and
	// body: the entry itself (240 bytes), its map slot and its place in the
	// queue, both counted for the spare room they grow with.
	cacheOverhead = 320
)

// cacheShard is a map of entries with a queue in insertion order, from
// which the oldest leave when the shard is over its budget or past their
// time. An entry is immutable once inserted: a hit copies it after the
// lock is released.
type cacheShard struct {
	mu    sync.Mutex
	m     map[string]*cacheEntry
	queue []*cacheEntry // insertion order from head; removed entries are marked gone
	head  int
	bytes int64
	// gen counts invalidations: a miss inserts what the store answered
	// only if no invalidation of the shard happened while it asked, so a
	// record deleted or claimed meanwhile is never put back.
	gen          uint64
	hits, misses uint64
	_            [64]byte // keep shards on separate cache lines
}

// Times. The wall readings (at, until) are what the store judges by: an
// entry is never served past the record's ExpiresAt, nor when the wall
// clock reads more than the TTL after the read, as after a suspend, during
// which the monotonic clock stops. fresh keeps the caller's monotonic
// reading, if its clock has one, so that a wall clock stepped back does not
// stretch the TTL either.
type cacheEntry struct {
	key   string
	rec   Record
	at    time.Time // when it was read from the store, by the caller's wall clock
	until time.Time // min(at+TTL, ExpiresAt), wall clock
	fresh time.Time // at+TTL, by the caller's monotonic clock if it has one
	size  int64
	gone  bool
}

// serves reports whether e may answer at now (its fingerprint aside).
func (e *cacheEntry) serves(now time.Time) bool {
	return !now.Before(e.at) && now.Before(e.until) && now.Before(e.fresh)
}

// over reports whether e will never answer again, now being the present.
func (e *cacheEntry) over(now time.Time) bool {
	return !now.Before(e.until) || !now.Before(e.fresh)
}

// NewReplayCache returns a ReplayCache in front of store. A nil store, or a
// nil pointer of a store's type, is refused with ErrInvalidConfig.
func NewReplayCache(store Store, opts *CacheOptions) (*ReplayCache, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: replay cache: nil store", ErrInvalidConfig)
	}
	if checkStore(store) != nil {
		return nil, fmt.Errorf("%w: replay cache: the store is a nil %T (was the error of its constructor ignored?)", ErrInvalidConfig, store)
	}
	if opts == nil {
		opts = &CacheOptions{}
	}
	ttl, max := opts.TTL, opts.MaxBytes
	switch {
	case ttl < 0:
		return nil, fmt.Errorf("%w: replay cache: TTL %v is negative", ErrInvalidConfig, ttl)
	case max < 0:
		return nil, fmt.Errorf("%w: replay cache: MaxBytes %d is negative", ErrInvalidConfig, max)
	}
	if ttl == 0 {
		ttl = time.Second
	}
	if max == 0 {
		max = 64 << 20
	}
	if max < cacheShards*cacheOverhead*4 {
		return nil, fmt.Errorf("%w: replay cache: MaxBytes %d is too small to hold anything (at least %d)",
			ErrInvalidConfig, max, cacheShards*cacheOverhead*4)
	}
	c := &ReplayCache{store: store, ttl: ttl, maxShard: max / cacheShards, seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].m = make(map[string]*cacheEntry)
	}
	return c, nil
}

// Unwrap returns the store behind the cache.
func (c *ReplayCache) Unwrap() Store { return c.store }

// CacheStats count a ReplayCache's answers and what it holds.
type CacheStats struct {
	Hits    uint64 // Begin answered from memory
	Misses  uint64 // Begin asked the store
	Entries int
	Bytes   int64
}

// Stats returns the cache's counters.
func (c *ReplayCache) Stats() CacheStats {
	var st CacheStats
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		st.Hits += sh.hits
		st.Misses += sh.misses
		st.Entries += len(sh.m)
		st.Bytes += sh.bytes
		sh.mu.Unlock()
	}
	return st
}

func (c *ReplayCache) shard(key string) *cacheShard {
	return &c.shards[maphash.String(c.seed, key)%cacheShards]
}

// Begin answers a finished record with the same fingerprint from memory
// while it is fresh; anything else is the store's answer.
func (c *ReplayCache) Begin(ctx context.Context, key, fingerprint string, now time.Time, lease, retention time.Duration) (Record, bool, error) {
	if ctx.Err() != nil {
		// The store says how a done context is answered.
		return c.store.Begin(ctx, key, fingerprint, now, lease, retention)
	}
	sh := c.shard(key)
	sh.mu.Lock()
	if e := sh.m[key]; e != nil {
		if e.rec.Fingerprint == fingerprint && e.serves(now) {
			sh.hits++
			sh.mu.Unlock()
			return copyRecord(&e.rec), false, nil
		}
		if e.over(now) {
			sh.remove(e)
		}
	}
	sh.misses++
	gen := sh.gen
	sh.mu.Unlock()

	rec, claimed, err := c.store.Begin(ctx, key, fingerprint, now, lease, retention)
	switch {
	case err != nil:
	case claimed:
		// The key was free in the store: whatever this process held of it
		// is over.
		c.invalidate(key)
	case rec.State == Done:
		c.insert(sh, gen, key, &rec, now)
	}
	return rec, claimed, err
}

// insert caches a copy of rec, read from the store at now, unless the
// shard saw an invalidation since gen.
func (c *ReplayCache) insert(sh *cacheShard, gen uint64, key string, rec *Record, now time.Time) {
	at := now.Round(0) // the wall reading alone
	until := at.Add(c.ttl)
	if exp := rec.ExpiresAt.Round(0); exp.Before(until) {
		until = exp
	}
	if !at.Before(until) {
		return
	}
	size := cacheOverhead + int64(len(key)+len(rec.Fingerprint)+len(rec.Response.Body)) + headerSize(rec.Response.Header)
	if size > c.maxShard {
		return
	}
	e := &cacheEntry{rec: copyRecord(rec), at: at, until: until, fresh: now.Add(c.ttl), size: size}
	// The key and fingerprint in one string of the cache's own: the
	// caller's may be cut from a larger one, which they would keep alive.
	kf := key + rec.Fingerprint
	e.key, e.rec.Fingerprint = kf[:len(key)], kf[len(key):]
	key = e.key
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.gen != gen {
		return
	}
	if old := sh.m[key]; old != nil {
		sh.remove(old)
	}
	// The oldest leave first: those past their time, then as many as the
	// budget needs.
	for sh.head < len(sh.queue) {
		o := sh.queue[sh.head]
		if !o.gone && !o.over(now) && sh.bytes+size <= c.maxShard {
			break
		}
		if !o.gone {
			sh.remove(o)
		}
		sh.queue[sh.head] = nil
		sh.head++
	}
	sh.m[key] = e
	sh.bytes += size
	sh.queue = append(sh.queue, e)
	// Entries removed out of order stay in the queue as gone; compact it
	// when they are more than half of it, so it follows what is held.
	if live := len(sh.queue) - sh.head; sh.head > len(sh.queue)/2 || live > 2*len(sh.m)+16 {
		q := sh.queue[:0]
		for _, o := range sh.queue[sh.head:] {
			if !o.gone {
				q = append(q, o)
			}
		}
		clear(sh.queue[len(q):])
		sh.queue, sh.head = q, 0
	}
}

// headerSize approximates the memory of a copy of h made by copyRecord:
// the map (its header, a group of eight slots of 41 bytes, and more groups
// at seven eighths full), the array of values and the strings.
func headerSize(h map[string][]string) int64 {
	switch {
	case h == nil:
		return 0
	case len(h) == 0:
		return 48 // the map's header alone
	}
	slots := 8
	for slots*7/8 < len(h) {
		slots *= 2
	}
	n := int64(64 + 41*slots)
	for k, vs := range h {
		n += int64(len(k) + 16*len(vs))
		for _, v := range vs {
			n += int64(len(v))
		}
	}
	return n
}

// remove drops e from the shard's map; its queue slot is skipped later.
func (sh *cacheShard) remove(e *cacheEntry) {
	e.gone = true
	delete(sh.m, e.key)
	sh.bytes -= e.size
}

// invalidate forgets key and stops answers of the store read before now
// from being cached.
func (c *ReplayCache) invalidate(key string) {
	sh := c.shard(key)
	sh.mu.Lock()
	sh.gen++
	if e := sh.m[key]; e != nil {
		sh.remove(e)
	}
	sh.mu.Unlock()
}

// Complete stores the result in the store; the key is then read from the
// store on its next Begin.
func (c *ReplayCache) Complete(ctx context.Context, key string, token uint64, resp Response, now time.Time, retention time.Duration) error {
	err := c.store.Complete(ctx, key, token, resp, now, retention)
	c.invalidate(key)
	return err
}

// Extend is the store's.
func (c *ReplayCache) Extend(ctx context.Context, key string, token uint64, now time.Time, lease time.Duration) error {
	return c.store.Extend(ctx, key, token, now, lease)
}

// Release is the store's, and forgets the key.
func (c *ReplayCache) Release(ctx context.Context, key string, token uint64) error {
	err := c.store.Release(ctx, key, token)
	c.invalidate(key)
	return err
}

// Get always asks the store: it is for operators and for waiters, who
// want the store's view. When the store no longer holds the record the
// cache holds (it was deleted or claimed again elsewhere), the cache
// forgets it, and does not keep what a Begin under way read of the store
// before: an operator who finds that a key is gone, through this process,
// stops it being replayed here.
func (c *ReplayCache) Get(ctx context.Context, key string, now time.Time) (Record, error) {
	rec, err := c.store.Get(ctx, key, now)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return rec, err
	}
	sh := c.shard(key)
	sh.mu.Lock()
	// A Begin that read the store before this Get may answer after it,
	// with a record this Get found gone: whatever the cache holds, what
	// was read before now is not cached.
	sh.gen++
	if e := sh.m[key]; e != nil && (err != nil || rec.State != Done || rec.Token != e.rec.Token) {
		sh.remove(e)
	}
	sh.mu.Unlock()
	return rec, err
}

// Delete deletes the key in the store and forgets it here at once. Other
// processes' caches forget it within their TTL.
func (c *ReplayCache) Delete(ctx context.Context, key string) error {
	c.invalidate(key)
	err := c.store.Delete(ctx, key)
	c.invalidate(key)
	return err
}

// Forget drops key from the cache without touching the store: for a
// process told by other means (a message from another instance) that the
// key was deleted.
func (c *ReplayCache) Forget(key string) { c.invalidate(key) }

// ForgetAll empties the cache without touching the store: for a process
// that may have missed deletions (its notification feed was cut off).
// Answers of the store read before it are not cached either.
func (c *ReplayCache) ForgetAll() {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		sh.gen++
		for _, e := range sh.m {
			e.gone = true
		}
		clear(sh.m)
		clear(sh.queue)
		sh.queue, sh.head, sh.bytes = sh.queue[:0], 0, 0
		sh.mu.Unlock()
	}
}

// copyRecord returns a copy of r that shares no memory with it: the body
// in one allocation, the header's values in one more.
func copyRecord(r *Record) Record {
	out := *r
	out.Response.Body = cloneBytes(r.Response.Body) // nil stays nil, empty stays empty
	if h := r.Response.Header; h != nil {
		n := 0
		for _, vs := range h {
			n += len(vs)
		}
		vals := make([]string, 0, n)
		out.Response.Header = make(map[string][]string, len(h))
		for k, vs := range h {
			start := len(vals)
			vals = append(vals, vs...)
			if vs == nil {
				out.Response.Header[k] = nil
				continue
			}
			out.Response.Header[k] = vals[start:len(vals):len(vals)]
		}
	}
	return out
}
