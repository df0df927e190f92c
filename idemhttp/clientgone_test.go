package idemhttp

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// zeros is a reader of n zero bytes that hides WriterTo, so that io.Copy
// into the ResponseWriter goes through its ReadFrom.
type zeros struct{ n int }

func (z *zeros) Read(p []byte) (int, error) {
	if z.n <= 0 {
		return 0, io.EOF
	}
	k := min(len(p), z.n)
	clear(p[:k])
	z.n -= k
	return k, nil
}

// goneFixture serves h behind a middleware built with opts. h starts
// writing only once the server noticed that the client went away (the
// channel it gets is closed then); the test's request reads the status
// and hangs up.
func goneFixture(t *testing.T, opts *Options, h func(w http.ResponseWriter, r *http.Request, gone chan struct{})) *fixture {
	t.Helper()
	gone := make(chan struct{})
	var once sync.Once
	f := newFixture(t, opts, nil, func(w http.ResponseWriter, r *http.Request) { h(w, r, gone) })
	inner := f.srv.Config.Handler
	f.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		stop := context.AfterFunc(r.Context(), func() { once.Do(func() { close(gone) }) })
		defer stop()
		inner.ServeHTTP(w, r)
	})
	r, err := http.NewRequest(http.MethodPost, f.srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.Header["Idempotency-Key"] = key("k")
	resp, err := f.srv.Client().Do(r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close() // before the end of the body: the connection is closed
	return f
}

// TestDetachHidesClientGoneInReadFromTail: under Detach, io.Copy into the
// writer sees no error from a client that went away, also once the
// response outgrew MaxStoredResponse (the tail is handed to net/http's
// ReadFrom). A handler that aborts on a copy error, as ReverseProxy does,
// would otherwise keep the claim instead of storing the marker.
func TestDetachHidesClientGoneInReadFromTail(t *testing.T) {
	copyErr := make(chan error, 1)
	f := goneFixture(t, &Options{Detach: true, MaxStoredResponse: 1}, func(w http.ResponseWriter, r *http.Request, gone chan struct{}) {
		w.WriteHeader(http.StatusCreated)
		w.(http.Flusher).Flush()
		waitFor(gone)
		_, err := io.Copy(w, &zeros{n: 8 << 20})
		copyErr <- err
	})
	if err := <-copyErr; err != nil {
		t.Fatalf("detached handler's io.Copy: %v", err)
	}
	f.events.waitOutcome(t, Executed)
	r := f.do(t, req{keys: key("k")})
	if r.status != http.StatusConflict || r.problem(t).OriginalStatus != http.StatusCreated {
		t.Fatalf("retry = %d %q; want 409 response-not-replayable", r.status, r.body)
	}
}

// TestClientGoneMidBodyIsNotReplayedCut: without Detach, a handler whose
// writes fail because the client went away stops short (io.Copy returns,
// a write loop gives up), and http.ServeContent-style handlers still
// return normally with their stored status. What was captured is cut
// short; it must not be replayed as the whole response. The request ran,
// so the retry gets 409 response-not-replayable, not a second run.
func TestClientGoneMidBodyIsNotReplayedCut(t *testing.T) {
	const size = 8 << 20
	for name, write := range map[string]func(w http.ResponseWriter){
		"io.Copy": func(w http.ResponseWriter) { _, _ = io.Copy(w, &zeros{n: size}) },
		"Write": func(w http.ResponseWriter) {
			chunk := make([]byte, 32<<10)
			for range size / len(chunk) {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := goneFixture(t, &Options{MaxStoredResponse: 2 * size}, func(w http.ResponseWriter, r *http.Request, gone chan struct{}) {
				w.WriteHeader(http.StatusCreated)
				w.(http.Flusher).Flush()
				waitFor(gone)
				write(w)
			})
			f.events.waitOutcome(t, Executed)
			r := f.do(t, req{keys: key("k")})
			if r.status == http.StatusCreated && len(r.body) != size {
				t.Fatalf("retry replayed a cut response: %d bytes of %d", len(r.body), size)
			}
			if r.status != http.StatusConflict || r.problem(t).OriginalStatus != http.StatusCreated {
				t.Fatalf("retry = %d %q; want 409 response-not-replayable", r.status, r.body)
			}
			// The problem's title fits both causes; the detail names this one.
			if p := r.problem(t); strings.Contains(p.Title, "too large") || !strings.Contains(p.Detail, "cut short") {
				t.Fatalf("retry's problem says %q / %q for a response cut short", p.Title, p.Detail)
			}
			if n := f.calls.Load(); n != 1 {
				t.Fatalf("handler ran %d times; want 1", n)
			}
		})
	}
}
