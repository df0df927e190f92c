package storeurl

import (
	"context"
	"testing"
	"time"

	"github.com/archlab/idempotency/internal/testenv"
)

// TestClockDefaults: the package doc says whose clock judges leases when a
// URL has no clock=: the Redis server's for redis, the caller's for
// postgres. Told apart by what a store does with a now two hours ahead of
// the real time: judged by the caller's clock the claim of a minute ago has
// left its window of an hour and the key is claimed again; judged by the
// server's, that now is ignored and the claim still holds the key.
func TestClockDefaults(t *testing.T) {
	pg, _ := testenv.PostgresStoreURL(t, "clk")
	for _, tc := range []struct {
		name, url string
		// callerClock: whose clock the URL should select.
		callerClock bool
	}{
		{"redis default", testenv.RedisStoreURL(t, "clk"), false},
		{"redis clock=server", testenv.RedisStoreURL(t, "clk") + "&clock=server", false},
		{"redis clock=caller", testenv.RedisStoreURL(t, "clk") + "&clock=caller", true},
		{"postgres default", pg + "&table=dflt", true},
		{"postgres clock=caller", pg + "&table=caller&clock=caller", true},
		{"postgres clock=server", pg + "&table=server&clock=server", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t, tc.url, Options{Migrate: true})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			now := time.Now()
			if _, ok, err := s.Begin(ctx, "k", "fp", now, time.Minute, time.Hour); err != nil || !ok {
				t.Fatalf("Begin = %v, %v; want a claim", ok, err)
			}
			_, ok, err := s.Begin(ctx, "k", "fp", now.Add(2*time.Hour), time.Minute, time.Hour)
			if err != nil {
				t.Fatalf("Begin two hours ahead: %v", err)
			}
			if ok != tc.callerClock {
				t.Errorf("Begin two hours ahead claimed the key: %v; want %v (judged by the caller's clock: %v)", ok, tc.callerClock, tc.callerClock)
			}
			_ = s.Delete(ctx, "k")
		})
	}
}
