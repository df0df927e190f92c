package idemhttp

import (
	"errors"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/archlab/idempotency"
)

// panicOnce is a handler that panics on its first call and then answers
// 201 like created.
func panicOnce() http.HandlerFunc {
	var panicked atomic.Bool
	return func(w http.ResponseWriter, r *http.Request) {
		if !panicked.Swap(true) {
			panic("idemhttp test: a deliberate panic")
		}
		created(w, r)
	}
}

// failReleases makes the fixture's store fail its next n Releases (n < 0:
// every one) with ErrUnavailable, and counts the Releases it saw.
func failReleases(f *fixture, n int64) *atomic.Int64 {
	var seen atomic.Int64
	f.store.Fault = func(op string) error {
		if op != "release" {
			return nil
		}
		if i := seen.Add(1); n < 0 || i <= n {
			return errors.New("idemhttp test: release refused")
		}
		return nil
	}
	return &seen
}

// TestPanicReleaseFailsOnce: the Guard's own Release after a panic fails
// (a store blip). The middleware gives the key back itself, so the retry
// runs at once instead of waiting out the lease, and the Observer sees
// Released.
func TestPanicReleaseFailsOnce(t *testing.T) {
	f := newFixture(t, nil, nil, panicOnce())
	seen := failReleases(f, 1)
	if _, err := f.try(req{keys: key("k")}); err == nil {
		t.Fatal("the panicking request got a response")
	}
	ev := f.events.waitOutcome(t, Released)
	if !errors.Is(ev.Err, errPanic) {
		t.Fatalf("Released event's Err = %v, want errPanic", ev.Err)
	}
	if got := seen.Load(); got != 2 {
		t.Fatalf("%d Releases after the panic, want 2 (the Guard's, which failed, and the middleware's)", got)
	}
	if r := f.do(t, req{keys: key("k")}); r.status != http.StatusCreated || r.header.Get(ReplayedHeader) != "" {
		t.Fatalf("retry after the panic: %d %v, want the handler to run at once", r.status, r.header)
	}
}

// TestPanicReleaseFails: the store refuses every Release after a panic. The
// claim stays until its lease ends, and the Observer says so (Abandoned,
// with the store's error) instead of reporting the key released.
func TestPanicReleaseFails(t *testing.T) {
	f := newFixture(t, nil, nil, panicOnce())
	failReleases(f, -1)
	if _, err := f.try(req{keys: key("k")}); err == nil {
		t.Fatal("the panicking request got a response")
	}
	ev := f.events.waitOutcome(t, Abandoned)
	if !errors.Is(ev.Err, idempotency.ErrUnavailable) || !errors.Is(ev.Err, errPanicKept) {
		t.Fatalf("Abandoned event's Err = %v, want errPanicKept and ErrUnavailable", ev.Err)
	}
	for _, o := range f.events.outcomes() {
		if o == Released {
			t.Fatalf("a Released event although no Release succeeded: %v", f.events.outcomes())
		}
	}
	if r := f.do(t, req{keys: key("k")}); r.status != http.StatusConflict {
		t.Fatalf("retry while the claim is kept: %d, want 409 in flight", r.status)
	}
	if got := f.calls.Load(); got != 1 {
		t.Fatalf("handler ran %d times, want 1", got)
	}
}
