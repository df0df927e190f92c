package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/archlab/idempotency"
)

// extendScriptStore is a MemoryStore whose Extend is scripted: the nth call
// (from 0) fails when fail(n) says so, and hangs until its ctx ends when
// hang(n) says so. It records when each call was made.
type extendScriptStore struct {
	*idempotency.MemoryStore
	start      time.Time
	fail, hang func(n int) bool

	mu    sync.Mutex
	calls []time.Duration
}

var errExtendDown = fmt.Errorf("store down: %w", idempotency.ErrUnavailable)

func (s *extendScriptStore) Extend(ctx context.Context, key string, token uint64, now time.Time, lease time.Duration) error {
	s.mu.Lock()
	n := len(s.calls)
	s.calls = append(s.calls, time.Since(s.start))
	s.mu.Unlock()
	if s.hang != nil && s.hang(n) {
		<-ctx.Done()
		return fmt.Errorf("extend: %w: %w", idempotency.ErrUnavailable, ctx.Err())
	}
	if s.fail != nil && s.fail(n) {
		return errExtendDown
	}
	return s.MemoryStore.Extend(ctx, key, token, now, lease)
}

func (s *extendScriptStore) attempts() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

// Guard.Timeout only wakes the renewal timer early; it must not move the
// renewals themselves. Whatever the timeout, the renewal attempts of a run
// come at the times they come without one: the same schedule, the same
// retries after failures. A wake-up for the timeout between two retries
// used to send the next retry at once (an attempt the schedule did not
// have, and every later retry shifted).
func TestTimeoutKeepsRenewalSchedule(t *testing.T) {
	always := func(int) bool { return true }
	for _, tc := range []struct {
		name       string
		lease      time.Duration
		renewEvery time.Duration
		fail       func(n int) bool
		run        time.Duration // how long fn runs, whatever its ctx says
		timeouts   []time.Duration
	}{
		{"renewals succeed", 3 * time.Second, 0, nil, 10500 * time.Millisecond,
			[]time.Duration{500 * time.Millisecond, time.Second, 1500 * time.Millisecond, 2 * time.Second, 7 * time.Second}},
		{"RenewEvery longer than Timeout", 30 * time.Second, 20 * time.Second, nil, 50500 * time.Millisecond,
			[]time.Duration{5 * time.Second, 20 * time.Second, 30 * time.Second}},
		{"every renewal fails", 30 * time.Second, 0, always, 40500 * time.Millisecond,
			[]time.Duration{5 * time.Second, 10 * time.Second, 12 * time.Second, 20 * time.Second, 23 * time.Second, 25 * time.Second, 26 * time.Second}},
		{"the first renewals fail", 30 * time.Second, 0, func(n int) bool { return n < 2 }, 60500 * time.Millisecond,
			[]time.Duration{12 * time.Second, 19 * time.Second, 21 * time.Second, 35 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			schedule := func(timeout time.Duration) []time.Duration {
				var got []time.Duration
				synctest.Test(t, func(t *testing.T) {
					store := &extendScriptStore{MemoryStore: idempotency.NewMemoryStore(), start: time.Now(), fail: tc.fail}
					g := &idempotency.Guard{Store: store, Lease: tc.lease, RenewEvery: tc.renewEvery, Timeout: timeout}
					g.Do(context.Background(), "k", "fp", func(ctx context.Context) (idempotency.Response, error) {
						time.Sleep(tc.run)
						return idempotency.Response{Status: 200}, nil
					})
					got = store.attempts()
				})
				return got
			}
			want := schedule(0)
			if len(want) == 0 {
				t.Fatal("no renewal attempt without a Timeout: the case tests nothing")
			}
			for _, timeout := range tc.timeouts {
				if got := schedule(timeout); !slices.Equal(got, want) {
					t.Errorf("Timeout %v: renewal attempts at %v; without a Timeout at %v", timeout, got, want)
				}
			}
		})
	}
}

// The timeout ends fn's ctx on time while a renewal is waiting on a store
// that does not answer: it used to wait for that attempt to give up (up to
// RenewEvery later), and so did every context derived from fn's.
func TestTimeoutWhileRenewalHangs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		derive  func(context.Context) (context.Context, context.CancelFunc)
		timeout time.Duration
	}{
		{"fn's ctx", func(ctx context.Context) (context.Context, context.CancelFunc) { return ctx, func() {} }, 15 * time.Second},
		{"WithCancel", func(ctx context.Context) (context.Context, context.CancelFunc) { return context.WithCancel(ctx) }, 15 * time.Second},
		{"WithTimeout", func(ctx context.Context) (context.Context, context.CancelFunc) {
			return context.WithTimeout(ctx, time.Hour)
		}, 15 * time.Second},
		// Due during the second attempt (sent at 23.5s), after a first
		// one that hung until it gave up at 20s.
		{"second attempt", func(ctx context.Context) (context.Context, context.CancelFunc) { return ctx, func() {} }, 25 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := &extendScriptStore{MemoryStore: idempotency.NewMemoryStore(), start: time.Now(),
					hang: func(int) bool { return true }}
				g := &idempotency.Guard{Store: store, Lease: 30 * time.Second, Timeout: tc.timeout}
				start := time.Now()
				_, out, err := g.Do(context.Background(), "k", "fp", func(ctx context.Context) (idempotency.Response, error) {
					d, cancel := tc.derive(ctx)
					defer cancel()
					<-d.Done()
					if got := time.Since(start); got != tc.timeout {
						t.Errorf("done after %v, want the Timeout %v (renewal attempts at %v)", got, tc.timeout, store.attempts())
					}
					if !errors.Is(d.Err(), context.DeadlineExceeded) {
						t.Errorf("Err = %v, want DeadlineExceeded", d.Err())
					}
					return idempotency.Response{}, d.Err()
				})
				if out != idempotency.Executed || !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Do = %s, %v; want EXECUTED with DeadlineExceeded", out, err)
				}
			})
		})
	}
}

// OnRenew runs on the renewing goroutine; a slow one does not hold the
// timeout up either.
func TestTimeoutWhileOnRenewRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int32
		g := &idempotency.Guard{Store: idempotency.NewMemoryStore(), Lease: 30 * time.Second, Timeout: 12 * time.Second,
			OnRenew: func(string, error) {
				if calls.Add(1) == 1 {
					time.Sleep(5 * time.Second) // from the renewal at 10s to 15s
				}
			}}
		start := time.Now()
		g.Do(context.Background(), "k", "fp", func(ctx context.Context) (idempotency.Response, error) {
			<-ctx.Done()
			if got := time.Since(start); got != 12*time.Second || !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				t.Errorf("done after %v with %v; want the Timeout 12s, DeadlineExceeded", got, ctx.Err())
			}
			// Returns once OnRenew is through: Do waits for it, on a mutex
			// (which a bubble does not count as blocked).
			time.Sleep(10 * time.Second)
			return idempotency.Response{}, nil
		})
		if calls.Load() == 0 {
			t.Error("no renewal: the case tests nothing")
		}
	})
}
