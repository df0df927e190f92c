package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestStreamingResponseFlushed: an upstream that streams (server-sent
// events, or any body of unknown length) and flushes reaches the client
// as it is written on the first execution, not when it ends; the retry
// replays the whole stream.
func TestStreamingResponseFlushed(t *testing.T) {
	for _, ctype := range []string{"text/event-stream", "application/octet-stream"} {
		t.Run(ctype, func(t *testing.T) {
			next := make(chan struct{})
			var calls, gaveUp atomic.Int64
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				calls.Add(1)
				w.Header().Set("Content-Type", ctype)
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, "data: one\n\n")
				http.NewResponseController(w).Flush()
				select {
				case <-next: // the client got the first event
				case <-time.After(10 * time.Second):
					gaveUp.Add(1)
				}
				io.WriteString(w, "data: two\n\n")
			}))
			t.Cleanup(up.Close)
			p := startInproc(t, "-upstream", up.URL, "-store", "memory")

			req, _ := http.NewRequest(http.MethodPost, "http://"+p.proxy+"/events", strings.NewReader("x"))
			req.Header.Set("Idempotency-Key", `"stream"`)
			resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			line, err := br.ReadString('\n')
			if err != nil || line != "data: one\n" {
				t.Fatalf("first line = %q, %v", line, err)
			}
			if gaveUp.Load() != 0 {
				t.Fatal("the first event reached the client only once the upstream's response was over: the proxy buffered it")
			}
			close(next)
			rest, err := io.ReadAll(br)
			if err != nil || string(rest) != "\ndata: two\n\n" {
				t.Fatalf("rest = %q, %v", rest, err)
			}
			r := mustPost(t, p.proxy, "/events", "stream", "x")
			if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" || r.body != "data: one\n\ndata: two\n\n" ||
				r.header.Get("Content-Type") != ctype {
				t.Fatalf("retry = %d %v %q; want the stream replayed", r.status, r.header, r.body)
			}
			if n := calls.Load(); n != 1 {
				t.Fatalf("upstream calls = %d; want 1", n)
			}
		})
	}
}

// TestResponseTooLargeToStore: a response over the stored limit reaches
// the client whole; the retry gets 409 response-not-replayable naming the
// original status, and the upstream is not called again.
func TestResponseTooLargeToStore(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		size int
	}{
		{"default limit", nil, 1<<20 + 1},
		{"-max-response", []string{"-max-response", "1000"}, 1001},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int64
			big := bytes.Repeat([]byte("0123456789abcdef"), tc.size/16+1)[:tc.size]
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				calls.Add(1)
				w.Header().Set("Content-Type", "application/octet-stream")
				w.WriteHeader(http.StatusCreated)
				w.Write(big)
			}))
			t.Cleanup(up.Close)
			p := startInproc(t, append([]string{"-upstream", up.URL, "-store", "memory"}, tc.args...)...)
			r := mustPost(t, p.proxy, "/export", "big", "x")
			if r.status != http.StatusCreated || r.body != string(big) {
				t.Fatalf("first = %d, %d bytes; want 201 with all %d", r.status, len(r.body), len(big))
			}
			r = mustPost(t, p.proxy, "/export", "big", "x")
			if r.status != http.StatusConflict || !strings.Contains(r.body, "response-not-replayable") ||
				!strings.Contains(r.body, `"original_status":201`) {
				t.Fatalf("retry = %d %q; want 409 response-not-replayable, original status 201", r.status, r.body)
			}
			if n := calls.Load(); n != 1 {
				t.Fatalf("upstream calls = %d; want 1", n)
			}
		})
	}
}

// TestTrailersReplayed: trailers the upstream sends reach the client, and
// the replay sends them again.
func TestTrailersReplayed(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Trailer", "X-Checksum")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "payload")
		w.Header().Set("X-Checksum", "abc123")
	}))
	t.Cleanup(up.Close)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory")
	for i, replayed := range []string{"", "true"} {
		req, _ := http.NewRequest(http.MethodPost, "http://"+p.proxy+"/orders", strings.NewReader("x"))
		req.Header.Set("Idempotency-Key", `"trailer"`)
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != "payload" || resp.Header.Get("Idempotent-Replayed") != replayed ||
			resp.Trailer.Get("X-Checksum") != "abc123" {
			t.Fatalf("response %d = %d %q %v, trailer %v; want payload with X-Checksum: abc123 (replayed %q)",
				i, resp.StatusCode, b, err, resp.Trailer, replayed)
		}
	}
}

// TestEarlyHintsForwarded: a 103 Early Hints from the upstream reaches an
// HTTP/1.1 client before the final response on the first execution; the
// replay sends the final response alone.
func TestEarlyHintsForwarded(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Link", "</app.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "made")
	}))
	t.Cleanup(up.Close)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory")
	for i, wantHints := range []bool{true, false} {
		var hints []string
		trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
			hints = append(hints, fmt.Sprintf("%d %s", code, h.Get("Link")))
			return nil
		}}
		req, _ := http.NewRequest(http.MethodPost, "http://"+p.proxy+"/orders", strings.NewReader("x"))
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
		req.Header.Set("Idempotency-Key", `"hints"`)
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || string(b) != "made" {
			t.Fatalf("response %d = %d %q; want 201 made", i, resp.StatusCode, b)
		}
		if wantHints && (len(hints) != 1 || hints[0] != "103 </app.css>; rel=preload") {
			t.Fatalf("first execution: informational responses %q; want one 103 with the Link", hints)
		}
		if !wantHints && len(hints) != 0 {
			t.Fatalf("replay: informational responses %q; want none", hints)
		}
		if resp.Header.Get("Link") != "" {
			t.Fatalf("response %d carries the hint's Link in its final header: %v", i, resp.Header)
		}
	}
}

// TestNoBodyStatusWithBody: an upstream that sends a body with a 204 or
// 304, which has none, is answered without it, and so is the replay; the
// bytes it sent do not leak into the client's next response.
func TestNoBodyStatusWithBody(t *testing.T) {
	for _, tc := range []struct {
		status int
		line   string
	}{
		{http.StatusNoContent, "204 No Content"},
		{http.StatusNotModified, "304 Not Modified"},
	} {
		t.Run(tc.line, func(t *testing.T) {
			up := newRawUpstream(t, func(_ int64, _ *http.Request, _ []byte, conn net.Conn) {
				io.WriteString(conn, "HTTP/1.1 "+tc.line+"\r\nConnection: close\r\nX-Made: yes\r\nContent-Length: 5\r\n\r\nhello")
			})
			p := startInproc(t, "-upstream", up.URL, "-store", "memory")
			c := dialRaw(t, p.proxy)
			for i, replayed := range []string{"", "true"} {
				c.write(rawPost("HTTP/1.1", "/orders", "nobody", "x"))
				resp, body := c.response(http.MethodPost)
				if resp.StatusCode != tc.status || body != "" || resp.Header.Get("X-Made") != "yes" ||
					resp.Header.Get("Idempotent-Replayed") != replayed {
					t.Fatalf("response %d = %d %v %q; want %d without a body (replayed %q)", i, resp.StatusCode, resp.Header, body, tc.status, replayed)
				}
			}
			// The same connection carries a next request cleanly: the five
			// bytes did not become the start of its response.
			c.write("GET /next HTTP/1.1\r\nHost: proxy\r\n\r\n")
			if resp, body := c.response(http.MethodGet); resp.StatusCode != tc.status || body != "" || resp.Header.Get("X-Made") != "yes" {
				t.Fatalf("next response = %d %v %q; want the upstream's %d again", resp.StatusCode, resp.Header, body, tc.status)
			}
			if n := up.calls.Load(); n != 2 { // the POST once, the GET
				t.Fatalf("upstream calls = %d; want 2", n)
			}
		})
	}
}

// TestUpstreamShortBody: an upstream that breaks off its body (fewer bytes
// than its Content-Length, then a clean close; or a chunked body without its
// last chunk) did the work and sent no whole response. The client sees the
// response cut short, nothing is stored, the claim is kept, and a retry
// inside the lease gets 409 rather than a truncated body replayed as whole.
func TestUpstreamShortBody(t *testing.T) {
	for _, tc := range []struct{ name, raw string }{
		{"content-length", "HTTP/1.1 201 Created\r\nConnection: close\r\nContent-Length: 100\r\n\r\n" + strings.Repeat("h", 50)},
		{"chunked", "HTTP/1.1 201 Created\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n32\r\n" + strings.Repeat("h", 50) + "\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newRawUpstream(t, func(_ int64, _ *http.Request, _ []byte, conn net.Conn) {
				io.WriteString(conn, tc.raw)
			})
			p := startInproc(t, "-upstream", up.URL, "-store", "memory", "-lease", "1m")
			req, _ := http.NewRequest(http.MethodPost, "http://"+p.proxy+"/pay", strings.NewReader("x"))
			req.Header.Set("Idempotency-Key", `"short"`)
			resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
			if err == nil {
				b, rerr := io.ReadAll(resp.Body)
				resp.Body.Close()
				if rerr == nil {
					t.Fatalf("the client got a whole response from an upstream that broke off: %d %q", resp.StatusCode, b)
				}
			}
			if s := keyState(t, p.admin, "short"); s != "PROCESSING" {
				t.Fatalf("the key is %q; want its claim kept (PROCESSING)", s)
			}
			if r := mustPost(t, p.proxy, "/pay", "short", "x"); r.status != http.StatusConflict {
				t.Fatalf("retry = %d %q; want 409 in flight", r.status, r.body)
			}
			if n := up.calls.Load(); n != 1 {
				t.Fatalf("upstream calls = %d; want 1", n)
			}
		})
	}
}

// TestGzipPassedThrough: a gzip-encoded upstream response to a client
// that accepts gzip reaches it as sent, and the replay sends the same
// bytes with the same Content-Encoding. A client that sent no
// Accept-Encoding gets the body decoded (the proxy's Transport asked for
// gzip on its own behalf), and so does its replay.
func TestGzipPassedThrough(t *testing.T) {
	const plain = "a compressible response, a compressible response, a compressible response"
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	io.WriteString(zw, plain)
	zw.Close()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			t.Errorf("the upstream got Accept-Encoding %q", r.Header.Get("Accept-Encoding"))
		}
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Set("Vary", "Accept-Encoding")
		w.WriteHeader(http.StatusCreated)
		w.Write(zipped.Bytes())
	}))
	t.Cleanup(up.Close)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory")
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableCompression: true}}
	t.Cleanup(c.CloseIdleConnections)
	for i, replayed := range []string{"", "true"} {
		req, _ := http.NewRequest(http.MethodPost, "http://"+p.proxy+"/orders", strings.NewReader("x"))
		req.Header.Set("Idempotency-Key", `"gz"`)
		req.Header.Set("Accept-Encoding", "gzip")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || resp.Header.Get("Content-Encoding") != "gzip" ||
			resp.Header.Get("Content-Type") != "text/plain" || !bytes.Equal(b, zipped.Bytes()) ||
			resp.Header.Get("Idempotent-Replayed") != replayed {
			t.Fatalf("response %d = %d %v, %d bytes; want 201 gzip, the upstream's %d bytes (replayed %q)",
				i, resp.StatusCode, resp.Header, len(b), zipped.Len(), replayed)
		}
	}
	for i, replayed := range []string{"", "true"} {
		rc := dialRaw(t, p.proxy)
		rc.write(rawPost("HTTP/1.1", "/orders", "identity", "x"))
		resp, body := rc.response(http.MethodPost)
		if resp.StatusCode != http.StatusCreated || resp.Header.Get("Content-Encoding") != "" || body != plain ||
			resp.Header.Get("Idempotent-Replayed") != replayed {
			t.Fatalf("without Accept-Encoding, response %d = %d %v %q; want 201, the decoded body (replayed %q)",
				i, resp.StatusCode, resp.Header, body, replayed)
		}
	}
}

// TestUpstreamTimeoutCutsStream: -upstream-timeout bounds the whole
// upstream exchange, the response body included: a response still coming
// when it passes is cut off (the client sees it broken, not ended), and its
// claim is kept until the lease ends, as for any response cut short.
func TestUpstreamTimeoutCutsStream(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: one\n\n")
		http.NewResponseController(w).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
		io.WriteString(w, "data: two\n\n")
	}))
	t.Cleanup(func() {
		close(release)
		up.Close()
	})
	p := startInproc(t, "-upstream", up.URL, "-store", "memory", "-upstream-timeout", "300ms", "-lease", "1m")
	req, _ := http.NewRequest(http.MethodPost, "http://"+p.proxy+"/events", strings.NewReader("x"))
	req.Header.Set("Idempotency-Key", `"long-stream"`)
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Fatalf("the client got %q as a whole response; want it cut off", b)
	}
	if string(b) != "data: one\n\n" {
		t.Fatalf("before the cut the client got %q", b)
	}
	if s := keyState(t, p.admin, "long-stream"); s != "PROCESSING" {
		t.Fatalf("the key is %q; want its claim kept", s)
	}
}
