package idempotency

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// TestReplayCacheQueueFollowsInvalidations: behind an entry that stays,
// entries cached and forgotten out of order do not pile up in the shard's
// queue.
func TestReplayCacheQueueFollowsInvalidations(t *testing.T) {
	s := NewMemoryStore()
	c, err := NewReplayCache(s, &CacheOptions{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, now := context.Background(), time.Unix(1e9, 0)
	finish := func(key string) {
		rec, _, err := s.Begin(ctx, key, "fp", now, time.Minute, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, key, rec.Token, Response{Status: 200}, now, time.Hour); err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.Begin(ctx, key, "fp", now, time.Minute, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	finish("stays")
	sh := c.shard("stays")
	var same []string // keys of the same shard
	for i := 0; len(same) < 8; i++ {
		if k := fmt.Sprint("k", i); c.shard(k) == sh {
			same = append(same, k)
		}
	}
	for i := range 10000 {
		k := same[i%len(same)]
		if err := s.Delete(ctx, k); err != nil {
			t.Fatal(err)
		}
		finish(k)
		c.Forget(k)
		if q := len(sh.queue) - sh.head; q > 2*len(sh.m)+20 {
			t.Fatalf("after %d forgets the queue holds %d slots for %d entries", i+1, q, len(sh.m))
		}
	}
}

// withWall returns a time with mono's monotonic reading and wall's wall
// reading; both must carry a monotonic reading. It is how a clock looks
// after a suspend (the monotonic clock stopped while the wall clock did
// not) or after the wall clock was stepped.
func withWall(t *testing.T, mono, wall time.Time) time.Time {
	t.Helper()
	type layout struct { // time.Time's fields
		wall uint64
		ext  int64
		loc  *time.Location
	}
	m, w := (*layout)(unsafe.Pointer(&mono)), (*layout)(unsafe.Pointer(&wall))
	if m.wall>>63 == 0 || w.wall>>63 == 0 {
		t.Skip("no monotonic reading")
	}
	out := mono
	(*layout)(unsafe.Pointer(&out)).wall = w.wall
	if !out.Round(0).Equal(wall.Round(0)) || out.Sub(mono) != 0 {
		t.Skipf("time.Time's layout changed: %v", out)
	}
	return out
}

// TestReplayCacheAfterSuspend: after a suspend the monotonic clock is behind
// the wall clock by the time asleep. The cache must judge its entries by
// the wall clock, as the store judges records, or it replays a record past
// its ExpiresAt, and one deleted elsewhere hours after its TTL ran out.
func TestReplayCacheAfterSuspend(t *testing.T) {
	ctx := context.Background()
	for _, what := range []string{"expired", "deleted"} {
		t.Run(what, func(t *testing.T) {
			s := NewMemoryStore()
			c, err := NewReplayCache(s, &CacheOptions{TTL: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			slept := time.Now()
			rec, _, err := s.Begin(ctx, "k", "fp", slept, time.Minute, 2*time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Complete(ctx, "k", rec.Token, Response{Status: 200}, slept, 2*time.Hour); err != nil {
				t.Fatal(err)
			}
			if _, _, err := c.Begin(ctx, "k", "fp", slept, time.Minute, 2*time.Hour); err != nil { // cached for the TTL
				t.Fatal(err)
			}
			if what == "deleted" {
				if err := s.Delete(ctx, "k"); err != nil { // behind the cache's back
					t.Fatal(err)
				}
			}
			woke := withWall(t, slept, slept.Add(3*time.Hour))
			rec, claimed, err := c.Begin(ctx, "k", "fp", woke, time.Minute, 2*time.Hour)
			if err != nil || !claimed {
				t.Fatalf("Begin 3h later by the wall clock (and at once by the monotonic one) = %v %v, %v; want a claim (the record was %s)",
					rec.State, claimed, err, what)
			}
		})
	}
}

// TestReplayCacheClockSteppedBack: when the wall clock is stepped back, an
// entry is still served for no longer than the TTL by the monotonic clock,
// not until the wall clock has caught up with its TTL again.
func TestReplayCacheClockSteppedBack(t *testing.T) {
	ctx := context.Background()
	s := NewMemoryStore()
	c, err := NewReplayCache(s, &CacheOptions{TTL: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	read := time.Now()
	rec, _, err := s.Begin(ctx, "k", "fp", read, time.Minute, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, "k", rec.Token, Response{Status: 200}, read, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Begin(ctx, "k", "fp", read, time.Minute, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	later := read.Add(2 * time.Millisecond)
	// The wall clock was stepped back to when the record was read.
	stepped := withWall(t, later, read)
	if _, claimed, err := c.Begin(ctx, "k", "fp", stepped, time.Minute, time.Hour); err != nil || !claimed {
		t.Fatalf("Begin 2ms after a 1ms TTL, with the wall clock stepped back = %v, %v; want a claim", claimed, err)
	}
}

// TestReplayCacheOwnsItsStrings: the key and fingerprint an entry holds are
// copies, so that a key cut from a large string (a message, a body) does
// not keep that string alive beyond what MaxBytes counts.
func TestReplayCacheOwnsItsStrings(t *testing.T) {
	ctx, now := context.Background(), time.Unix(1e9, 0)
	s := NewMemoryStore()
	c, err := NewReplayCache(s, &CacheOptions{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	msg := strings.Repeat("m", 1<<16) + "key" + "fingerprint"
	key, fp := msg[1<<16:1<<16+3], msg[1<<16+3:]
	rec, _, err := s.Begin(ctx, key, fp, now, time.Minute, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, key, rec.Token, Response{Status: 200}, now, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Begin(ctx, key, fp, now, time.Minute, time.Hour); err != nil {
		t.Fatal(err)
	}
	start, end := uintptr(unsafe.Pointer(unsafe.StringData(msg))), uintptr(unsafe.Pointer(unsafe.StringData(msg)))+uintptr(len(msg))
	in := func(s string) bool {
		p := uintptr(unsafe.Pointer(unsafe.StringData(s)))
		return start <= p && p < end
	}
	sh := c.shard(key)
	for k, e := range sh.m {
		if in(k) || in(e.key) {
			t.Errorf("the entry of %q holds the caller's key", k)
		}
		if in(e.rec.Fingerprint) {
			t.Errorf("the entry of %q holds the fingerprint's string as the store answered it", k)
		}
	}
	if len(sh.m) != 1 {
		t.Fatalf("%d entries, want 1", len(sh.m))
	}
}

// TestReplayCacheShardsPadded: a shard's lock and counters, which every
// Begin writes, are at least a cache line away from the next shard's, so
// that Begins of keys in neighbouring shards do not contend for one line.
func TestReplayCacheShardsPadded(t *testing.T) {
	var sh cacheShard
	hot := unsafe.Offsetof(sh.misses) + unsafe.Sizeof(sh.misses) // the fields a Begin writes end here
	if gap := unsafe.Sizeof(sh) - hot; gap < 64 {
		t.Errorf("%d bytes between a shard's counters and the next shard's lock, want at least 64", gap)
	}
}
