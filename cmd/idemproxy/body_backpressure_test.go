package main

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"
)

// TestStreamedUploadUpstreamBackpressure: an upstream that pauses reading
// (backpressure) for longer than -body-timeout does not cut the upload of
// a client that never paused: the timeout bounds the client's pauses, not
// the proxy's.
func TestStreamedUploadUpstreamBackpressure(t *testing.T) {
	const size = 16 << 20
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 64<<10)
		n, _ := io.ReadFull(r.Body, buf)
		time.Sleep(1200 * time.Millisecond) // busy with the first part
		m, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			w.WriteHeader(599)
			io.WriteString(w, "upstream read error: "+err.Error())
			return
		}
		w.WriteHeader(201)
		io.WriteString(w, strconv.FormatInt(int64(n)+m, 10))
	}))
	t.Cleanup(up.Close)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory", "-body-timeout", "400ms")
	req, _ := http.NewRequest(http.MethodPost, "http://"+p.proxy+"/upload", bytes.NewReader(make([]byte, size)))
	start := time.Now()
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("after %v: %v", time.Since(start), err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || string(b) != strconv.Itoa(size) {
		t.Fatalf("= %d %q; want 201 %d", resp.StatusCode, b, size)
	}
}
