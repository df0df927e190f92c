package faultstore_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/faultstore"
)

// TestGuardSlowRenewalUnderSynctest is a regression test for a Guard bug:
// renewer.fire held renewer.mu while it called Store.Extend, and
// renewer.stop took renewer.mu, so when fn returned while an Extend was under
// way Do waited on that mutex. In real time that was a delay of up to
// RenewEvery; inside a testing/synctest bubble it was a hang, since a
// goroutine blocked on a sync.Mutex is not durably blocked and the fake timer
// the slow Extend waits on never fires. stop now cancels the renewal under
// way first. A real-time watchdog turns a hang into a failure.
func TestGuardSlowRenewalUnderSynctest(t *testing.T) {
	done := make(chan bool, 1)
	go func() {
		// synctest.Test from a goroutine other than the test's, so that the
		// test can give up on it.
		defer func() { recover() }()
		synctest.Test(t, func(t *testing.T) {
			s := faultstore.New(idempotency.NewMemoryStore(),
				faultstore.OnOps(faultstore.Latency(1, 500*time.Millisecond, 500*time.Millisecond), faultstore.OpExtend))
			g := &idempotency.Guard{Store: s, Lease: 3 * time.Second, RenewEvery: time.Second}
			_, _, err := g.Do(context.Background(), "k", "fp", func(ctx context.Context) (idempotency.Response, error) {
				time.Sleep(1200 * time.Millisecond) // returns while the first renewal (1s..1.5s) is under way
				return idempotency.Response{Status: 200}, nil
			})
			if err != nil {
				t.Errorf("Do: %v", err)
			}
		})
		done <- true
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Guard.Do hung in a synctest bubble: fn returned during a slow Extend and renewer.stop " +
			"blocks on renewer.mu (held by fire across Store.Extend), which synctest does not count as durably blocked")
	}
}
