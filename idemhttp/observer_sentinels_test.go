package idemhttp

import (
	"errors"
	"net/http"
	"testing"

	"github.com/archlab/idempotency"
)

// TestObserverErrSentinels: an Event.Err that says the response was not
// stored wraps idempotency.ErrNotStored, and one that says the key could
// not be released wraps idempotency.ErrNotReleased, whether the Guard's
// Release failed (NotStored) or the middleware's own after a panic
// (Abandoned), so that an Observer tells them apart with errors.Is.
func TestObserverErrSentinels(t *testing.T) {
	unstored := func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable) // not stored: released
	}
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		fail    string // the MemoryStore operation that fails
		want    Outcome
		is, not error
	}{
		{"complete fails", created, "complete", NotStored, idempotency.ErrNotStored, idempotency.ErrNotReleased},
		{"release fails after an unstored status", unstored, "release", NotStored, idempotency.ErrNotReleased, idempotency.ErrNotStored},
		{"release fails after a panic", panicOnce(), "release", Abandoned, idempotency.ErrNotReleased, idempotency.ErrNotStored},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, nil, nil, tc.handler)
			f.store.Fault = func(op string) error {
				if op == tc.fail {
					return errors.New("injected outage")
				}
				return nil
			}
			_, _ = f.try(req{keys: key("k"), body: "b"})
			e := f.events.waitOutcome(t, tc.want)
			if !errors.Is(e.Err, tc.is) || errors.Is(e.Err, tc.not) || !errors.Is(e.Err, idempotency.ErrUnavailable) {
				t.Errorf("%s event's Err = %v; want it to wrap %q and ErrUnavailable, not %q", tc.want, e.Err, tc.is, tc.not)
			}
		})
	}
}
