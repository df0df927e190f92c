package idemhttp

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

// TestWaitRunsWhenHolderReleases: a request that waits (Options.Wait) for
// a holder that then releases the key (its status is not stored) runs the
// handler itself, rather than getting 409 or the holder's response.
func TestWaitRunsWhenHolderReleases(t *testing.T) {
	b := newBlocker()
	var calls atomic.Int64
	f := newFixture(t, &Options{Wait: 5 * time.Second}, nil, func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			b.handler(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusServiceUnavailable) // not stored: released
			})(w, r)
			return
		}
		created(w, r)
	})
	var begins atomic.Int64
	waited := make(chan struct{})
	f.store.Fault = func(op string) error {
		// The holder's claim is the first begin and the waiter's first
		// try the second; a third means the waiter got InFlight and is
		// polling.
		if op == "begin" && begins.Add(1) == 3 {
			close(waited)
		}
		return nil
	}
	done := make(chan reply, 1)
	go func() { r, _ := f.try(req{keys: key("k"), body: "b"}); done <- r }()
	waitClosed(t, b.started)
	waiting := make(chan reply, 1)
	go func() { r, _ := f.try(req{keys: key("k"), body: "b"}); waiting <- r }()
	waitClosed(t, waited)
	close(b.release)
	if first := <-done; first.status != http.StatusServiceUnavailable {
		t.Fatalf("holder got %d", first.status)
	}
	r := <-waiting
	if r.status != http.StatusCreated || r.header.Get(ReplayedHeader) != "" || r.body != `{"echo":"b"}` {
		t.Fatalf("waiter = %d %v %q; want its own 201 (the holder released the key)", r.status, r.header, r.body)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("handler ran %d times; want 2", n)
	}
}

// TestUnguardedRequestsNotObserved: the Observer sees guarded requests
// only: not other methods, nor requests without a key when keys are
// optional.
func TestUnguardedRequestsNotObserved(t *testing.T) {
	f := newFixture(t, nil, nil, created)
	f.do(t, req{method: http.MethodGet, keys: key("k")})
	f.do(t, req{method: http.MethodPut, keys: key("k")})
	f.do(t, req{body: "no key"})
	f.do(t, req{keys: key("k")}) // guarded: observed, and after the others
	f.events.waitOutcome(t, Executed)
	if got := f.events.outcomes(); len(got) != 1 {
		t.Fatalf("observed %v; want only the guarded request's executed", got)
	}
	if n := f.calls.Load(); n != 4 {
		t.Fatalf("handler ran %d times; want 4", n)
	}
}

// errCharged is a handler's panic value in TestPanicAfterStatusUnwraps.
var errCharged = errors.New("idemhttp test: charged, then failed")

// TestPanicAfterStatusUnwraps: a panic passed on after the claim was kept
// (a stored status was sent) is an error whose Unwrap gives the value the
// handler raised, when that value is an error.
func TestPanicAfterStatusUnwraps(t *testing.T) {
	f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		http.NewResponseController(w).Flush()
		panic(errCharged)
	})
	recovered := make(chan any, 1)
	inner := f.srv.Config.Handler
	f.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			v := recover()
			recovered <- v
			if v != nil {
				panic(http.ErrAbortHandler) // quietly: the test has what it needs
			}
		}()
		inner.ServeHTTP(w, r)
	})
	_, _ = f.try(req{keys: key("k")})
	var v any
	select {
	case v = <-recovered:
	case <-time.After(5 * time.Second):
		t.Fatal("the handler's panic did not reach the outer handler")
	}
	err, ok := v.(error)
	if !ok || !errors.Is(err, errCharged) {
		t.Fatalf("passed on %T %v; want an error that unwraps to the handler's", v, v)
	}
	if e := f.events.waitOutcome(t, Abandoned); e.Status != http.StatusCreated {
		t.Fatalf("event %+v", e)
	}
}

// TestDetachedHandlerCancelledOnLeaseLoss: under Detach the handler's
// context ignores the client, but is still cancelled when the lease is
// lost; the response is sent, not stored.
func TestDetachedHandlerCancelledOnLeaseLoss(t *testing.T) {
	var f *fixture
	ctxErr := make(chan error, 1)
	f = newFixture(t, &Options{Detach: true}, &idempotency.Options{Lease: 300 * time.Millisecond, RenewEvery: 20 * time.Millisecond},
		func(w http.ResponseWriter, r *http.Request) {
			// An operator deletes the key: the next renewal is refused.
			_ = f.store.Delete(context.Background(), StoreKey("", "k"))
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
			ctxErr <- r.Context().Err()
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, "done")
		})
	r := f.do(t, req{keys: key("k")})
	if err := <-ctxErr; err == nil {
		t.Fatal("the detached handler's context was not cancelled when the lease was lost")
	}
	if r.status != http.StatusCreated || r.body != "done" {
		t.Fatalf("response %d %q; want it sent as written", r.status, r.body)
	}
	if e := f.events.waitOutcome(t, LeaseLost); !errors.Is(e.Err, idempotency.ErrLeaseLost) {
		t.Fatalf("event %+v", e)
	}
	if n := f.store.Len(); n != 0 {
		t.Fatalf("%d records after the lease was lost; want none", n)
	}
}

// TestStoreHeaderCannotStoreMiddlewareFields: a StoreHeader policy that
// stores everything still leaves out the window header, Idempotent-Replayed
// and Connection, even when the handler set them itself.
func TestStoreHeaderCannotStoreMiddlewareFields(t *testing.T) {
	f := newFixture(t, &Options{StoreHeader: func(string) bool { return true }}, nil, func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-Kept", "1")
		h.Set(ReplayedHeader, "handler's")
		h.Set(DefaultWindowHeader, "handler's")
		h.Set("Connection", "close")
		w.WriteHeader(http.StatusCreated)
	})
	f.do(t, req{keys: key("k")})
	rec, err := f.store.Get(context.Background(), StoreKey("", "k"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if rec.Response.Header["X-Kept"] == nil {
		t.Fatalf("stored header %v lacks X-Kept: the policy is not in force", rec.Response.Header)
	}
	for _, name := range []string{ReplayedHeader, DefaultWindowHeader, "Connection"} {
		if v, ok := rec.Response.Header[name]; ok {
			t.Errorf("%s stored as %q under a store-everything policy", name, v)
		}
	}
}

// TestEmptyFingerprintHeaders: an empty, non-nil FingerprintHeaders
// fingerprints no header field, Content-Type included (nil means
// Content-Type).
func TestEmptyFingerprintHeaders(t *testing.T) {
	for _, tc := range []struct {
		name    string
		headers []string
		replay  bool
	}{{"nil", nil, false}, {"empty", []string{}, true}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, &Options{FingerprintHeaders: tc.headers}, nil, created)
			f.do(t, req{keys: key("k"), body: "b", header: http.Header{"Content-Type": {"text/plain"}}})
			r := f.do(t, req{keys: key("k"), body: "b", header: http.Header{"Content-Type": {"application/json"}}})
			if got := r.header.Get(ReplayedHeader) == "true"; got != tc.replay {
				t.Fatalf("another Content-Type: %d, replayed %v; want replayed %v", r.status, got, tc.replay)
			}
		})
	}
}
