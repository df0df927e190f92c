package idempotency_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/archlab/idempotency"
)

// Guard.Timeout ends fn's ctx with DeadlineExceeded once it has passed since
// the claim, says so in Deadline, and a fn that fails on it keeps the claim
// (it may have had effects), while renewals go on as usual.
func TestTimeoutEndsFnContext(t *testing.T) {
	for _, tc := range []struct {
		name       string
		lease      time.Duration
		renewEvery time.Duration
		timeout    time.Duration
	}{
		{"shorter than the lease", 30 * time.Second, 0, 5 * time.Second},
		{"over several renewals", 3 * time.Second, 0, 10 * time.Second},
		{"renewal off", 30 * time.Second, -1, 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := idempotency.NewMemoryStore()
				var renewed atomic.Int32
				g := &idempotency.Guard{Store: store, Lease: tc.lease, RenewEvery: tc.renewEvery, Timeout: tc.timeout,
					OnRenew: func(_ string, err error) {
						if err != nil {
							t.Errorf("renewal: %v", err)
						}
						renewed.Add(1)
					}}
				start := time.Now()
				_, out, err := g.Do(context.Background(), "k", "fp", func(ctx context.Context) (idempotency.Response, error) {
					dl, ok := ctx.Deadline()
					if !ok || !dl.Equal(start.Add(tc.timeout)) {
						t.Errorf("Deadline = %v, %v; want %v", dl, ok, start.Add(tc.timeout))
					}
					<-ctx.Done()
					if got := time.Since(start); got != tc.timeout {
						t.Errorf("ctx done after %v, want %v", got, tc.timeout)
					}
					if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
						t.Errorf("Err = %v, want DeadlineExceeded", ctx.Err())
					}
					return idempotency.Response{}, ctx.Err()
				})
				if out != idempotency.Executed || !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("Do = %s, %v; want EXECUTED with DeadlineExceeded", out, err)
				}
				if want := tc.renewEvery >= 0 && tc.timeout > tc.lease; want != (renewed.Load() > 0) {
					t.Errorf("%d renewals during the run", renewed.Load())
				}
				// The claim is kept: the retry waits for the lease.
				_, out, err = g.Do(context.Background(), "k", "fp", func(context.Context) (idempotency.Response, error) {
					t.Error("fn ran again while the timed-out claim was held")
					return idempotency.Response{}, nil
				})
				if out != idempotency.InFlight || !errors.Is(err, idempotency.ErrInFlight) {
					t.Errorf("retry = %s, %v; want IN_FLIGHT", out, err)
				}
			})
		})
	}
}

// A fn that finishes after the timeout with a response has it stored, and
// the renewals kept its claim alive meanwhile.
func TestTimeoutResultStillStored(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &idempotency.Guard{Store: idempotency.NewMemoryStore(), Lease: 3 * time.Second, Timeout: time.Second}
		_, out, err := g.Do(context.Background(), "k", "fp", func(ctx context.Context) (idempotency.Response, error) {
			<-ctx.Done()
			time.Sleep(10 * time.Second) // winds down slowly, over several leases
			return idempotency.Response{Status: 201, Body: []byte("late")}, nil
		})
		if out != idempotency.Executed || err != nil {
			t.Fatalf("Do = %s, %v", out, err)
		}
		resp, out, err := g.Do(context.Background(), "k", "fp", func(context.Context) (idempotency.Response, error) {
			t.Error("fn ran again")
			return idempotency.Response{}, nil
		})
		if out != idempotency.Replayed || err != nil || resp.Status != 201 || string(resp.Body) != "late" {
			t.Errorf("retry = %s, %v, %d %q; want the late result replayed", out, err, resp.Status, resp.Body)
		}
	})
}

// The caller's earlier deadline stays fn's deadline and its reason.
func TestTimeoutCallerDeadlineFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		parent, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		want, _ := parent.Deadline()
		g := &idempotency.Guard{Store: idempotency.NewMemoryStore(), Timeout: time.Minute}
		g.Do(parent, "k", "fp", func(ctx context.Context) (idempotency.Response, error) {
			if dl, ok := ctx.Deadline(); !ok || !dl.Equal(want) {
				t.Errorf("Deadline = %v, %v; want the caller's %v", dl, ok, want)
			}
			<-ctx.Done()
			if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				t.Errorf("Err = %v", ctx.Err())
			}
			return idempotency.Response{}, nil
		})
	})
}

// A context derived from fn's (as an HTTP transport derives one per
// request) ends with it at the timeout.
func TestTimeoutReachesDerivedContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &idempotency.Guard{Store: idempotency.NewMemoryStore(), Timeout: 2 * time.Second}
		start := time.Now()
		g.Do(context.WithoutCancel(context.Background()), "k", "fp", func(ctx context.Context) (idempotency.Response, error) {
			d, cancel := context.WithCancel(ctx)
			defer cancel()
			<-d.Done()
			if time.Since(start) != 2*time.Second || !errors.Is(d.Err(), context.DeadlineExceeded) {
				t.Errorf("derived ctx done after %v with %v", time.Since(start), d.Err())
			}
			return idempotency.Response{}, nil
		})
	})
}

func TestTimeoutAndLeaseValidation(t *testing.T) {
	for _, tc := range []struct {
		g  idempotency.Guard
		ok bool
	}{
		{idempotency.Guard{Timeout: -time.Second}, false},
		{idempotency.Guard{Timeout: time.Nanosecond}, true},
		// Lease/3 would be zero: renewal would silently be off.
		{idempotency.Guard{Lease: 2 * time.Nanosecond}, false},
		{idempotency.Guard{Lease: 2 * time.Nanosecond, RenewEvery: -1}, true},
		{idempotency.Guard{Lease: 3 * time.Nanosecond}, true},
	} {
		tc.g.Store = idempotency.NewMemoryStore()
		err := tc.g.Validate()
		if tc.ok != (err == nil) || err != nil && !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("Lease %v RenewEvery %v Timeout %v: Validate = %v", tc.g.Lease, tc.g.RenewEvery, tc.g.Timeout, err)
		}
	}
	if _, err := idempotency.NewGuard(idempotency.NewMemoryStore(), &idempotency.Options{Timeout: -1}); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("NewGuard with a negative Timeout = %v", err)
	}
}

// When the lease is lost and fn fails too, Do's error says both.
func TestLeaseLostKeepsFnError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := idempotency.NewMemoryStore()
		g := &idempotency.Guard{Store: store, Lease: 3 * time.Second}
		fnErr := errors.New("payment gateway unreachable")
		_, _, err := g.Do(context.Background(), "k", "fp", func(ctx context.Context) (idempotency.Response, error) {
			if err := store.Delete(context.Background(), "k"); err != nil {
				t.Fatal(err)
			}
			<-ctx.Done() // the next renewal finds the claim gone
			return idempotency.Response{}, idempotency.Retryable(fnErr)
		})
		if !errors.Is(err, idempotency.ErrLeaseLost) || !errors.Is(err, fnErr) {
			t.Errorf("Do = %v; want both ErrLeaseLost and fn's error", err)
		}
		// The key was not released (it is no longer this caller's): a
		// caller asking IsRetryable must not be told it was.
		if idempotency.IsRetryable(err) {
			t.Errorf("Do = %v: IsRetryable after a lost lease", err)
		}
	})
}
