package idempotency

import (
	"context"
	"testing"
)

// TestClaimContextDropsStoppedAfterFuncs: a context derived from fn's ctx
// and cancelled is forgotten by the claim, so a long fn that derives one
// per downstream call (as an HTTP client does per request) holds memory for
// the calls under way, not for every call it made.
func TestClaimContextDropsStoppedAfterFuncs(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	g := &Guard{Store: NewMemoryStore()}
	_, _, err := g.Do(parent, "k", "fp", func(ctx context.Context) (Response, error) {
		c := ctx.(*claimCtx)
		for range 10000 {
			_, stop := context.WithCancel(ctx)
			stop()
		}
		c.mu.Lock()
		n := len(c.afters)
		c.mu.Unlock()
		if n > 100 {
			t.Errorf("the claim holds %d functions for 10000 derived contexts, all cancelled", n)
		}
		return Response{}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
