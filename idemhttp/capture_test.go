package idemhttp

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

// replayed runs the same request twice and checks the handler ran once and
// the second answer is a replay of the first.
func replayed(t *testing.T, f *fixture, q req) (first, second reply) {
	t.Helper()
	q.keys = key("k")
	first = f.do(t, q)
	second = f.do(t, q)
	if second.header.Get(ReplayedHeader) != "true" {
		t.Fatalf("second request not replayed: %d %v %q", second.status, second.header, second.body)
	}
	if second.status != first.status || second.body != first.body {
		t.Fatalf("replay %d %d bytes, first %d %d bytes", second.status, len(second.body), first.status, len(first.body))
	}
	if f.calls.Load() != 1 {
		t.Fatalf("handler ran %d times", f.calls.Load())
	}
	return first, second
}

func tempFile(t *testing.T, size int) (string, []byte) {
	t.Helper()
	data := bytes.Repeat([]byte("idempotent-"), size/11+1)[:size]
	path := filepath.Join(t.TempDir(), "payload")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, data
}

func TestCaptureIOCopyFromFile(t *testing.T) {
	path, data := tempFile(t, 100_000)
	f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
		file, err := os.Open(path)
		if err != nil {
			t.Error(err)
			return
		}
		defer file.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusCreated)
		if _, err := io.Copy(w, file); err != nil {
			t.Error(err)
		}
	})
	first, _ := replayed(t, f, req{})
	if first.status != http.StatusCreated || first.body != string(data) {
		t.Fatalf("first: %d, %d bytes", first.status, len(first.body))
	}
}

func TestCaptureReadFromPlainReader(t *testing.T) {
	// struct{io.Reader} hides WriteTo, so io.Copy must use the writer's
	// ReadFrom: the path one Go peer loses (replaying an empty 201).
	f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
		if _, ok := w.(io.ReaderFrom); !ok {
			t.Error("the wrapper hides io.ReaderFrom")
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.Copy(w, struct{ io.Reader }{strings.NewReader(strings.Repeat("abc", 5000))})
	})
	first, _ := replayed(t, f, req{})
	if first.body != strings.Repeat("abc", 5000) {
		t.Fatalf("body of %d bytes", len(first.body))
	}
}

func TestCaptureWriteBeforeWriteHeader(t *testing.T) {
	f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "<html><body>hi</body></html>")
		w.WriteHeader(http.StatusTeapot) // superfluous: 200 was sent
	})
	first, second := replayed(t, f, req{})
	if first.status != http.StatusOK {
		t.Fatalf("status %d", first.status)
	}
	if ct := second.header.Get("Content-Type"); ct != first.header.Get("Content-Type") || !strings.HasPrefix(ct, "text/html") {
		t.Fatalf("sniffed Content-Type: first %q, replay %q", first.header.Get("Content-Type"), ct)
	}
}

func TestCaptureRepeatedWriteHeader(t *testing.T) {
	f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, "made")
	})
	first, _ := replayed(t, f, req{})
	if first.status != http.StatusCreated || first.body != "made" {
		t.Fatalf("%d %q", first.status, first.body)
	}
}

func TestCaptureFlushAndResponseController(t *testing.T) {
	f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if err := rc.SetWriteDeadline(time.Now().Add(5 * time.Second)); err != nil {
			t.Errorf("SetWriteDeadline through the wrapper: %v", err)
		}
		_, _ = io.WriteString(w, "part1;")
		w.(http.Flusher).Flush()
		_, _ = io.WriteString(w, "part2;")
		if err := rc.Flush(); err != nil {
			t.Errorf("ResponseController.Flush: %v", err)
		}
		_, _ = io.WriteString(w, "part3")
	})
	first, _ := replayed(t, f, req{})
	if first.body != "part1;part2;part3" {
		t.Fatalf("body %q", first.body)
	}
}

func TestCaptureFlushBeforeWrite(t *testing.T) {
	f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Early", "1")
		w.(http.Flusher).Flush()
		_, _ = io.WriteString(w, "late")
	})
	first, second := replayed(t, f, req{})
	if first.status != 200 || second.header.Get("X-Early") != "1" {
		t.Fatalf("%d %v", first.status, second.header)
	}
}

func TestCaptureTrailers(t *testing.T) {
	f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Checksum")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "payload")
		w.Header().Set("X-Checksum", "abc123")
		w.Header().Set(http.TrailerPrefix+"X-Late", "zz")
	})
	first, second := replayed(t, f, req{})
	for _, r := range []reply{first, second} {
		if r.trail.Get("X-Checksum") != "abc123" || r.trail.Get("X-Late") != "zz" {
			t.Fatalf("trailers %v (replayed %q)", r.trail, r.header.Get(ReplayedHeader))
		}
	}
}

func TestCaptureInformationalThenFinal(t *testing.T) {
	f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "final")
	})
	first, _ := replayed(t, f, req{})
	if first.status != http.StatusCreated || first.body != "final" {
		t.Fatalf("%d %q", first.status, first.body)
	}
}

func TestCaptureEmptyHandlerIs200(t *testing.T) {
	f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {})
	first, _ := replayed(t, f, req{})
	if first.status != http.StatusOK || first.body != "" {
		t.Fatalf("%d %q", first.status, first.body)
	}
}

func TestResponseTooLargeIsMarked(t *testing.T) {
	for _, via := range []string{"write", "copy"} {
		t.Run(via, func(t *testing.T) {
			path, data := tempFile(t, 50_000)
			f := newFixture(t, &Options{MaxStoredResponse: 1024}, nil, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusCreated)
				if via == "write" {
					for i := 0; i < len(data); i += 1000 {
						_, _ = w.Write(data[i:min(i+1000, len(data))])
					}
					return
				}
				file, err := os.Open(path)
				if err != nil {
					t.Error(err)
					return
				}
				defer file.Close()
				_, _ = io.Copy(w, file)
			})
			first := f.do(t, req{keys: key("k")})
			if first.status != http.StatusCreated || first.body != string(data) {
				t.Fatalf("large response not delivered: %d, %d bytes", first.status, len(first.body))
			}
			second := f.do(t, req{keys: key("k")})
			if second.status != http.StatusConflict {
				t.Fatalf("retry got %d", second.status)
			}
			p := second.problem(t)
			if p.Type != ProblemBase+"response-not-replayable" || p.OriginalStatus != http.StatusCreated {
				t.Fatalf("problem %+v", p)
			}
			if f.calls.Load() != 1 {
				t.Fatalf("handler ran %d times", f.calls.Load())
			}
			if e := f.events.waitOutcome(t, Executed); e.Err != ErrResponseTooLarge {
				t.Fatalf("executed event error %v", e.Err)
			}
		})
	}
}

func TestHijackReleasesKey(t *testing.T) {
	f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		_, _ = rw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi")
		_ = rw.Flush()
	})
	for i := range 2 {
		r := f.do(t, req{keys: key("k")})
		if r.status != http.StatusOK || r.body != "hi" || r.header.Get(ReplayedHeader) != "" {
			t.Fatalf("request %d: %d %q %v", i, r.status, r.body, r.header)
		}
		// The key is released when the handler returns, which may be
		// after the client has read what it wrote on the hijacked
		// connection: wait for it before the retry.
		for deadline := time.Now().Add(5 * time.Second); countOutcome(f.events.outcomes(), Released) <= i; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("request %d: no release; events %v", i, f.events.outcomes())
			}
		}
	}
	if f.calls.Load() != 2 {
		t.Fatalf("hijacked key not released: handler ran %d times", f.calls.Load())
	}
}

func TestConcurrentDuplicatesRunOnce(t *testing.T) {
	for _, wait := range []time.Duration{0, 5 * time.Second} {
		t.Run("wait="+wait.String(), func(t *testing.T) {
			f := newFixture(t, &Options{Wait: wait}, nil, func(w http.ResponseWriter, r *http.Request) {
				time.Sleep(30 * time.Millisecond)
				created(w, r)
			})
			const n = 64
			var wg sync.WaitGroup
			start := make(chan struct{})
			replies := make([]reply, n)
			errs := make([]error, n)
			for i := range n {
				wg.Go(func() {
					<-start
					replies[i], errs[i] = f.try(req{keys: key("dup"), body: "same"})
				})
			}
			close(start)
			wg.Wait()
			var executed, replays, inflight int
			for i, r := range replies {
				if errs[i] != nil {
					t.Fatal(errs[i])
				}
				switch {
				case r.status == http.StatusCreated && r.header.Get(ReplayedHeader) == "":
					executed++
				case r.status == http.StatusCreated:
					replays++
					if r.body != `{"echo":"same"}` {
						t.Fatalf("replayed body %q", r.body)
					}
				case r.status == http.StatusConflict:
					inflight++
					var p Problem
					if json.Unmarshal([]byte(r.body), &p) != nil || p.Type != ProblemBase+"in-flight" {
						t.Fatalf("409 body %q", r.body)
					}
				default:
					t.Fatalf("unexpected %d %q", r.status, r.body)
				}
			}
			if executed != 1 || f.calls.Load() != 1 {
				t.Fatalf("executed %d (handler ran %d times), want 1", executed, f.calls.Load())
			}
			if wait > 0 && inflight != 0 {
				t.Fatalf("%d requests got 409 despite Wait", inflight)
			}
			t.Logf("executed %d, replayed %d, in flight %d", executed, replays, inflight)
		})
	}
}

// disconnect starts a request that the client abandons once the handler
// has started, and returns after the client gave up.
func disconnect(t *testing.T, f *fixture, b *blocker) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { _, err := f.try(req{keys: key("k"), body: "b", ctx: ctx}); errc <- err }()
	waitClosed(t, b.started)
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("the abandoned request completed")
	}
}

func TestClientDisconnectIsNotASecondExecution(t *testing.T) {
	t.Run("handler finishes", func(t *testing.T) {
		b := newBlocker()
		ctxErr := make(chan error, 1)
		f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
			b.once.Do(func() { close(b.started) })
			<-b.release
			select { // the server notices the closed connection
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
			ctxErr <- r.Context().Err()
			created(w, r)
		})
		disconnect(t, f, b)
		if r := f.do(t, req{keys: key("k"), body: "b"}); r.status != http.StatusConflict {
			t.Fatalf("duplicate while the abandoned one runs: %d", r.status)
		}
		close(b.release)
		if err := <-ctxErr; err == nil {
			t.Fatal("the handler's context was not cancelled after the client left")
		}
		f.events.waitOutcome(t, Executed)
		r := f.do(t, req{keys: key("k"), body: "b"})
		if r.status != http.StatusCreated || r.header.Get(ReplayedHeader) != "true" {
			t.Fatalf("retry: %d %v", r.status, r.header)
		}
		if f.calls.Load() != 1 {
			t.Fatalf("handler ran %d times", f.calls.Load())
		}
	})
	t.Run("handler gives up with 5xx", func(t *testing.T) {
		b := newBlocker()
		f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
			b.once.Do(func() { close(b.started) })
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
			w.WriteHeader(http.StatusServiceUnavailable)
		})
		disconnect(t, f, b)
		f.events.waitOutcome(t, Abandoned)
		if r := f.do(t, req{keys: key("k"), body: "b"}); r.status != http.StatusConflict {
			t.Fatalf("retry after an abandoned 5xx got %d, want 409 until the lease ends", r.status)
		}
		if f.calls.Load() != 1 {
			t.Fatalf("handler ran %d times", f.calls.Load())
		}
	})
}

func TestDetachKeepsHandlerContext(t *testing.T) {
	b := newBlocker()
	ctxErr := make(chan error, 1)
	f := newFixture(t, &Options{Detach: true}, nil, func(w http.ResponseWriter, r *http.Request) {
		b.once.Do(func() { close(b.started) })
		select {
		case <-b.release:
		case <-r.Context().Done():
		}
		ctxErr <- r.Context().Err()
		created(w, r)
	})
	// Record when the server cancels the original request's context, to
	// release the handler only after the client's departure was noticed.
	gone := make(chan struct{})
	var goneOnce sync.Once
	inner := f.srv.Config.Handler
	f.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		stop := context.AfterFunc(r.Context(), func() { goneOnce.Do(func() { close(gone) }) })
		defer stop()
		inner.ServeHTTP(w, r)
	})
	disconnect(t, f, b)
	waitClosed(t, gone)
	close(b.release)
	if err := <-ctxErr; err != nil {
		t.Fatalf("detached handler's context: %v", err)
	}
	f.events.waitOutcome(t, Executed)
	r := f.do(t, req{keys: key("k"), body: "b"})
	if r.status != http.StatusCreated || r.header.Get(ReplayedHeader) != "true" || f.calls.Load() != 1 {
		t.Fatalf("retry: %d %v, calls %d", r.status, r.header, f.calls.Load())
	}
}

func TestResponseTooLargeViaWriteString(t *testing.T) {
	big := strings.Repeat("s", 5000)
	f := newFixture(t, &Options{MaxStoredResponse: 4096}, nil, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, big[:4000])
		_, _ = io.WriteString(w, big[4000:])
	})
	if r := f.do(t, req{keys: key("k")}); r.body != big {
		t.Fatalf("delivered %d bytes", len(r.body))
	}
	if r := f.do(t, req{keys: key("k")}); r.status != http.StatusConflict || r.problem(t).OriginalStatus != http.StatusOK {
		t.Fatalf("retry: %d %q", r.status, r.body)
	}
}

// TestOuterFieldsBelongToEachRequest: fields an outer handler set before the
// middleware ran (a request id) are the retry's own on a replay, not the
// first request's; a field the handler changed is stored as it changed it.
func TestOuterFieldsBelongToEachRequest(t *testing.T) {
	g, err := idempotency.NewGuard(idempotency.NewMemoryStore(), nil)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := New(g, nil)
	if err != nil {
		t.Fatal(err)
	}
	inner := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Vary", "Origin, Accept")
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "made")
	}))
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", strconv.FormatInt(n.Add(1), 10))
		w.Header().Set("Vary", "Origin")
		inner.ServeHTTP(w, r)
	}))
	defer srv.Close()
	send := func() *http.Response {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
		req.Header.Set("Idempotency-Key", `"outer"`)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	first, second := send(), send()
	if second.Header.Get(ReplayedHeader) != "true" {
		t.Fatalf("second request not replayed: %d %v", second.StatusCode, second.Header)
	}
	if got := first.Header.Get("X-Request-Id"); got != "1" {
		t.Fatalf("first X-Request-Id %q, want 1", got)
	}
	if got := second.Header.Get("X-Request-Id"); got != "2" {
		t.Errorf("replay X-Request-Id %q, want the retry's own (2)", got)
	}
	if got := second.Header.Get("Vary"); got != "Origin, Accept" {
		t.Errorf("replay Vary %q, want the handler's %q", got, "Origin, Accept")
	}
	if got := second.Header.Get("Content-Type"); got != "text/plain" {
		t.Errorf("replay Content-Type %q, want text/plain", got)
	}
}

func countOutcome(os []Outcome, o Outcome) int {
	n := 0
	for _, x := range os {
		if x == o {
			n++
		}
	}
	return n
}
