package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestUpstream5xxReleased: a 5xx from the upstream is passed on and not
// stored (DefaultStoreStatus): the key is released and the retry runs at
// once.
func TestUpstream5xxReleased(t *testing.T) {
	var calls atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if calls.Add(1) == 1 {
			http.Error(w, "try later", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "made")
	}))
	t.Cleanup(up.Close)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory")
	if r := mustPost(t, p.proxy, "/pay", "five", "x"); r.status != http.StatusServiceUnavailable || r.body != "try later\n" {
		t.Fatalf("first = %d %q; want the upstream's 503", r.status, r.body)
	}
	if s := keyState(t, p.admin, "five"); s != "" {
		t.Fatalf("after the 503 the key is %s; want it released", s)
	}
	if r := mustPost(t, p.proxy, "/pay", "five", "x"); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry = %d %q; want 201 executed", r.status, r.body)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("upstream calls = %d; want 2", n)
	}
}

// TestUpstreamDNSFailure: an upstream host name that does not resolve
// means nothing was sent: 502 upstream-unreachable, and the key is
// released.
func TestUpstreamDNSFailure(t *testing.T) {
	// .invalid never resolves (RFC 6761).
	p := startInproc(t, "-upstream", "http://idemproxy-test.invalid:9", "-store", "memory")
	r := mustPost(t, p.proxy, "/pay", "dns", "x")
	if r.status != http.StatusBadGateway || !strings.Contains(r.body, "upstream-unreachable") {
		t.Fatalf("= %d %q; want 502 upstream-unreachable", r.status, r.body)
	}
	if s := keyState(t, p.admin, "dns"); s != "" {
		t.Fatalf("the key is %s; want it released", s)
	}
}
