package main

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestResponseBudgetFromFirstByte: the write bound on a response counts
// from its first byte, not from the request. A guarded body that takes
// longer than -upstream-timeout to arrive (-body-timeout 0: no limit), then
// an upstream that answers at once with a response too large to sit in the
// server's buffer: the upstream ran, and its whole response must reach the
// client instead of being cut by a budget spent before it began.
func TestResponseBudgetFromFirstByte(t *testing.T) {
	const size = 100 << 10
	var calls atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(bytes.Repeat([]byte("x"), size))
	}))
	t.Cleanup(up.Close)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory", "-body-timeout", "0", "-upstream-timeout", "1s")
	c := dialRaw(t, p.proxy)
	req := rawPost("HTTP/1.1", "/orders", "late-body", strings.Repeat("b", 100))
	c.write(req[:len(req)-100]) // the header; the body comes late
	time.Sleep(2500 * time.Millisecond)
	c.write(req[len(req)-100:])
	resp, body := c.response(http.MethodPost)
	if resp.StatusCode != http.StatusCreated || len(body) != size {
		t.Fatalf("= %d with %d body bytes; want 201 with %d (upstream ran %d times)", resp.StatusCode, len(body), size, calls.Load())
	}
}
