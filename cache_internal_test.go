package idempotency

import (
	"context"
	"fmt"
	"testing"
	"time"
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
