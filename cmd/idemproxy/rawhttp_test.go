package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// rawUpstream is an upstream that writes its answers byte for byte, for
// the responses net/http would refuse to send (a body on a 204, fewer bytes
// than the Content-Length). It serves one request per connection: serve
// gets the request, its body read whole, and the connection, which is
// closed when serve returns. Answers should say Connection: close, so that
// the proxy's Transport does not try to reuse the connection.
type rawUpstream struct {
	URL   string
	calls atomic.Int64
}

func newRawUpstream(t *testing.T, serve func(call int64, req *http.Request, body []byte, conn net.Conn)) *rawUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &rawUpstream{URL: "http://" + ln.Addr().String()}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
				req, err := http.ReadRequest(bufio.NewReader(conn))
				if err != nil {
					return
				}
				body, err := io.ReadAll(req.Body)
				if err != nil {
					return
				}
				serve(u.calls.Add(1), req, body, conn)
			}()
		}
	}()
	return u
}

// rawClient is a connection to the proxy on which a test writes requests
// byte for byte and reads what comes back, 1xx responses included.
type rawClient struct {
	t    *testing.T
	conn net.Conn
	br   *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawClient {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	return &rawClient{t: t, conn: conn, br: bufio.NewReader(conn)}
}

func (c *rawClient) write(s string) {
	c.t.Helper()
	if _, err := io.WriteString(c.conn, s); err != nil {
		c.t.Fatalf("writing to the proxy: %v", err)
	}
}

// response reads one response (a 1xx one too) and its body.
func (c *rawClient) response(method string) (*http.Response, string) {
	c.t.Helper()
	resp, err := http.ReadResponse(c.br, &http.Request{Method: method})
	if err != nil {
		c.t.Fatalf("reading a response: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("reading a %d response's body: %v", resp.StatusCode, err)
	}
	return resp, string(b)
}

// rawPost is a POST request's bytes, with the key (if any), the body and
// the extra header lines given.
func rawPost(proto, path, key, body string, extra ...string) string {
	var b strings.Builder
	b.WriteString("POST " + path + " " + proto + "\r\nHost: proxy\r\n")
	if key != "" {
		b.WriteString("Idempotency-Key: \"" + key + "\"\r\n")
	}
	for _, l := range extra {
		b.WriteString(l + "\r\n")
	}
	b.WriteString("Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	return b.String()
}

// keyState is the state the admin API reports for key ("" when it has no
// record).
func keyState(t *testing.T, admin, key string) string {
	t.Helper()
	r := get(t, "http://"+admin+"/keys/"+key)
	switch {
	case r.status == http.StatusNotFound:
		return ""
	case strings.Contains(r.body, `"PROCESSING"`):
		return "PROCESSING"
	case strings.Contains(r.body, `"DONE"`):
		return "DONE"
	}
	t.Fatalf("GET /keys/%s = %d %q", key, r.status, r.body)
	return ""
}
