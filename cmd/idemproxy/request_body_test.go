package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestChunkedRequestBody: a body sent without Content-Length (chunked)
// reaches the upstream intact, and its retry, chunked again, replays.
func TestChunkedRequestBody(t *testing.T) {
	var mu sync.Mutex
	var got []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("upstream reading the body: %v", err)
		}
		mu.Lock()
		got = append(got, string(b))
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "len="+strconv.Itoa(len(b)))
	}))
	t.Cleanup(up.Close)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory")
	body := strings.Repeat("0123456789", 3000)
	send := func() *http.Response {
		req, _ := http.NewRequest(http.MethodPost, "http://"+p.proxy+"/orders", io.MultiReader(strings.NewReader(body)))
		req.Header.Set("Idempotency-Key", `"chunked"`)
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		return resp
	}
	if r := send(); r.StatusCode != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first = %d %v; want 201 executed", r.StatusCode, r.Header)
	}
	if r := send(); r.StatusCode != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry = %d %v; want 201 replayed", r.StatusCode, r.Header)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || got[0] != body {
		t.Fatalf("the upstream got %d requests (first %d bytes); want 1 with the %d-byte body", len(got), len(firstOf(got)), len(body))
	}
}

func firstOf(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

// TestBodyLimit: a body of exactly -max-body bytes is forwarded; one byte
// more, with or without Content-Length, gets 413 problem+json, the
// upstream is not called, and the key is not taken: the same key with a
// body that fits then runs.
func TestBodyLimit(t *testing.T) {
	const limit = 1000
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory", "-max-body", strconv.Itoa(limit))
	c := &http.Client{Timeout: 10 * time.Second}
	send := func(key string, n int, chunked bool) reply {
		body := io.Reader(strings.NewReader(strings.Repeat("x", n)))
		if chunked {
			body = io.MultiReader(body)
		}
		req, _ := http.NewRequest(http.MethodPost, "http://"+p.proxy+"/orders", body)
		req.Header.Set("Idempotency-Key", `"`+key+`"`)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("key %s: %v", key, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return reply{status: resp.StatusCode, header: resp.Header, body: string(b)}
	}
	for _, chunked := range []bool{false, true} {
		t.Run("chunked="+strconv.FormatBool(chunked), func(t *testing.T) {
			key := "limit-" + strconv.FormatBool(chunked)
			before := up.total.Load()
			r := send(key, limit+1, chunked)
			if r.status != http.StatusRequestEntityTooLarge || !strings.Contains(r.header.Get("Content-Type"), "application/problem+json") {
				t.Fatalf("%d bytes = %d %q %q; want 413 problem+json", limit+1, r.status, r.header.Get("Content-Type"), r.body)
			}
			if n := up.total.Load() - before; n != 0 {
				t.Fatalf("the upstream was called %d times for a body over the limit", n)
			}
			if s := keyState(t, p.admin, key); s != "" {
				t.Fatalf("after the 413 the key is %s; want no record", s)
			}
			r = send(key, limit, chunked)
			if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" ||
				!strings.HasSuffix(r.body, "body="+strings.Repeat("x", limit)) {
				t.Fatalf("the same key with %d bytes = %d %q; want 201 executed with the whole body", limit, r.status, r.body)
			}
		})
	}
}

// TestExpectContinue: the proxy reads the whole body to fingerprint it, so
// it answers "100 Continue" itself, before it calls the upstream. The body
// reaches the upstream intact, and the client gets one 100 Continue, not a
// second one relayed from the upstream after the body was sent. A declared
// length over -max-body gets 413 at once, without a 100 Continue, so the
// client need not send the body.
func TestExpectContinue(t *testing.T) {
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory", "-max-body", "1000")

	c := dialRaw(t, p.proxy)
	c.write("POST /orders HTTP/1.1\r\nHost: proxy\r\nIdempotency-Key: \"exp\"\r\nExpect: 100-continue\r\nContent-Length: 11\r\n\r\n")
	resp, _ := c.response(http.MethodPost)
	if resp.StatusCode != http.StatusContinue {
		t.Fatalf("before the body: %d; want 100 Continue", resp.StatusCode)
	}
	c.write("hello world")
	var informational []int
	for {
		resp, body := c.response(http.MethodPost)
		if resp.StatusCode < 200 {
			informational = append(informational, resp.StatusCode)
			continue
		}
		if resp.StatusCode != http.StatusCreated || !strings.HasSuffix(body, "body=hello world") {
			t.Fatalf("final response = %d %q; want 201 with the body as sent", resp.StatusCode, body)
		}
		break
	}
	if len(informational) != 0 {
		t.Errorf("after the body the client got the informational responses %v; want none (the 100 Continue came already)", informational)
	}

	c = dialRaw(t, p.proxy)
	c.write("POST /orders HTTP/1.1\r\nHost: proxy\r\nIdempotency-Key: \"exp-big\"\r\nExpect: 100-continue\r\nContent-Length: 5000\r\n\r\n")
	resp, body := c.response(http.MethodPost)
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("a declared 5000 bytes = %d %q; want 413 before the body", resp.StatusCode, body)
	}
	if n := up.total.Load(); n != 1 {
		t.Fatalf("the upstream was called %d times; want 1", n)
	}
}

// TestClientHangsUpMidBody: a client sends half its body and hangs up.
// Nothing reaches the upstream, the key is not taken, and a retry with the
// whole body runs at once.
func TestClientHangsUpMidBody(t *testing.T) {
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory")
	c := dialRaw(t, p.proxy)
	c.write("POST /orders HTTP/1.1\r\nHost: proxy\r\nIdempotency-Key: \"half\"\r\nContent-Length: 1000\r\n\r\n" + strings.Repeat("x", 500))
	c.conn.Close()
	// The proxy sees the body end early and counts a bad request.
	deadline := time.Now().Add(10 * time.Second)
	for metricValueOr(t, p.admin, `idemproxy_requests_total{outcome="bad_request"}`) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the proxy never finished the cut request")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := up.total.Load(); n != 0 {
		t.Fatalf("the upstream was called %d times for a body cut short", n)
	}
	if s := keyState(t, p.admin, "half"); s != "" {
		t.Fatalf("the key is %s after the client hung up; want no record", s)
	}
	r := mustPost(t, p.proxy, "/orders", "half", strings.Repeat("x", 1000))
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry = %d %q; want 201 executed", r.status, r.body)
	}
}

// metricValueOr is metricValue, 0 for a series not yet in /metrics.
func metricValueOr(t *testing.T, admin, name string) float64 {
	t.Helper()
	if !strings.Contains(get(t, "http://"+admin+"/metrics").body, name+" ") {
		return 0
	}
	return metricValue(t, admin, name)
}

// TestHTTP10Client: a client speaking HTTP/1.0 (no chunking, no 1xx)
// is served and replayed, and gets no informational response, which it
// would take for the final one (RFC 9110, section 15.2: a server must not
// send a 1xx response to an HTTP/1.0 client).
func TestHTTP10Client(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Link", "</app.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "made")
	}))
	t.Cleanup(up.Close)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory")
	for i, want := range []string{"", "true"} {
		c := dialRaw(t, p.proxy)
		c.write(rawPost("HTTP/1.0", "/orders", "one-oh", "x"))
		resp, body := c.response(http.MethodPost)
		if resp.StatusCode != http.StatusCreated || body != "made" || resp.Header.Get("Idempotent-Replayed") != want {
			t.Fatalf("request %d over HTTP/1.0: first response %d %v %q; want 201 %q (replayed %q)", i, resp.StatusCode, resp.Header, body, "made", want)
		}
	}
}

// TestLongKeyAndHeader: a key of 255 characters is served; one of 256 is
// a 400 invalid-key that does not reach the upstream; a header section past
// net/http's 1 MB limit gets 431.
func TestLongKeyAndHeader(t *testing.T) {
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory")
	if r := mustPost(t, p.proxy, "/orders", strings.Repeat("k", 255), "x"); r.status != http.StatusCreated {
		t.Fatalf("255-character key = %d %q; want 201", r.status, r.body)
	}
	r := mustPost(t, p.proxy, "/orders", strings.Repeat("k", 256), "x")
	if r.status != http.StatusBadRequest || !strings.Contains(r.body, "invalid-key") {
		t.Fatalf("256-character key = %d %q; want 400 invalid-key", r.status, r.body)
	}
	if n := up.total.Load(); n != 1 {
		t.Fatalf("the upstream was called %d times; want 1", n)
	}
	c := dialRaw(t, p.proxy)
	// Written on the side: the proxy answers before it has read it all.
	go io.WriteString(c.conn, rawPost("HTTP/1.1", "/orders", "huge-header", "x", "X-Big: "+strings.Repeat("a", 2<<20)))
	resp, _ := c.response(http.MethodPost)
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("a 2 MiB header = %d; want 431", resp.StatusCode)
	}
}

// TestExpectNotForwardedOnceBodyRead: the proxy has a guarded body whole
// before it calls the upstream, so it does not pass Expect: 100-continue
// on: an upstream that does not support it (417 Expectation Failed, a
// stored status) would otherwise have its refusal replayed for the whole
// window. A request the proxy streams (no key) keeps it, so that the
// upstream may still refuse its body before it is sent.
func TestExpectNotForwardedOnceBodyRead(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Expect") != "" {
			w.WriteHeader(http.StatusExpectationFailed)
			return
		}
		b, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "body="+string(b))
	}))
	t.Cleanup(up.Close)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory")
	for _, tc := range []struct {
		key    string
		status int
	}{{"exp-417", http.StatusCreated}, {"", http.StatusExpectationFailed}} {
		c := dialRaw(t, p.proxy)
		head := "POST /orders HTTP/1.1\r\nHost: proxy\r\nExpect: 100-continue\r\nContent-Length: 5\r\n"
		if tc.key != "" {
			head += "Idempotency-Key: \"" + tc.key + "\"\r\n"
		}
		c.write(head + "\r\n")
		var resp *http.Response
		var body string
		for {
			resp, body = c.response(http.MethodPost)
			if resp.StatusCode != http.StatusContinue {
				break
			}
			c.write("hello")
		}
		if resp.StatusCode != tc.status {
			t.Errorf("key %q: %d %q; want %d", tc.key, resp.StatusCode, body, tc.status)
		}
	}
}
