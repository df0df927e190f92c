package main

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemhttp"
	"github.com/archlab/idempotency/internal/testenv"
)

// A guarded request's body, read whole by the middleware, goes upstream in
// one write with the request's head, with a Content-Length even when the
// client sent it chunked. ReverseProxy wraps every outgoing body in a
// reader of its own, which the Transport cannot tell is in memory: it then
// flushes the head on its own first (a second system call and packet per
// request, about 7 µs of the proxy's CPU here) and sends a chunked upload
// chunked.
func TestGuardedBodyOneWriteUpstream(t *testing.T) {
	type seen struct {
		length   int64
		encoding []string
		body     string
		trailer  string
	}
	var (
		mu   sync.Mutex
		last seen
	)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		last = seen{r.ContentLength, r.TransferEncoding, string(b), r.Trailer.Get("X-Checksum")}
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	var writes atomic.Int64
	tr := testenv.WriteCountingTransport(&writes)
	t.Cleanup(tr.CloseIdleConnections)
	guard, err := idempotency.NewGuard(idempotency.NewMemoryStore(), nil)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.New(guard, &idemhttp.Options{Detach: true})
	if err != nil {
		t.Fatal(err)
	}
	proxy := httptest.NewServer(mw.Handler(newReverseProxy(u, 0, slog.New(slog.DiscardHandler), tr)))
	t.Cleanup(proxy.Close)

	const body = `{"sku":"A-1","qty":2}`
	for _, tc := range []struct {
		name    string
		key     string
		chunked bool
		body    string
		writes  int64 // 0: not counted
		trailer string
	}{
		{"guarded", `"w-1"`, false, body, 1, ""},
		{"guarded, sent chunked", `"w-2"`, true, body, 1, ""},
		{"guarded, beyond the inline room", `"w-3"`, false, strings.Repeat("x", 2000), 1, ""},
		// Only chunked carries trailers: that body stays chunked.
		{"guarded, chunked with a trailer", `"w-4"`, true, body, 0, "c0ffee"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rd io.Reader = strings.NewReader(tc.body)
			if tc.chunked {
				rd = struct{ io.Reader }{rd} // unknown length: sent chunked
			}
			req, _ := http.NewRequest(http.MethodPost, proxy.URL+"/orders", rd)
			req.Header.Set("Idempotency-Key", tc.key)
			if tc.trailer != "" {
				req.Trailer = http.Header{"X-Checksum": {tc.trailer}}
			}
			writes.Store(0)
			resp, err := proxy.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Fatalf("status %d, want 201", resp.StatusCode)
			}
			mu.Lock()
			got := last
			mu.Unlock()
			switch {
			case got.body != tc.body || got.trailer != tc.trailer:
				t.Errorf("upstream got %d bytes and trailer %q; want %d and %q", len(got.body), got.trailer, len(tc.body), tc.trailer)
			case tc.trailer == "" && (got.length != int64(len(tc.body)) || len(got.encoding) != 0):
				t.Errorf("upstream got Content-Length %d and Transfer-Encoding %q; want Content-Length %d",
					got.length, got.encoding, len(tc.body))
			}
			if n := writes.Load(); tc.writes != 0 && n != tc.writes {
				t.Errorf("the request went upstream in %d writes, want %d", n, tc.writes)
			}
		})
	}
}
