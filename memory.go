package idempotency

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/archlab/idempotency/internal/wire"
)

// MemoryOptions configure NewMemoryStoreWith; nil means defaults.
type MemoryOptions struct {
	// MaxRecords bounds the number of records held (0: unbounded). When the
	// store is full and no expired record can be reclaimed, Begin fails
	// closed with ErrUnavailable rather than evicting a live record, which
	// would let a retry run a second time. A full store reclaims from every
	// shard but those locked by another call at that moment, so under load
	// a Begin may fail while expired records remain in a busy shard; a
	// retry tries that shard again.
	MaxRecords int
}

// MemoryStore is a Store held in process memory: the default for tests and
// for a single instance that may lose its window on restart. It is sharded
// (one lock per shard), returns copies of everything it holds, and reclaims
// expired records as it is written to, judged by the now it is given: no
// janitor goroutine and no timer, so memory follows the live window.
//
// Limits: records do not survive the process, and instances do not share
// them; use an engine store (boltstore, redisstore, pgstore) for that.
type MemoryStore struct {
	// Fault, when set before the store is used, is called at the start of
	// each operation whose ctx is not done, with its name ("begin",
	// "complete", "extend", "release", "get", "delete"). A non-nil error
	// fails the operation with ErrUnavailable and changes nothing. It is the seed's fault hook; the
	// faultstore package offers a richer one for any Store.
	Fault func(op string) error

	seed   maphash.Seed
	shards [memShards]memShard
	max    int64
	count  atomic.Int64
	tokens atomic.Uint64
}

const (
	memShards = 32
	// sweepPerWrite bounds the expired records reclaimed by one write. It is
	// more than the one heap entry a write adds, so the backlog shrinks as
	// long as writes go on.
	sweepPerWrite = 4
)

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an unbounded MemoryStore.
func NewMemoryStore() *MemoryStore {
	s, _ := NewMemoryStoreWith(nil)
	return s
}

// NewMemoryStoreWith returns a MemoryStore configured by opts.
func NewMemoryStoreWith(opts *MemoryOptions) (*MemoryStore, error) {
	if opts == nil {
		opts = &MemoryOptions{}
	}
	if opts.MaxRecords < 0 {
		return nil, fmt.Errorf("%w: MaxRecords %d is negative", ErrInvalidConfig, opts.MaxRecords)
	}
	return &MemoryStore{seed: maphash.MakeSeed(), max: int64(opts.MaxRecords)}, nil
}

// memShard holds its records in a slice, found through an index of its
// own: an open-addressing table (linear probing) of 8-byte slots, keyed by
// the same seeded hash that chose the shard. A key is hashed once per
// operation, a slot costs a third of a Go map's entry, and an operation reads
// and writes its record in place instead of copying it out of a map and
// back. Positions freed by deletes are reused; when most of the slice is
// free, it is compacted and the index rebuilt, so that memory follows the
// live window after a burst (a Go map never shrinks by itself).
//
// A slot is 0 when empty, slotDeleted once its record is removed (probing
// goes on past it), and otherwise the record's position plus one in its low
// 32 bits under the top 32 bits of the key's hash, which spare most probes a
// look at the record's key.
type memShard struct {
	mu    sync.Mutex
	slots []uint64
	used  int // slots not empty: live and deleted
	recs  []memRecord
	free  []int32
	exp   expiryHeap
	slab  []byte   // where small stored bodies are copied; see keepBody
	_     [64]byte // keep hot shard locks on separate cache lines
}

const (
	// compactMin is the number of free positions below which a shard is
	// never compacted.
	compactMin = 256
	// shardBits are the low bits of a key's hash that choose its shard; the
	// bits above them choose its first slot.
	shardBits   = 5
	slotDeleted = 1<<32 - 1
	minSlots    = 8
)

// get returns key's record, whose hash is h, to read and change in place.
// sh is locked.
func (sh *memShard) get(h uint64, key string) *memRecord {
	if len(sh.slots) == 0 {
		return nil
	}
	mask := uint64(len(sh.slots) - 1)
	tag := h >> 32
	for i := (h >> shardBits) & mask; ; i = (i + 1) & mask {
		v := sh.slots[i]
		if v == 0 {
			return nil
		}
		if v>>32 == tag && uint32(v) != slotDeleted {
			if r := &sh.recs[uint32(v)-1]; r.key == key {
				return r
			}
		}
	}
}

// add stores a new record for key, whose hash is h and which has none, and
// returns it in place. sh is locked.
func (sh *memShard) add(h uint64, key string, rec memRecord) *memRecord {
	rec.key, rec.hash = key, h
	var p int32
	if n := len(sh.free); n > 0 {
		p = sh.free[n-1]
		sh.free = sh.free[:n-1]
		sh.recs[p] = rec
	} else {
		p = int32(len(sh.recs))
		sh.recs = append(sh.recs, rec)
	}
	// At most three quarters of the slots are used, so that probes stay
	// short and always end at an empty slot.
	if (sh.used+1)*4 > len(sh.slots)*3 {
		sh.reindex(len(sh.recs) - len(sh.free))
	} else {
		sh.place(h, p)
	}
	return &sh.recs[p]
}

// place puts position p, of a record whose hash is h, in the first empty or
// deleted slot of its probe sequence.
func (sh *memShard) place(h uint64, p int32) {
	mask := uint64(len(sh.slots) - 1)
	for i := (h >> shardBits) & mask; ; i = (i + 1) & mask {
		switch v := sh.slots[i]; {
		case v == 0:
			sh.used++
			fallthrough
		case uint32(v) == slotDeleted:
			sh.slots[i] = h>>32<<32 | uint64(p+1)
			return
		}
	}
}

// reindex rebuilds the index, without deleted slots, for live records: at
// least twice as many slots, so the next rebuild is as many adds away.
func (sh *memShard) reindex(live int) {
	n := minSlots
	for n < 2*live {
		n *= 2
	}
	sh.slots, sh.used = make([]uint64, n), 0
	for p := range sh.recs {
		if r := &sh.recs[p]; r.state != 0 {
			sh.place(r.hash, int32(p))
		}
	}
}

// remove deletes the record rec, which get returned. sh is locked.
func (sh *memShard) remove(rec *memRecord) {
	var p int32
	mask := uint64(len(sh.slots) - 1)
	for i := (rec.hash >> shardBits) & mask; ; i = (i + 1) & mask {
		if v := sh.slots[i]; v != 0 && uint32(v) != slotDeleted && &sh.recs[uint32(v)-1] == rec {
			p = int32(uint32(v) - 1)
			sh.slots[i] = slotDeleted
			break
		}
	}
	*rec = memRecord{} // drop its references
	sh.free = append(sh.free, p)
	if len(sh.free) >= compactMin && len(sh.free) > len(sh.recs)/2 {
		sh.compact()
	}
}

// compact moves the live records to a new slice of their size and rebuilds
// the index for it. Its cost, one pass over the live records, is paid at
// most once per as many deletes as there are live records.
func (sh *memShard) compact() {
	live := len(sh.recs) - len(sh.free)
	recs := make([]memRecord, 0, live)
	for i := range sh.recs {
		if r := &sh.recs[i]; r.state != 0 {
			recs = append(recs, *r)
		}
	}
	sh.recs, sh.free = recs, nil
	sh.reindex(live)
}

// Bodies up to slabMax bytes are copied into a shard's current slab of
// slabSize bytes instead of an allocation of their own: a new key then costs
// one allocation for its body every slabSize/len(body) calls. A slab is freed
// when the last record using it is gone; records mostly leave in the order
// they came (one retention per Guard), so slabs are freed in order too. The
// worst case (one long-lived record per slab) holds slabSize per record.
const (
	slabSize = 2048
	slabMax  = 128
)

// memState is State in one byte.
type memState uint8

const (
	memProcessing memState = iota + 1
	memDone
)

// memRecord is a Record with times as Unix nanoseconds (0: zero time) and
// the state in a byte (0: a free position). It is held by value in its
// shard's slice: no allocation per record.
//
// The fields every Begin reads come first, in the record's first 64 bytes:
// one cache line where the record is line-aligned.
type memRecord struct {
	expiresAt  int64
	leaseUntil int64
	fp         string
	body       []byte
	state      memState
	status     int
	token      uint64
	hdr        []byte // the header, encoded (see keepHeader); nil: no header
	// queuedAt is the time of the expiry queue entry that stands for this
	// record (see sweep).
	queuedAt int64
	key      string // the record's own key
	hash     uint64 // and its hash, for reindex
}

func (r *memRecord) record(withResponse bool) Record {
	rec := Record{Fingerprint: r.fp, Token: r.token,
		LeaseUntil: unixTime(r.leaseUntil), ExpiresAt: unixTime(r.expiresAt)}
	if r.state == memDone {
		rec.State = Done
	} else {
		rec.State = Processing
	}
	if withResponse {
		rec.Response = Response{Status: r.status, Body: cloneBytes(r.body), Header: decodeHeader(r.hdr)}
	}
	return rec
}

// answers reports whether Begin at n answers from r without writing: r is
// live, and its key is not for this fingerprint, or done, or leased.
func (r *memRecord) answers(fingerprint string, n int64) bool {
	return n < r.expiresAt && (r.fp != fingerprint || r.state == memDone || n < r.leaseUntil)
}

func unixTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// cloneBytes is slices.Clone with one exact-size allocation.
func cloneBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	out := make([]byte, len(b))
	copy(out, b)
	return out
}

// A stored header is encoded into bytes, which the collector does not
// scan, instead of kept as a map of slices, which it must scan on every
// cycle for as long as the record lives. Per field: the name's length and
// the name, the number of values plus one (0: a nil slice), then each
// value's length and the value, lengths as uvarints.

// keepHeader returns the store's encoding of h, in sh's slab when it is
// small. sh is locked by the caller.
func (sh *memShard) keepHeader(h map[string][]string) []byte {
	if h == nil {
		return nil
	}
	n := 0
	for k, v := range h {
		n += uvarintLen(len(k)) + len(k) + uvarintLen(len(v)+1)
		for _, s := range v {
			n += uvarintLen(len(s)) + len(s)
		}
	}
	if n == 0 {
		return []byte{} // an empty header, not none
	}
	var b []byte
	if n <= slabMax {
		if cap(sh.slab)-len(sh.slab) < n {
			sh.slab = make([]byte, 0, slabSize)
		}
		b = sh.slab[len(sh.slab):len(sh.slab)]
	} else {
		b = make([]byte, 0, n)
	}
	for k, v := range h {
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
		if v == nil {
			b = binary.AppendUvarint(b, 0)
			continue
		}
		b = binary.AppendUvarint(b, uint64(len(v)+1))
		for _, s := range v {
			b = binary.AppendUvarint(b, uint64(len(s)))
			b = append(b, s...)
		}
	}
	if n <= slabMax {
		sh.slab = sh.slab[:len(sh.slab)+n]
	}
	return b[:n:n]
}

func uvarintLen(x int) int {
	n := 1
	for ; x >= 0x80; x >>= 7 {
		n++
	}
	return n
}

// decodeHeader rebuilds a header that keepHeader encoded, with three
// allocations whatever its size: the map, one array holding every value
// slice (each capped, so that appending to one cannot overwrite the next),
// and one string holding every name and value.
func decodeHeader(b []byte) map[string][]string {
	if b == nil {
		return nil
	}
	var fields, vals, size int
	for r := b; len(r) > 0; {
		k := uvar(&r)
		size += k
		r = r[k:]
		nv := uvar(&r)
		fields++
		for range max(nv-1, 0) {
			l := uvar(&r)
			size += l
			r = r[l:]
			vals++
		}
	}
	var sb strings.Builder
	sb.Grow(size)
	for r := b; len(r) > 0; {
		k := uvar(&r)
		sb.Write(r[:k])
		r = r[k:]
		for range max(uvar(&r)-1, 0) {
			l := uvar(&r)
			sb.Write(r[:l])
			r = r[l:]
		}
	}
	all := sb.String()
	out := make(map[string][]string, fields)
	arr := make([]string, vals)
	for r := b; len(r) > 0; {
		k := uvar(&r)
		name := all[:k]
		all, r = all[k:], r[k:]
		nv := uvar(&r)
		if nv == 0 {
			out[name] = nil
			continue
		}
		v := arr[: nv-1 : nv-1]
		arr = arr[nv-1:]
		for i := range v {
			l := uvar(&r)
			v[i] = all[:l]
			all, r = all[l:], r[l:]
		}
		out[name] = v
	}
	return out
}

// uvar reads a uvarint that keepHeader wrote from the front of *b.
func uvar(b *[]byte) int {
	x, n := binary.Uvarint(*b)
	*b = (*b)[n:]
	return int(x)
}

// keepBody returns the store's own copy of b. sh is locked by the caller.
func (sh *memShard) keepBody(b []byte) []byte {
	switch {
	case b == nil:
		return nil
	case len(b) == 0:
		return []byte{}
	case len(b) > slabMax:
		return cloneBytes(b)
	}
	if cap(sh.slab)-len(sh.slab) < len(b) {
		sh.slab = make([]byte, 0, slabSize)
	}
	i := len(sh.slab)
	sh.slab = append(sh.slab, b...)
	return sh.slab[i:len(sh.slab):len(sh.slab)]
}

// shard returns key's shard and its hash.
func (s *MemoryStore) shard(key string) (*memShard, uint64) {
	h := maphash.String(s.seed, key)
	return &s.shards[h%memShards], h
}

func (s *MemoryStore) fault(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("idempotency: memory %s: %w", op, err)
	}
	if s.Fault != nil {
		if err := s.Fault(op); err != nil {
			return fmt.Errorf("idempotency: memory %s: %w: %w", op, ErrUnavailable, err)
		}
	}
	return nil
}

// Begin implements Store.
func (s *MemoryStore) Begin(ctx context.Context, key, fingerprint string, now time.Time, lease, retention time.Duration) (Record, bool, error) {
	if err := s.fault(ctx, "begin"); err != nil {
		return Record{}, false, err
	}
	sh, h := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	rec, claimed, err := s.claim(sh, h, key, fingerprint, now.UnixNano(), nil, lease, retention)
	switch {
	case err != nil:
		return Record{}, false, err
	case claimed:
		return rec.record(false), true, nil
	case rec.fp != fingerprint:
		return Record{State: Conflict, Fingerprint: rec.fp, ExpiresAt: unixTime(rec.expiresAt)}, false, nil
	default:
		return rec.record(rec.state == memDone), false, nil
	}
}

// beginResult is Begin for the Guard, at now in Unix nanoseconds: it
// answers straight into res, which is zero, without building a Record, and
// copies a replayed response after unlocking (stored bytes are never
// written again: see keepBody). The answer is Begin's in every case; claimed
// is Begin's second result, and res.Outcome is set only when it is false.
// When local is not nil, now is the local clock's reading, which may run
// late (see localClock): a Begin that writes reads time.Now into *local and
// decides by it instead. The caller has called the fault hook already
// (s.fault), before reading the clock.
func (s *MemoryStore) beginResult(key, fingerprint string, now int64, local *time.Time, lease, retention time.Duration, res *Result) (claimed bool, err error) {
	sh, h := s.shard(key)
	sh.mu.Lock()
	rec, claimed, err := s.claim(sh, h, key, fingerprint, now, local, lease, retention)
	var body, hdr []byte
	switch {
	case err != nil:
	case claimed:
		res.Token = rec.token
	case rec.fp != fingerprint:
		res.Outcome = Conflicted
	case rec.state == memDone:
		res.Outcome = Replayed
		res.Response.Status = rec.status
		body, hdr = rec.body, rec.hdr
		res.ExpiresAt = unixTime(rec.expiresAt)
	default:
		res.Outcome = InFlight
		res.LeaseUntil = unixTime(rec.leaseUntil)
	}
	sh.mu.Unlock()
	if res.Outcome == Replayed {
		res.Response.Body = cloneBytes(body)
		res.Response.Header = decodeHeader(hdr)
	}
	return claimed, err
}

// claim makes Begin's decision at n (Unix nanoseconds), with sh locked. It
// returns key's record as it stands after the call, to be read in place
// while sh stays locked, and whether this call claimed it. An answer that is
// not a claim is a conflict when the record's fingerprint differs, a replay
// when it is done, and in flight otherwise. When local is not nil, n may run
// late, and is used only for an answer that writes nothing: otherwise
// time.Now is read into *local and the decision made at it.
func (s *MemoryStore) claim(sh *memShard, h uint64, key, fingerprint string, n int64, local *time.Time, lease, retention time.Duration) (rec *memRecord, claimed bool, err error) {
	rec = sh.get(h, key)
	if rec != nil && rec.answers(fingerprint, n) {
		return rec, false, nil // an answer that writes nothing sweeps nothing
	}
	if local != nil {
		*local = time.Now()
		if n = local.UnixNano(); rec != nil && rec.answers(fingerprint, n) {
			return rec, false, nil
		}
	}
	if s.sweep(sh, n, sweepPerWrite) {
		rec = sh.get(h, key) // the sweep may have removed it, or moved it (compact)
	}
	if rec == nil || n >= rec.expiresAt {
		if rec == nil && !s.reserve(sh, n) {
			return nil, false, fmt.Errorf("idempotency: memory begin: %w: store full (%d records)", ErrUnavailable, s.max)
		}
		fresh := memRecord{fp: fingerprint, state: memProcessing, token: s.tokens.Add(1),
			leaseUntil: wire.After(n, lease), expiresAt: wire.After(n, retention)}
		fresh.queuedAt = fresh.expiresAt
		if rec == nil {
			rec = sh.add(h, key, fresh)
		} else {
			fresh.key, fresh.hash = rec.key, rec.hash
			*rec = fresh
		}
		sh.exp.push(expiry{at: fresh.expiresAt, key: key})
		return rec, true, nil
	}
	if rec.answers(fingerprint, n) {
		return rec, false, nil
	}
	rec.token = s.tokens.Add(1)
	rec.leaseUntil = wire.After(n, lease)
	rec.expiresAt = max(rec.expiresAt, rec.leaseUntil)
	return rec, true, nil
}

// reserve counts one more record, reclaiming expired ones from every shard
// when the store is full. sh is locked by the caller.
func (s *MemoryStore) reserve(sh *memShard, now int64) bool {
	if s.max == 0 {
		s.count.Add(1)
		return true
	}
	if s.take() {
		return true
	}
	s.sweep(sh, now, -1)
	for i := range s.shards {
		// TryLock: two full shards sweeping each other must not deadlock. A
		// shard that is busy is being written to, and writes sweep it.
		if o := &s.shards[i]; o != sh && o.mu.TryLock() {
			s.sweep(o, now, -1)
			o.mu.Unlock()
		}
	}
	return s.take()
}

// take counts one more record if the store has room for it. It never
// counts one too many, even for a moment (as adding and taking back would):
// Len would read more than MaxRecords, and a Begin that came for a record
// given back meanwhile would be refused.
func (s *MemoryStore) take() bool {
	for {
		n := s.count.Load()
		if n >= s.max {
			return false
		}
		if s.count.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// sweep removes up to limit expired records (limit < 0: all) from sh, and
// reports whether it removed any (which may have moved the others).
//
// Each record has one entry in the shard's expiry queue, at its queuedAt,
// which is never later than its expiresAt: writes that push expiresAt back
// (Complete, Extend, a takeover) leave the entry alone, and the sweep that
// finds the record still live queues it again at its new expiry. So a write
// costs no queue push, and the queue holds about one entry per record.
// Entries of records since removed or re-created are stale (their time is
// not the record's queuedAt) and dropped.
func (s *MemoryStore) sweep(sh *memShard, now int64, limit int) (removed bool) {
	for n := 0; limit < 0 || n < limit; n++ {
		e, ok := sh.exp.popDue(now)
		if !ok {
			return removed
		}
		rec := sh.get(maphash.String(s.seed, e.key), e.key)
		if rec == nil || rec.queuedAt != e.at {
			continue
		}
		if rec.expiresAt <= now {
			sh.remove(rec)
			s.count.Add(-1)
			removed = true
			continue
		}
		rec.queuedAt = rec.expiresAt
		sh.exp.push(expiry{at: rec.expiresAt, key: e.key})
	}
	return removed
}

// dropStale rebuilds sh's expiry queue without its stale entries once they
// outnumber the live records by compactMin. A released or deleted record
// leaves its entry queued until the entry's time, a retention away: without
// this, a key claimed and given back in a loop would hold one entry per
// release, whatever MaxRecords. The cost, one pass over the queue, is paid
// at most once per as many releases as there are live records. sh is locked.
func (s *MemoryStore) dropStale(sh *memShard) {
	if len(sh.exp) <= 2*(len(sh.recs)-len(sh.free))+compactMin {
		return
	}
	kept := sh.exp[:0]
	for _, e := range sh.exp {
		if r := sh.get(maphash.String(s.seed, e.key), e.key); r != nil && r.queuedAt == e.at {
			kept = append(kept, e)
		}
	}
	clear(sh.exp[len(kept):])
	for i := len(kept)/2 - 1; i >= 0; i-- { // heapify, in linear time
		siftDown(kept, i)
	}
	if cap(kept) > 1024 && len(kept) < cap(kept)/4 {
		kept = slices.Clone(kept)
	}
	sh.exp = kept
}

// Complete implements Store.
func (s *MemoryStore) Complete(ctx context.Context, key string, token uint64, resp Response, now time.Time, retention time.Duration) error {
	if err := s.fault(ctx, "complete"); err != nil {
		return err
	}
	n := now.UnixNano()
	sh, h := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	rec := sh.get(h, key)
	if rec == nil || rec.token != token || rec.state != memProcessing {
		return fmt.Errorf("idempotency: memory complete: %w", ErrLeaseLost)
	}
	rec.state = memDone
	rec.status, rec.hdr, rec.body = resp.Status, sh.keepHeader(resp.Header), sh.keepBody(resp.Body)
	rec.leaseUntil = 0
	rec.expiresAt = wire.After(n, retention)
	if rec.expiresAt < rec.queuedAt {
		// A shorter retention than the claim's: queue the earlier expiry.
		rec.queuedAt = rec.expiresAt
		sh.exp.push(expiry{at: rec.expiresAt, key: key})
	}
	s.sweep(sh, n, sweepPerWrite)
	return nil
}

// Extend implements Store.
func (s *MemoryStore) Extend(ctx context.Context, key string, token uint64, now time.Time, lease time.Duration) error {
	if err := s.fault(ctx, "extend"); err != nil {
		return err
	}
	sh, h := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	rec := sh.get(h, key)
	if rec == nil || rec.token != token || rec.state != memProcessing {
		return fmt.Errorf("idempotency: memory extend: %w", ErrLeaseLost)
	}
	rec.leaseUntil = wire.After(now.UnixNano(), lease)
	rec.expiresAt = max(rec.expiresAt, rec.leaseUntil)
	return nil
}

// Release implements Store.
func (s *MemoryStore) Release(ctx context.Context, key string, token uint64) error {
	if err := s.fault(ctx, "release"); err != nil {
		return err
	}
	sh, h := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	rec := sh.get(h, key)
	if rec == nil || rec.token != token || rec.state != memProcessing {
		return fmt.Errorf("idempotency: memory release: %w", ErrLeaseLost)
	}
	sh.remove(rec)
	s.count.Add(-1)
	s.dropStale(sh)
	return nil
}

// Get implements Store.
func (s *MemoryStore) Get(ctx context.Context, key string, now time.Time) (Record, error) {
	if err := s.fault(ctx, "get"); err != nil {
		return Record{}, err
	}
	sh, h := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	rec := sh.get(h, key)
	if rec == nil || now.UnixNano() >= rec.expiresAt {
		return Record{}, fmt.Errorf("idempotency: memory get %q: %w", key, ErrNotFound)
	}
	return rec.record(rec.state == memDone), nil
}

// Delete implements Store.
func (s *MemoryStore) Delete(ctx context.Context, key string) error {
	if err := s.fault(ctx, "delete"); err != nil {
		return err
	}
	sh, h := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if rec := sh.get(h, key); rec != nil {
		sh.remove(rec)
		s.count.Add(-1)
		s.dropStale(sh)
	}
	return nil
}

// Len returns the number of records held, including expired ones not yet
// reclaimed.
func (s *MemoryStore) Len() int { return int(s.count.Load()) }

// Keys returns the keys of the live records at now, sorted, for operators
// and tests.
func (s *MemoryStore) Keys(now time.Time) []string {
	n := now.UnixNano()
	var keys []string
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for i := range sh.recs {
			if r := &sh.recs[i]; r.state != 0 && n < r.expiresAt {
				keys = append(keys, r.key)
			}
		}
		sh.mu.Unlock()
	}
	slices.Sort(keys)
	return keys
}

// expiry is a heap entry: key may be reclaimed at at, unless its record was
// since given a later expiry (then a later entry exists for it).
type expiry struct {
	at  int64
	key string
}

// expiryHeap is a binary min-heap on at, typed to avoid container/heap's
// interface conversions on the write path.
type expiryHeap []expiry

func (h *expiryHeap) push(e expiry) {
	*h = append(*h, e)
	a := *h
	i := len(a) - 1
	for i > 0 {
		p := (i - 1) / 2
		if a[p].at <= a[i].at {
			break
		}
		a[p], a[i] = a[i], a[p]
		i = p
	}
}

func (h *expiryHeap) popDue(now int64) (expiry, bool) {
	a := *h
	if len(a) == 0 || a[0].at > now {
		return expiry{}, false
	}
	top := a[0]
	last := len(a) - 1
	a[0] = a[last]
	a[last] = expiry{}
	a = a[:last]
	siftDown(a, 0)
	if cap(a) > 1024 && len(a) < cap(a)/4 {
		a = slices.Clone(a) // give a burst's memory back
	}
	*h = a
	return top, true
}

// siftDown moves a[i] down to its place in the min-heap a.
func siftDown(a []expiry, i int) {
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(a) && a[l].at < a[m].at {
			m = l
		}
		if r < len(a) && a[r].at < a[m].at {
			m = r
		}
		if m == i {
			return
		}
		a[i], a[m] = a[m], a[i]
		i = m
	}
}
