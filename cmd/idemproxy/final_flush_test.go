package main

import (
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// deadlineConn counts the writes made on a connection with no write
// deadline in force.
type deadlineConn struct {
	net.Conn
	mu        sync.Mutex
	deadline  time.Time // the write deadline in force
	unbounded int       // writes made with none
}

func (c *deadlineConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return c.Conn.SetWriteDeadline(t)
}

func (c *deadlineConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if c.deadline.IsZero() {
		c.unbounded++
	}
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *deadlineConn) unboundedWrites() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.unbounded
}

type deadlineListener struct {
	net.Listener
	conns chan *deadlineConn
}

func (l deadlineListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	dc := &deadlineConn{Conn: c}
	select {
	case l.conns <- dc:
	default:
	}
	return dc, nil
}

// TestFinalFlushBounded: the server writes the last bytes of a response
// (up to its 4 KiB buffer) after the handler returns. The response's write
// budget must still bound that flush, or a client that stops reading just
// then holds the connection and its goroutine for good: the deadline is
// not lifted when the handler returns, but when the connection's next
// request reaches the handler, so that request (its 100 Continue too) is
// not cut by a deadline long past.
func TestFinalFlushBounded(t *testing.T) {
	conns := make(chan *deadlineConn, 1)
	testHookListener = func(ln net.Listener) net.Listener { return deadlineListener{ln, conns} }
	t.Cleanup(func() { testHookListener = nil })
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory", "-upstream-timeout", "300ms")
	testHookListener = nil

	c := dialRaw(t, p.proxy)
	var dc *deadlineConn
	select {
	case dc = <-conns:
	case <-time.After(10 * time.Second):
		t.Fatal("the proxy accepted no connection")
	}
	c.write(rawPost("HTTP/1.1", "/orders", "flush-1", "a"))
	if resp, body := c.response(http.MethodPost); resp.StatusCode != http.StatusCreated {
		t.Fatalf("first request = %d %q; want 201", resp.StatusCode, body)
	}
	// The response (small: the server writes it whole from its buffer
	// after the handler returned) went out under the response's budget.
	if n := dc.unboundedWrites(); n != 0 {
		t.Fatalf("%d writes of the response were made with no write deadline; want every one bounded by the response's budget", n)
	}

	// The next request on the connection comes after that deadline has
	// passed (300ms + 1s), and asks for 100 Continue.
	time.Sleep(1500 * time.Millisecond)
	c.write("POST /orders HTTP/1.1\r\nHost: proxy\r\nIdempotency-Key: \"flush-2\"\r\nContent-Length: 1\r\nExpect: 100-continue\r\n\r\n")
	if resp, _ := c.response(http.MethodPost); resp.StatusCode != http.StatusContinue {
		t.Fatalf("second request = %d; want 100 Continue", resp.StatusCode)
	}
	c.write("b")
	if resp, body := c.response(http.MethodPost); resp.StatusCode != http.StatusCreated {
		t.Fatalf("second request = %d %q; want 201", resp.StatusCode, body)
	}
	if n := up.ran("flush-2"); n != 1 {
		t.Fatalf("the second request ran %d times upstream; want 1", n)
	}
}
