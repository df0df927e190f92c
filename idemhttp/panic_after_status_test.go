package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestPanicAfterStoredStatusKeepsClaim: a handler that panics after it sent
// a status that would be stored (201 and part of its body here) has
// announced that the operation took place; the client gets a response cut
// short and retries. Releasing the key would run the operation a second
// time at once, so the claim is kept until its lease ends, as for
// http.ErrAbortHandler, and the panic still reaches net/http. A panic
// before any status was sent, or after one that is not stored (a 5xx),
// still releases the key (TestPanicReleasesKey).
func TestPanicAfterStoredStatusKeepsClaim(t *testing.T) {
	var clock manualClock
	var calls atomic.Int64
	f := newFixture(t, nil, clock.guard(), func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, "charged")
			http.NewResponseController(w).Flush()
			panic("idemhttp test: a deliberate panic after the status")
		}
		created(w, r)
	})
	// An outer handler sees the panic go on, with the handler's own stack.
	recovered := make(chan any, 1)
	inner := f.srv.Config.Handler
	f.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				recovered <- v
				panic(v)
			}
		}()
		inner.ServeHTTP(w, r)
	})
	if r, err := f.try(req{keys: key("k"), body: "b"}); err == nil {
		t.Fatalf("the panicking response arrived whole: %d %q", r.status, r.body)
	}
	select {
	case v := <-recovered:
		msg := fmt.Sprint(v)
		if !strings.Contains(msg, "a deliberate panic after the status") || !strings.Contains(msg, "panic_after_status_test.go") {
			t.Fatalf("the panic went on as %q; want the handler's value and stack", msg)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the panic did not go on to the server")
	}
	ev := f.events.waitOutcome(t, Abandoned)
	if ev.Status != http.StatusCreated || !errors.Is(ev.Err, errPanicAfterStatus) {
		t.Fatalf("event = %+v; want Abandoned, status 201, errPanicAfterStatus", ev)
	}
	wantClaimKept(t, f, &clock, &calls)
}

// TestPanicAfterUnstoredStatusReleases: a panic after a 5xx went out
// releases the key as before: the handler reported a failure.
func TestPanicAfterUnstoredStatusReleases(t *testing.T) {
	var calls atomic.Int64
	f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusInternalServerError)
			http.NewResponseController(w).Flush()
			panic("idemhttp test: a deliberate panic after a 500")
		}
		created(w, r)
	})
	_, _ = f.try(req{keys: key("k"), body: "b"})
	f.events.waitOutcome(t, Released)
	if r := f.do(t, req{keys: key("k"), body: "b"}); r.status != http.StatusCreated || r.header.Get(ReplayedHeader) != "" {
		t.Fatalf("retry after the panic = %d %v; want a new execution", r.status, r.header)
	}
}

// TestPanicAfterKeepClaimKeepsClaim: KeepClaim promises that the key is not
// released; a panic after it must not release it either.
func TestPanicAfterKeepClaimKeepsClaim(t *testing.T) {
	var calls atomic.Int64
	f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			KeepClaim(w)
			panic("idemhttp test: a deliberate panic after KeepClaim")
		}
		created(w, r)
	})
	_, _ = f.try(req{keys: key("k"), body: "b"})
	if ev := f.events.waitOutcome(t, Abandoned); !errors.Is(ev.Err, errPanicAfterStatus) {
		t.Fatalf("event = %+v; want Abandoned with errPanicAfterStatus", ev)
	}
	if r := f.do(t, req{keys: key("k"), body: "b"}); r.status != http.StatusConflict {
		t.Fatalf("retry = %d %q; want 409 (claim kept)", r.status, r.body)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times; want 1", n)
	}
}

// wantClaimKept checks that key "k" (body "b") is still claimed after the
// handler's one run ended abruptly: its record is there, a retry inside
// the lease (1s) gets 409 without running the handler again, and one after
// it runs the handler anew.
func wantClaimKept(t *testing.T, f *fixture, clock *manualClock, calls *atomic.Int64) {
	t.Helper()
	if _, err := f.store.Get(context.Background(), StoreKey("", "k"), clock.Now()); err != nil {
		t.Fatalf("the key's record after the handler ended: %v; want the claim kept", err)
	}
	if r := f.do(t, req{keys: key("k"), body: "b"}); r.status != http.StatusConflict {
		t.Fatalf("retry inside the lease = %d %q; want 409 (claim kept)", r.status, r.body)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times inside the lease; want 1", n)
	}
	clock.Advance(2 * time.Second)
	if r := f.do(t, req{keys: key("k"), body: "b"}); r.status != http.StatusCreated || r.header.Get(ReplayedHeader) != "" {
		t.Fatalf("retry after the lease = %d %v; want a new execution", r.status, r.header)
	}
}
