package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestStalledReaderOfReplayCut: a replay written to a client that stopped
// reading is cut once -upstream-timeout + 1s have passed since its first
// byte, like an upstream exchange's response, instead of
// holding the handler (and the shutdown) for as long as the client likes.
func TestStalledReaderOfReplayCut(t *testing.T) {
	const size = 24 << 20
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(make([]byte, size))
	}))
	t.Cleanup(up.Close)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory", "-upstream-timeout", "2s", "-body-timeout", "500ms", "-max-response", "67108864")
	c := dialRaw(t, p.proxy)
	c.write(rawPost("HTTP/1.1", "/export", "replayme", "x"))
	resp, _ := c.response(http.MethodPost)
	if resp.StatusCode != 200 {
		t.Fatalf("first: %d", resp.StatusCode)
	}
	c2 := dialRaw(t, p.proxy)
	c2.write(rawPost("HTTP/1.1", "/export", "replayme", "x"))
	if _, err := http.ReadResponse(c2.br, nil); err != nil {
		t.Fatal(err)
	}
	// The client reads nothing more: the bound is 3s.
	start := time.Now()
	for {
		n := metricValue(t, p.admin, "idemproxy_requests_in_flight")
		if n == 0 {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("%v requests still in flight 10s after the replay began (bound 3s): the stalled reader holds it", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
