package idempotency

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestReplayCopiesUnderChurn: replays copy a stored body and header
// after the shard is unlocked, while other goroutines store new bodies in
// the same slabs, delete and re-create keys, and sweep and compact shards
// (a short window on a bounded store). Every replay must carry the body and
// header stored for its own key, whole.
func TestReplayCopiesUnderChurn(t *testing.T) {
	s, err := NewMemoryStoreWith(&MemoryOptions{MaxRecords: 3000})
	if err != nil {
		t.Fatal(err)
	}
	var clock atomic.Int64
	clock.Store(time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC).UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	g := &Guard{Store: s, Lease: 5 * time.Millisecond, Retention: 40 * time.Millisecond, Now: now, RenewEvery: -1}
	ctx := context.Background()
	var replays, wrong atomic.Int64
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 4000 {
				clock.Add(int64(10 * time.Microsecond))
				key := fmt.Sprintf("key-%d", (i*7+w*131)%(500+w*400))
				body := strings.Repeat(key+";", 1+i%9) // some in a slab, some not
				fn := func(context.Context) (Response, error) {
					return Response{Status: 200, Body: []byte(body), Header: map[string][]string{"K": {key}}}, nil
				}
				r, err := g.Run(ctx, key, "fp", fn)
				switch {
				case errors.Is(err, ErrInFlight), errors.Is(err, ErrUnavailable), errors.Is(err, ErrLeaseLost):
				case err != nil:
					t.Errorf("%s: %v", key, err)
				case r.Outcome == Replayed:
					replays.Add(1)
					b := string(r.Response.Body)
					if b == "" || strings.ReplaceAll(b, key+";", "") != "" || len(r.Response.Header["K"]) != 1 || r.Response.Header["K"][0] != key {
						wrong.Add(1)
						t.Errorf("%s replayed %q, header %v", key, b, r.Response.Header)
					}
				}
				if i%50 == 0 {
					_ = s.Delete(ctx, key)
				}
			}
		})
	}
	wg.Wait()
	if replays.Load() == 0 {
		t.Fatal("no replays: the test exercised nothing")
	}
	checkShards(t, s)
	t.Logf("%d replays checked", replays.Load())
}
