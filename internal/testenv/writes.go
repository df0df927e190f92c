package testenv

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"
)

// WriteCountingTransport returns an http.Transport whose connections count
// the writes made on them into writes: a test tells from it how many
// system calls (and, on loopback, packets) a request took to send.
func WriteCountingTransport(writes *atomic.Int64) *http.Transport {
	var d net.Dialer
	return &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return writeCountingConn{c, writes}, nil
	}}
}

type writeCountingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c writeCountingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}
