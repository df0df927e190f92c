package idemhttp

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

// manualClock is a Guard clock that tests move forward by hand.
type manualClock struct{ off atomic.Int64 }

func (c *manualClock) Now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *manualClock) Advance(d time.Duration) { c.off.Add(int64(d)) }
func (c *manualClock) guard() *idempotency.Options {
	return &idempotency.Options{Lease: time.Second, Now: c.Now}
}

func TestStoreKeyNamesTheStoredRecord(t *testing.T) {
	f := newFixture(t, &Options{Scope: func(r *http.Request) string { return r.Header.Get("X-Tenant") }}, nil, created)
	f.do(t, req{keys: key(`"order-1"`), header: http.Header{"X-Tenant": {"acme"}}})
	f.do(t, req{keys: key("order-2")}) // the empty scope, bare key

	ctx := context.Background()
	for _, tc := range []struct{ scope, key string }{{"acme", "order-1"}, {"", "order-2"}} {
		rec, err := f.store.Get(ctx, StoreKey(tc.scope, tc.key), time.Now())
		if err != nil || rec.State != idempotency.Done || rec.Response.Status != http.StatusCreated {
			t.Fatalf("Get(StoreKey(%q, %q)) = %+v, %v; want the DONE 201 record", tc.scope, tc.key, rec, err)
		}
	}
	if _, err := f.store.Get(ctx, StoreKey("", "order-1"), time.Now()); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("order-1 under another scope: %v; want ErrNotFound", err)
	}

	// With the default scope, StoreKey(DefaultScope(r), key) finds it too.
	d := newFixture(t, nil, nil, created)
	d.do(t, req{keys: key("k"), header: http.Header{"Authorization": {"Bearer s3cret"}}})
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Header.Set("Authorization", "Bearer s3cret")
	if _, err := d.store.Get(ctx, StoreKey(DefaultScope(r), "k"), time.Now()); err != nil {
		t.Fatalf("default scope: %v", err)
	}
}

// unwrapper wraps a ResponseWriter the way logging middleware does.
type unwrapper struct{ http.ResponseWriter }

func (u unwrapper) Unwrap() http.ResponseWriter { return u.ResponseWriter }

func TestKeepClaim(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		wrap   bool
	}{
		{"unstored status", http.StatusGatewayTimeout, false},
		{"storable status", http.StatusCreated, false},
		{"through a wrapper", http.StatusBadGateway, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var clock manualClock
			var kept atomic.Bool
			f := newFixture(t, nil, clock.guard(), func(w http.ResponseWriter, r *http.Request) {
				ww := w
				if tc.wrap {
					ww = unwrapper{w}
				}
				kept.Store(KeepClaim(ww))
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, "outcome unknown")
			})
			first := f.do(t, req{keys: key("k"), body: "b"})
			if !kept.Load() {
				t.Fatal("KeepClaim returned false inside a guarded handler")
			}
			if first.status != tc.status || first.body != "outcome unknown" || first.header.Get(DefaultWindowHeader) != "" {
				t.Fatalf("first = %d %q %v; want %d as written, without a window header", first.status, first.body, first.header, tc.status)
			}
			ev := f.events.waitOutcome(t, Abandoned)
			if !errors.Is(ev.Err, ErrClaimKept) || ev.Status != tc.status {
				t.Fatalf("event = %+v; want Abandoned with ErrClaimKept and status %d", ev, tc.status)
			}
			r := f.do(t, req{keys: key("k"), body: "b"})
			if r.status != http.StatusConflict || r.problem(t).Type != ProblemInFlight.Type {
				t.Fatalf("retry inside the lease = %d %q; want 409 in-flight", r.status, r.body)
			}
			if n := f.calls.Load(); n != 1 {
				t.Fatalf("handler ran %d times inside the lease; want 1", n)
			}
			clock.Advance(2 * time.Second)
			if r := f.do(t, req{keys: key("k"), body: "b"}); r.status != tc.status || r.header.Get(ReplayedHeader) != "" {
				t.Fatalf("retry after the lease = %d %v; want the handler to run again", r.status, r.header)
			}
			if n := f.calls.Load(); n != 2 {
				t.Fatalf("handler ran %d times; want 2 after the lease", n)
			}
		})
	}
	t.Run("outside the middleware", func(t *testing.T) {
		if KeepClaim(httptest.NewRecorder()) {
			t.Fatal("KeepClaim on a plain ResponseWriter returned true")
		}
		if KeepClaim(unwrapper{httptest.NewRecorder()}) {
			t.Fatal("KeepClaim on a wrapped plain ResponseWriter returned true")
		}
	})
}

func TestAbortHandlerKeepsClaim(t *testing.T) {
	var clock manualClock
	var calls atomic.Int64
	f := newFixture(t, nil, clock.guard(), func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			// What ReverseProxy does when the upstream breaks off: the
			// header and part of the body are out, then it aborts.
			w.Header().Set("Content-Length", "100")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, "partial")
			http.NewResponseController(w).Flush()
			panic(http.ErrAbortHandler)
		}
		created(w, r)
	})
	if r, err := f.try(req{keys: key("k"), body: "b"}); err == nil {
		t.Fatalf("the aborted response arrived whole: %d %q", r.status, r.body)
	}
	ev := f.events.waitOutcome(t, Abandoned)
	if ev.Status != http.StatusCreated || ev.Err == nil {
		t.Fatalf("event = %+v; want Abandoned, status 201, with an error", ev)
	}
	if _, err := f.store.Get(context.Background(), StoreKey("", "k"), clock.Now()); err != nil {
		t.Fatalf("the key's record after the abort: %v; want it kept (PROCESSING)", err)
	}
	if r := f.do(t, req{keys: key("k"), body: "b"}); r.status != http.StatusConflict {
		t.Fatalf("retry inside the lease = %d %q; want 409 (claim kept)", r.status, r.body)
	}
	clock.Advance(2 * time.Second)
	if r := f.do(t, req{keys: key("k"), body: "b"}); r.status != http.StatusCreated || r.header.Get(ReplayedHeader) != "" {
		t.Fatalf("retry after the lease = %d %v; want a new execution", r.status, r.header)
	}
	if r := f.do(t, req{keys: key("k"), body: "b"}); r.header.Get(ReplayedHeader) != "true" || r.body != `{"echo":"b"}` {
		t.Fatalf("second retry = %d %v %q; want the second execution replayed", r.status, r.header, r.body)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("handler ran %d times; want 2", n)
	}
}

// TestDetachHidesClientWriteErrors: under Detach a handler that writes to
// a client that has gone away sees no error (ReverseProxy would abort at the
// first one), finishes, and its whole response is stored for the retry.
// Without Detach the write error reaches the handler.
func TestDetachHidesClientWriteErrors(t *testing.T) {
	for _, detach := range []bool{true, false} {
		t.Run(map[bool]string{true: "detached", false: "attached"}[detach], func(t *testing.T) {
			const chunks, size = 64, 8 << 10
			b := newBlocker()
			writeErr := make(chan error, 1)
			f := newFixture(t, &Options{Detach: detach}, nil, func(w http.ResponseWriter, r *http.Request) {
				b.once.Do(func() { close(b.started) })
				waitFor(b.release)
				w.Header().Set("Content-Type", "application/octet-stream")
				w.WriteHeader(http.StatusCreated)
				var first error
				chunk := make([]byte, size)
				for i := range chunks {
					for j := range chunk {
						chunk[j] = byte('a' + i%26)
					}
					if _, err := w.Write(chunk); err != nil && first == nil {
						first = err
					}
					time.Sleep(time.Millisecond) // let the client's reset arrive
				}
				writeErr <- first
			})
			gone := make(chan struct{})
			var goneOnce atomic.Bool
			inner := f.srv.Config.Handler
			f.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				stop := context.AfterFunc(r.Context(), func() {
					if !goneOnce.Swap(true) {
						close(gone)
					}
				})
				defer stop()
				inner.ServeHTTP(w, r)
			})
			disconnect(t, f, b)
			waitClosed(t, gone)
			close(b.release)
			err := <-writeErr
			if !detach {
				if err == nil {
					t.Fatal("without Detach the handler saw no write error after the client left")
				}
				return
			}
			if err != nil {
				t.Fatalf("detached handler saw a write error: %v", err)
			}
			f.events.waitOutcome(t, Executed)
			r := f.do(t, req{keys: key("k"), body: "b"})
			if r.status != http.StatusCreated || r.header.Get(ReplayedHeader) != "true" || len(r.body) != chunks*size {
				t.Fatalf("retry = %d %v, %d bytes; want the whole %d-byte response replayed", r.status, r.header, len(r.body), chunks*size)
			}
			if r.body[size*3] != 'd' || r.body[len(r.body)-1] != byte('a'+(chunks-1)%26) {
				t.Fatal("the replayed body differs from what the handler wrote")
			}
			if n := f.calls.Load(); n != 1 {
				t.Fatalf("handler ran %d times; want 1", n)
			}
		})
	}
}

func waitFor(c chan struct{}) {
	select {
	case <-c:
	case <-time.After(10 * time.Second):
	}
}
