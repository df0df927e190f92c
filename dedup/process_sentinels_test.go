package dedup_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/dedup"
)

// TestProcessErrorSentinels: Process passes on the Guard's sentinels. A
// success that could not be recorded is Ack'ed with an error wrapping
// idempotency.ErrNotStored; a failure whose id could not be released
// wraps idempotency.ErrNotReleased beside fn's error, and is Nak'ed for
// the lease only when the claim is still this consumer's (ErrUnavailable,
// not ErrLeaseLost).
func TestProcessErrorSentinels(t *testing.T) {
	boom := errors.New("downstream refused")
	for _, tc := range []struct {
		name      string
		fail      string // the MemoryStore operation that fails
		deleteKey bool   // fn deletes its own id (the claim is lost)
		fnErr     error
		action    dedup.Action
		delay     time.Duration
		is        []error
		not       []error
	}{
		{name: "success not recorded", fail: "complete", action: dedup.Ack,
			is:  []error{idempotency.ErrNotStored, idempotency.ErrUnavailable},
			not: []error{idempotency.ErrNotReleased}},
		{name: "release unavailable", fail: "release", fnErr: boom, action: dedup.Nak, delay: 7 * time.Second,
			is:  []error{boom, idempotency.ErrNotReleased, idempotency.ErrUnavailable},
			not: []error{idempotency.ErrNotStored, idempotency.ErrLeaseLost}},
		{name: "release finds the id gone", deleteKey: true, fnErr: boom, action: dedup.Nak, delay: 2 * time.Second,
			is:  []error{boom, idempotency.ErrNotReleased, idempotency.ErrLeaseLost},
			not: []error{idempotency.ErrNotStored, idempotency.ErrUnavailable}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := idempotency.NewMemoryStore()
			store.Fault = func(op string) error {
				if op == tc.fail {
					return errors.New("injected outage")
				}
				return nil
			}
			w := newWindow(t, store, &dedup.Options{Lease: 7 * time.Second, RetryDelay: 2 * time.Second})
			d, err := w.Process(context.Background(), "m1", func(ctx context.Context) error {
				if tc.deleteKey {
					if err := store.Delete(ctx, "m1"); err != nil {
						t.Error(err)
					}
				}
				return tc.fnErr
			})
			if d.Action != tc.action || (tc.action == dedup.Nak && d.Delay != tc.delay) {
				t.Errorf("Process = %+v, %v; want %v after %v", d, err, tc.action, tc.delay)
			}
			for _, target := range tc.is {
				if !errors.Is(err, target) {
					t.Errorf("Process error %v; want it to wrap %q", err, target)
				}
			}
			for _, target := range tc.not {
				if errors.Is(err, target) {
					t.Errorf("Process error %v; want it not to wrap %q", err, target)
				}
			}
		})
	}
}
