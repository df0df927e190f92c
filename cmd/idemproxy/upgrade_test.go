package main

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestUpgradeOutlastsUpstreamTimeout: a connection upgraded through the
// proxy (WebSocket, or any Upgrade) lasts as long as its two ends keep
// it: -upstream-timeout bounds the handshake, not the conversation that
// follows. An upstream that never answers the handshake still gets its
// 504 at -upstream-timeout.
func TestUpgradeOutlastsUpstreamTimeout(t *testing.T) {
	up := newRawUpstream(t, func(_ int64, req *http.Request, _ []byte, conn net.Conn) {
		if req.URL.Path == "/silent" {
			time.Sleep(3 * time.Second) // never answers within the timeout
			return
		}
		_, _ = conn.Write([]byte("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n"))
		br := bufio.NewReader(conn)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			if _, err := conn.Write([]byte("echo " + line)); err != nil {
				return
			}
		}
	})
	const timeout = 400 * time.Millisecond
	p := startInproc(t, "-upstream", up.URL, "-store", "memory", "-upstream-timeout", timeout.String())

	t.Run("conversation", func(t *testing.T) {
		c := dialRaw(t, p.proxy)
		c.write("GET /ws HTTP/1.1\r\nHost: proxy\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		resp, err := http.ReadResponse(c.br, &http.Request{Method: http.MethodGet})
		if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("handshake = %v %v; want 101", resp, err)
		}
		for i, wait := range []time.Duration{0, 3 * timeout} {
			time.Sleep(wait)
			msg := strings.Repeat("x", i+1) + "\n"
			c.write(msg)
			got, err := c.br.ReadString('\n')
			if err != nil || got != "echo "+msg {
				t.Fatalf("after %v: read %q, %v; want %q (the upgraded connection was cut)", wait, got, err, "echo "+msg)
			}
		}
	})

	t.Run("handshake bounded", func(t *testing.T) {
		c := dialRaw(t, p.proxy)
		start := time.Now()
		c.write("GET /silent HTTP/1.1\r\nHost: proxy\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		resp, _ := c.response(http.MethodGet)
		if resp.StatusCode != http.StatusGatewayTimeout {
			t.Fatalf("handshake with a silent upstream = %d; want 504", resp.StatusCode)
		}
		if d := time.Since(start); d > 2500*time.Millisecond {
			t.Fatalf("the 504 came after %v; want it at -upstream-timeout (%v), not when the upstream gave up", d, timeout)
		}
	})
}
