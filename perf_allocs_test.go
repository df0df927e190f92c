//go:build !race

// The race detector changes allocation counts (sync.Pool drops items at
// random under it), so this test runs only without -race.

package idempotency

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestAllocsPerCall is the allocation half of the speed goal (issue 2, item
// 9): at most one allocation per Guard.Do beyond the seed's none, for a new
// key (the claim context; the stored body comes from a slab) and for a
// replay (the caller's copy of the body).
func TestAllocsPerCall(t *testing.T) {
	g := &Guard{Store: NewMemoryStore(), Lease: 30 * time.Second, Retention: time.Hour}
	body := []byte(`{"order":"o","charged":1299}`)
	fn := func(context.Context) (Response, error) { return Response{Status: 201, Body: body}, nil }
	ctx := context.Background()
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("order-%d", i)
	}
	i := 0
	newKey := testing.AllocsPerRun(len(keys)-1, func() {
		if _, out, err := g.Do(ctx, keys[i], "fp", fn); err != nil || out != Executed {
			t.Fatal(out, err)
		}
		i++
	})
	i = 0
	replay := testing.AllocsPerRun(len(keys)-1, func() {
		if _, out, err := g.Do(ctx, keys[i], "fp", fn); err != nil || out != Replayed {
			t.Fatal(out, err)
		}
		i++
	})
	t.Logf("allocations per call: new key %v, replay %v", newKey, replay)
	if newKey > 1 || replay > 1 {
		t.Errorf("allocations per call: new key %v, replay %v; want at most 1 each", newKey, replay)
	}
}
