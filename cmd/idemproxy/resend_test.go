package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestTransportDoesNotResend checks that the proxy's http.Transport never
// sends a guarded request to the upstream a second time on its own. The
// Transport resends a body-less request on a reused connection that the
// server closed without answering when the request carries Idempotency-Key
// or X-Idempotency-Key: here the upstream reads the request, then hangs up
// without an answer, as if it crashed after acting on it.
func TestTransportDoesNotResend(t *testing.T) {
	var mu sync.Mutex
	runs := map[string]int{}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		runs[r.URL.Path]++
		n := runs[r.URL.Path]
		mu.Unlock()
		if r.URL.Path != "/warm" && n == 1 {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			conn.Close()
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(up.Close)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory", "-lease", "30s")
	for _, name := range []string{"Idempotency-Key", "X-Idempotency-Key"} {
		t.Run(name, func(t *testing.T) {
			c := &http.Client{Timeout: 10 * time.Second}
			send := func(path, key string) *http.Response {
				req, err := http.NewRequest(http.MethodPost, "http://"+p.proxy+path, nil)
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Idempotency-Key", key)
				req.Header.Set(name, key)
				resp, err := c.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				return resp
			}
			// A first exchange leaves an idle connection to the upstream
			// that the next request reuses.
			if r := send("/warm", "warm-"+name); r.StatusCode != http.StatusCreated {
				t.Fatalf("warm-up = %d", r.StatusCode)
			}
			path := "/" + strings.ToLower(name)
			r := send(path, "k-"+name)
			mu.Lock()
			n := runs[path]
			mu.Unlock()
			if n != 1 {
				t.Fatalf("the upstream received the guarded request %d times (reply %d); want 1", n, r.StatusCode)
			}
			if r.StatusCode != http.StatusBadGateway {
				t.Fatalf("reply %d; want 502 (sent, no answer)", r.StatusCode)
			}
		})
	}
}
