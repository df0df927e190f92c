package idemhttp

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/archlab/idempotency/internal/testenv"
)

// A handler that forwards the request gets a body that net/http's
// Transport knows to be in memory, and its length, so that the request's
// head and body go upstream in one write, with a Content-Length even when
// the client sent the body chunked. For a body of any other type the
// Transport flushes the head on its own first: one more system call and
// packet per guarded request, on the path where idemproxy has the least
// time to spare. (httputil.ReverseProxy wraps the body in a reader of its
// own; idemproxy unwraps it, see its TestGuardedBodyOneWriteUpstream.)
func TestProxiedBodyOneWrite(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.ContentLength != int64(len(b)) || len(r.TransferEncoding) != 0 {
			t.Errorf("upstream got Content-Length %d and Transfer-Encoding %q for %d bytes", r.ContentLength, r.TransferEncoding, len(b))
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(b)
	}))
	t.Cleanup(upstream.Close)
	var writes atomic.Int64
	tr := testenv.WriteCountingTransport(&writes)
	t.Cleanup(tr.CloseIdleConnections)
	f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
		out, err := http.NewRequestWithContext(r.Context(), r.Method, upstream.URL, r.Body)
		if err != nil {
			t.Error(err)
			return
		}
		out.ContentLength = r.ContentLength
		out.TransferEncoding = r.TransferEncoding
		resp, err := tr.RoundTrip(out)
		if err != nil {
			t.Error(err)
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.Header().Set("X-Upstream-Length", strconv.FormatInt(resp.ContentLength, 10))
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	})

	const body = `{"sku":"A-1","qty":2}`
	for i, tc := range []struct {
		key, body string
		chunked   bool
	}{
		{`"one-write-1"`, body, false},
		{`"one-write-2"`, strings.Repeat("x", 600), false}, // beyond the exchange's inline room
		{`"one-write-3"`, body, true},
	} {
		var rd io.Reader = strings.NewReader(tc.body)
		if tc.chunked {
			rd = struct{ io.Reader }{rd} // unknown length: sent chunked
		}
		rq, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/", rd)
		rq.Header.Set("Idempotency-Key", tc.key)
		writes.Store(0)
		resp, err := f.srv.Client().Do(rq)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || string(got) != tc.body {
			t.Fatalf("request %d: %d %q, want 201 and the body echoed", i, resp.StatusCode, got)
		}
		if n := writes.Load(); n != 1 {
			t.Errorf("request %d: the guarded request went upstream in %d writes, want 1 (head and body together)", i, n)
		}
	}
	if n := f.calls.Load(); n != 3 {
		t.Fatalf("%d handler calls, want 3", n)
	}
}
