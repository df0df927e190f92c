package redisstore

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/archlab/idempotency"
)

// ackLoser makes the connections of a client lose one reply: once armed,
// the next reply to a script is read from the server (so the script ran)
// and thrown away, and the connection is closed, as when a network fault
// cuts the way back. The client sees EOF, which go-redis retries.
type ackLoser struct {
	mu    sync.Mutex
	armed bool
	fired int
	hdels int // HDEL commands written
}

func (l *ackLoser) arm() { l.mu.Lock(); l.armed = true; l.mu.Unlock() }

func (l *ackLoser) firedCount() int { l.mu.Lock(); defer l.mu.Unlock(); return l.fired }

func (l *ackLoser) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &lossyConn{Conn: c, l: l}, nil
}

type lossyConn struct {
	net.Conn
	l      *ackLoser
	script bool // the last request written runs a script
}

func (c *lossyConn) Write(p []byte) (int, error) {
	lp := bytes.ToLower(p)
	hdel := bytes.Contains(lp, []byte("hdel"))
	c.script = bytes.Contains(lp, []byte("eval")) || hdel
	if hdel {
		c.l.mu.Lock()
		c.l.hdels++
		c.l.mu.Unlock()
	}
	return c.Conn.Write(p)
}

func (c *lossyConn) Read(p []byte) (int, error) {
	if !c.script {
		return c.Conn.Read(p)
	}
	c.l.mu.Lock()
	lose := c.l.armed
	c.l.armed = false
	if lose {
		c.l.fired++
	}
	c.l.mu.Unlock()
	if !lose {
		return c.Conn.Read(p)
	}
	if _, err := c.Conn.Read(make([]byte, 64<<10)); err != nil {
		return 0, err
	}
	_ = c.Conn.Close()
	return 0, io.EOF
}

// TestLostReplyNotResent checks that a script whose reply was lost after it
// ran is not sent again by go-redis (MaxRetries) and answered by its second
// run: a re-sent Begin would find its own claim and say "in flight", a
// re-sent Complete or Release would find its own work done and say
// ErrLeaseLost, which promises that nothing changed. The call must fail
// with ErrUnavailable ("may have been applied") instead.
func TestLostReplyNotResent(t *testing.T) {
	loser := &ackLoser{}
	shared := sharedClient(t).Options()
	c := newClient(t, &redis.Options{Addr: shared.Addr, Username: shared.Username, Password: shared.Password,
		DB: shared.DB, Dialer: loser.dial, MaxRetries: 3})
	s := newStore(t, c, Options{Clock: CallerClock, Logger: discard()})
	ctx := context.Background()
	// The lost reply must be the script's own, not a NOSCRIPT (after which
	// nothing ran): load them all first, as a server that has run them has.
	for _, sc := range []*script{beginScript, completeScript, extendScript, releaseScript, getScript} {
		if err := sc.Load(ctx, c).Err(); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	const lease, retention = time.Minute, time.Hour
	fired := 0
	lost := func(op string) {
		t.Helper()
		fired++
		if got := loser.firedCount(); got != fired {
			t.Fatalf("%s: %d replies lost, want %d: the test's fault did not happen", op, got, fired)
		}
	}

	rec, claimed, err := func() (idempotency.Record, bool, error) {
		loser.arm()
		return s.Begin(ctx, "k", "fp", now, lease, retention)
	}()
	lost("Begin")
	if !errors.Is(err, idempotency.ErrUnavailable) {
		t.Fatalf("Begin whose reply was lost = %+v, claimed %v, err %v; want ErrUnavailable", rec, claimed, err)
	}
	got, err := s.Get(ctx, "k", now)
	if err != nil || got.State != idempotency.Processing || got.Token == 0 {
		t.Fatalf("after the lost Begin, Get = %+v, %v; want the claim it made", got, err)
	}

	loser.arm()
	err = s.Complete(ctx, "k", got.Token, idempotency.Response{Status: 201, Body: []byte("done")}, now, retention)
	lost("Complete")
	if !errors.Is(err, idempotency.ErrUnavailable) {
		t.Fatalf("Complete whose reply was lost: %v; want ErrUnavailable (it was applied, so not ErrLeaseLost)", err)
	}
	if got, err := s.Get(ctx, "k", now); err != nil || got.State != idempotency.Done || string(got.Response.Body) != "done" {
		t.Fatalf("after the lost Complete, Get = %+v, %v; want the stored result", got, err)
	}

	rec, claimed, err = s.Begin(ctx, "r", "fp", now, lease, retention)
	if err != nil || !claimed {
		t.Fatalf("Begin = %+v, %v, %v", rec, claimed, err)
	}
	loser.arm()
	err = s.Release(ctx, "r", rec.Token)
	lost("Release")
	if !errors.Is(err, idempotency.ErrUnavailable) {
		t.Fatalf("Release whose reply was lost: %v; want ErrUnavailable (it was applied, so not ErrLeaseLost)", err)
	}
	if got, err := s.Get(ctx, "r", now); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("after the lost Release, Get = %+v, %v; want ErrNotFound", got, err)
	}

	// Delete too: sent again after a claim was made meanwhile, it would
	// remove that claim, and its holder's result would never be stored.
	if _, _, err := s.Begin(ctx, "d", "fp", now, lease, retention); err != nil {
		t.Fatal(err)
	}
	loser.mu.Lock()
	hdels := loser.hdels
	loser.mu.Unlock()
	loser.arm()
	err = s.Delete(ctx, "d")
	lost("Delete")
	loser.mu.Lock()
	sent := loser.hdels - hdels
	loser.mu.Unlock()
	if !errors.Is(err, idempotency.ErrUnavailable) || sent != 1 {
		t.Fatalf("Delete whose reply was lost: %v after %d sends; want ErrUnavailable after 1", err, sent)
	}
	if got, err := s.Get(ctx, "d", now); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("after the lost Delete, Get = %+v, %v; want ErrNotFound", got, err)
	}

	// Reads are still retried: a Get whose reply is lost is sent again.
	loser.arm()
	if got, err := s.Get(ctx, "k", now); err != nil || got.State != idempotency.Done {
		t.Fatalf("Get whose first reply was lost = %+v, %v; want the record (a read is re-sent)", got, err)
	}
	lost("Get")
}
