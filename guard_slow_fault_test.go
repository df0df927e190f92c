package idempotency

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestSlowFaultHookWithNowSetStopsFnBeforeLease is
// TestSlowBeginWithNowSetStopsFnBeforeLease on the Guard's MemoryStore fast
// path: a Fault hook that injects latency into Begin (as a test of a slow
// store does) must not let fn's ctx outlive the lease the store granted
// from its Now reading. The fast path read Now before the hook and timed
// fn's lease from after it, so a second holder could take the key over
// while fn still ran.
func TestSlowFaultHookWithNowSetStopsFnBeforeLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 10 * time.Second
		mem := NewMemoryStore()
		var begins atomic.Int32
		mem.Fault = func(op string) error {
			switch op {
			case "begin":
				if begins.Add(1) == 1 {
					time.Sleep(lease / 2)
				}
			case "extend":
				return errors.New("partitioned")
			}
			return nil
		}
		g := &Guard{Store: mem, Lease: lease, Now: time.Now}
		fn, overlap := overlapWatch()
		start := time.Now()
		done := make(chan struct{})
		go func() {
			defer close(done)
			g.Do(context.Background(), "k", "fp", fn)
		}()
		// Once the first caller holds the key, another retries every second
		// until it takes the key over.
		time.Sleep(lease / 2)
		var out Outcome
		var err error
		for out != Executed && time.Since(start) < time.Minute {
			time.Sleep(time.Second)
			_, out, err = g.Do(context.Background(), "k", "fp", func(ctx context.Context) (Response, error) {
				fn(ctx)
				return Response{Status: 201}, nil
			})
		}
		<-done
		if out != Executed || err != nil {
			t.Fatalf("takeover %v after the claim: %s %v", time.Since(start), out, err)
		}
		if overlap() {
			t.Errorf("fn ran twice at once for one key: the first holder's ctx outlived its lease of %v", lease)
		}
	})
}
