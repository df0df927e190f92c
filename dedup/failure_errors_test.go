package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/dedup"
)

// A failed message whose claim could not be released is Nak'ed for the
// lease, whatever fn's own error wraps: fn that failed on an idempotency
// store of its own (ErrUnavailable) does not hide the release's failure.
// When the release succeeds, RetryDelay stands.
func TestFailedMessageDelayTellsReleaseFromFnError(t *testing.T) {
	fnErr := fmt.Errorf("downstream guard: %w", idempotency.ErrUnavailable)
	for _, tc := range []struct {
		name        string
		releaseDown bool
		want        time.Duration
	}{
		{"release failed", true, 7 * time.Second},
		{"released", false, 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := idempotency.NewMemoryStore()
			store.Fault = func(op string) error {
				if op == "release" && tc.releaseDown {
					return errors.New("injected")
				}
				return nil
			}
			w := newWindow(t, store, &dedup.Options{Lease: 7 * time.Second, RetryDelay: 2 * time.Second})
			d, err := w.Process(context.Background(), "m1", func(context.Context) error { return fnErr })
			if !errors.Is(err, fnErr) || d.Action != dedup.Nak || d.Delay != tc.want {
				t.Errorf("%+v, %v; want Nak after %v with fn's error", d, err, tc.want)
			}
		})
	}
}

// The error of a failed fn comes back as fn returned it: the Retryable mark
// the window gives it for the Guard stays inside, so that a caller running
// Process inside a Guard of its own does not have its claim released as if
// nothing had happened.
func TestFailedFnErrorIsNotMarkedRetryable(t *testing.T) {
	w := newWindow(t, idempotency.NewMemoryStore(), nil)
	boom := errors.New("downstream refused")
	d, err := w.Process(context.Background(), "m1", func(context.Context) error { return boom })
	if d.Action != dedup.Nak || !errors.Is(err, boom) || idempotency.IsRetryable(err) {
		t.Errorf("%+v, %v (retryable %v); want Nak with fn's error, unmarked", d, err, idempotency.IsRetryable(err))
	}
	if err != nil && err.Error() != boom.Error() {
		t.Errorf("error %q, want fn's %q", err, boom)
	}
}

// When the claim was lost while fn ran (here an operator deleted the key),
// the error says so beside fn's, once each, and the delay is RetryDelay:
// nobody's claim is left to wait for.
func TestFailedFnAfterLostClaimKeepsBothErrors(t *testing.T) {
	store := idempotency.NewMemoryStore()
	w := newWindow(t, store, &dedup.Options{Lease: 7 * time.Second, RetryDelay: 2 * time.Second})
	boom := errors.New("downstream refused")
	d, err := w.Process(context.Background(), "m1", func(ctx context.Context) error {
		if err := store.Delete(ctx, "m1"); err != nil {
			t.Error(err)
		}
		return boom
	})
	if d.Action != dedup.Nak || d.Delay != 2*time.Second || !errors.Is(err, boom) ||
		!errors.Is(err, idempotency.ErrLeaseLost) || idempotency.IsRetryable(err) ||
		strings.Count(err.Error(), boom.Error()) != 1 {
		t.Errorf("%+v, %v; want Nak after 2s with fn's error once and the lost lease", d, err)
	}
}

// When a renewal found the claim taken away while fn ran (the Guard then
// reports the lost lease itself, beside fn's error), fn's error still
// appears once, and the delay is RetryDelay.
func TestFailedFnAfterRejectedRenewalKeepsFnErrorOnce(t *testing.T) {
	store := idempotency.NewMemoryStore()
	w := newWindow(t, store, &dedup.Options{Lease: 300 * time.Millisecond, RenewEvery: 50 * time.Millisecond, RetryDelay: 2 * time.Second})
	boom := errors.New("downstream refused")
	d, err := w.Process(context.Background(), "m1", func(ctx context.Context) error {
		if err := store.Delete(ctx, "m1"); err != nil {
			t.Error(err)
		}
		<-ctx.Done() // the next renewal is rejected: the claim is gone
		return boom
	})
	if d.Action != dedup.Nak || d.Delay != 2*time.Second || !errors.Is(err, boom) ||
		!errors.Is(err, idempotency.ErrLeaseLost) || idempotency.IsRetryable(err) {
		t.Errorf("%+v, %v; want Nak after 2s with fn's error and the lost lease", d, err)
	}
	if err != nil && strings.Count(err.Error(), boom.Error()) != 1 {
		t.Errorf("error %q names fn's error %d times, want once", err, strings.Count(err.Error(), boom.Error()))
	}
}
