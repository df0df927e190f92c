package main

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"
)

// readUntilClosedOrAnswered reads from c until the proxy answers or closes
// the connection, and fails the test if the client's own deadline (20 s)
// came first: the proxy held the connection open.
func readUntilClosedOrAnswered(t *testing.T, c *rawClient) string {
	t.Helper()
	b, err := io.ReadAll(c.br)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the proxy neither answered nor closed the connection (got %q)", b)
	}
	var ne *net.OpError
	if err != nil && !errors.As(err, &ne) {
		t.Fatalf("reading: %v", err)
	}
	return string(b)
}

// TestSlowBodyTimesOut: a client that sends its header and then trickles
// (here: stops sending) its body is cut off after -body-timeout instead of
// holding a connection and a goroutine for as long as it likes. A guarded
// request does not reach the upstream and its key is not taken.
func TestSlowBodyTimesOut(t *testing.T) {
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory", "-body-timeout", "300ms")
	for _, tc := range []struct{ name, key string }{{"guarded", "slow"}, {"no key", ""}} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, p.proxy)
			req := rawPost("HTTP/1.1", "/orders", tc.key, strings.Repeat("x", 1000))
			c.write(req[:len(req)-990]) // the header and 10 bytes of the body, then nothing
			got := readUntilClosedOrAnswered(t, c)
			want := "HTTP/1.1 408 " // the proxy's answer when the upstream was reading the body
			if tc.key != "" {
				want = "HTTP/1.1 400 " // idemhttp's to a body it could not read
			}
			if got != "" && !strings.HasPrefix(got, want) {
				t.Errorf("the proxy answered %q; want %q or a closed connection\n%s", got, want, p.logs.String())
			}
		})
	}
	if n := up.ran("slow"); n != 0 {
		t.Fatalf("the upstream ran the guarded request %d times; want 0", n)
	}
	if s := keyState(t, p.admin, "slow"); s != "" {
		t.Fatalf("the key is %s; want no record", s)
	}
}

// TestIdleConnectionClosed: a keep-alive connection on which no request
// comes is closed after -idle-timeout.
func TestIdleConnectionClosed(t *testing.T) {
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory", "-idle-timeout", "300ms")
	c := dialRaw(t, p.proxy)
	c.write(rawPost("HTTP/1.1", "/orders", "idle", "x"))
	if resp, body := c.response(http.MethodPost); resp.StatusCode != http.StatusCreated {
		t.Fatalf("= %d %q; want 201", resp.StatusCode, body)
	}
	if got := readUntilClosedOrAnswered(t, c); got != "" {
		t.Fatalf("unasked for: %q", got)
	}
}

// TestBodyTimeoutSparesSlowUpstream: -body-timeout bounds only the
// arrival of the request body, not the exchange: an upstream slower than
// it still answers, whether the request is guarded, has no key, or has no
// body.
func TestBodyTimeoutSparesSlowUpstream(t *testing.T) {
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory", "-body-timeout", "200ms")
	for _, tc := range []struct{ name, method, key string }{
		{"guarded", http.MethodPost, "slow-up"},
		{"no key", http.MethodPost, ""},
		{"GET", http.MethodGet, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader
			if tc.method == http.MethodPost {
				body = strings.NewReader("x")
			}
			req, _ := http.NewRequest(tc.method, "http://"+p.proxy+"/orders?sleep=700ms", body)
			if tc.key != "" {
				req.Header.Set("Idempotency-Key", `"`+tc.key+`"`)
			}
			resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Fatalf("= %d %q; want the upstream's 201", resp.StatusCode, b)
			}
		})
	}
}

// TestServerTimeoutDefaults: without flags the proxy has a body timeout
// and an idle timeout; a proxy with none can be held open by any client.
func TestServerTimeoutDefaults(t *testing.T) {
	cfg, err := parseConfig([]string{"-upstream", "http://127.0.0.1:1"}, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.bodyTimeout <= 0 || cfg.idleTimeout <= 0 {
		t.Fatalf("-body-timeout %v, -idle-timeout %v; want both set by default", cfg.bodyTimeout, cfg.idleTimeout)
	}
}

// TestStalledReaderCutAtUpstreamTimeout: a client that stops reading a
// large response leaves the proxy blocked in a write to it. At
// -upstream-timeout that write is cut short too, as the upstream exchange
// is: the request ends (its claim kept, as for any response cut off)
// instead of holding a goroutine, the upstream connection and the claim
// for as long as the client keeps its connection open.
func TestStalledReaderCutAtUpstreamTimeout(t *testing.T) {
	upDone := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(upDone)
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/octet-stream")
		chunk := make([]byte, 1<<20)
		for range 256 {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	t.Cleanup(up.Close)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory", "-upstream-timeout", "500ms", "-lease", "1m")
	c := dialRaw(t, p.proxy)
	c.write(rawPost("HTTP/1.1", "/export", "stalled", "x"))
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("= %v %v; want a 200 header", resp, err)
	}
	// The client reads nothing more and keeps the connection open.
	select {
	case <-upDone:
	case <-time.After(15 * time.Second):
		t.Fatal("the upstream handler is still writing: the proxy is still blocked on the stalled client")
	}
	deadline := time.Now().Add(10 * time.Second)
	for metricValue(t, p.admin, "idemproxy_requests_in_flight") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the request is still in flight")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if s := keyState(t, p.admin, "stalled"); s != "PROCESSING" {
		t.Fatalf("the key is %q; want its claim kept (the response was cut off)", s)
	}
}

// TestStreamedUploadOutlastsBodyTimeout: a request the proxy streams to
// the upstream (here: one without a key) may take longer than
// -body-timeout in all, as a large upload does, as long as it never pauses
// for that long.
func TestStreamedUploadOutlastsBodyTimeout(t *testing.T) {
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory", "-body-timeout", "300ms")
	pr, pw := io.Pipe()
	go func() {
		for range 10 {
			time.Sleep(100 * time.Millisecond)
			if _, err := io.WriteString(pw, "0123456789"); err != nil {
				return
			}
		}
		pw.Close()
	}()
	req, _ := http.NewRequest(http.MethodPost, "http://"+p.proxy+"/upload", pr)
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || !strings.HasSuffix(string(b), "body="+strings.Repeat("0123456789", 10)) {
		t.Fatalf("= %d %q; want 201 with the whole body", resp.StatusCode, b)
	}
}
