package pgstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/archlab/idempotency"
)

// TestCallsAfterServerRestart restarts a private server under a pool that
// holds four connections, then makes calls one after the other: each meets
// a connection that died with the old server (the statement is written
// into a dead socket and the answer is its end), and must succeed anyway,
// on a sound connection. Such a failure used to fail the call with
// ErrUnavailable, once per pooled connection, although the server was back.
//
// The pool does not ping a connection before handing it out: in a busy
// pool no connection idles for the second after which pgxpool would.
func TestCallsAfterServerRestart(t *testing.T) {
	srv := startPrivatePG(t)
	const conns = 4
	pool := srv.Pool(conns, func(cfg *pgxpool.Config) {
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	})
	s := migratedStore(t, pool, "restart", Options{Table: "keys"})
	ctx := context.Background()
	clk := newClock()
	g := faultGuard(t, s, clk)

	// restart fills the pool with conns connections, then kills the
	// server and starts it again.
	restart := func(t *testing.T) {
		t.Helper()
		held := make([]*pgxpool.Conn, 0, conns)
		for range conns {
			c, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatalf("acquiring: %v", err)
			}
			held = append(held, c)
		}
		for _, c := range held {
			c.Release()
		}
		srv.Kill()
		srv.Start()
	}
	claim := func(t *testing.T, key string) uint64 {
		t.Helper()
		rec, ok, err := s.Begin(ctx, key, "fp", clk.Now(), lease, retention)
		if err != nil || !ok {
			t.Fatalf("Begin %q = %+v, %v, %v; want a claim", key, rec, ok, err)
		}
		return rec.Token
	}
	const calls = 2 * conns
	ops := []struct {
		name string
		// prepare runs before the restart and returns the argument of call i.
		prepare func(t *testing.T, key string) uint64
		call    func(key string, token uint64) error
	}{
		{"Do", nil, func(key string, _ uint64) error {
			_, out, err := g.Do(ctx, key, "fp", func(context.Context) (idempotency.Response, error) {
				return idempotency.Response{Status: 200}, nil
			})
			if err == nil && out != idempotency.Executed {
				err = fmt.Errorf("outcome %v, want Executed", out)
			}
			return err
		}},
		{"Begin", nil, func(key string, _ uint64) error {
			_, ok, err := s.Begin(ctx, key, "fp", clk.Now(), lease, retention)
			if err == nil && !ok {
				err = errors.New("not claimed")
			}
			return err
		}},
		{"Complete", claim, func(key string, token uint64) error {
			return s.Complete(ctx, key, token, idempotency.Response{Status: 200}, clk.Now(), retention)
		}},
		{"Extend", claim, func(key string, token uint64) error {
			return s.Extend(ctx, key, token, clk.Now(), lease)
		}},
		{"Release", claim, func(key string, token uint64) error {
			return s.Release(ctx, key, token)
		}},
		{"Get", claim, func(key string, _ uint64) error {
			_, err := s.Get(ctx, key, clk.Now())
			return err
		}},
		{"Sweep", nil, func(string, uint64) error {
			_, err := s.Sweep(ctx, clk.Now(), 0)
			return err
		}},
	}
	for _, op := range ops {
		t.Run(op.name, func(t *testing.T) {
			tokens := make([]uint64, calls)
			key := func(i int) string { return fmt.Sprintf("%s-%d", op.name, i) }
			if op.prepare != nil {
				for i := range tokens {
					tokens[i] = op.prepare(t, key(i))
				}
			}
			restart(t)
			before := s.retries.Load()
			for i := range calls {
				if err := op.call(key(i), tokens[i]); err != nil {
					t.Errorf("%s %d after the restart: %v", op.name, i, err)
				}
			}
			if s.retries.Load() == before {
				t.Fatalf("no statement was run again: the calls met no dead connection, and the test proves nothing")
			}
		})
	}
}

// TestWriteAppliedAnswerLost: the connection breaks after the server has
// run and committed a statement, before its answer reaches the store (a
// crash, a network cut). Each operation that is run again must have the
// effect it would have had once, and say so: Complete and Release see
// their own earlier write and succeed (they used to fail with
// ErrUnavailable, and run again blindly would say ErrLeaseLost), Extend
// sets the same lease again, Begin meets its own claim and answers in
// flight instead of claiming twice, and Delete, which run again could
// delete a claim made in between, is not run again: it fails with
// ErrUnavailable, having deleted the key. The writes of a holder whose
// claim was taken over still fail with ErrLeaseLost.
func TestWriteAppliedAnswerLost(t *testing.T) {
	var lose atomic.Bool
	direct := testPool(t, 2, nil)
	schema := freshSchema(t, direct)
	cfg := direct.Config()
	cfg.MaxConns = 2
	// One message, one answer: no separate round trip to prepare, which
	// would take the loss instead.
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &answerLoser{Conn: c, lose: &lose}, nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := migratedStore(t, pool, schema, Options{Table: "keys"})
	ctx := context.Background()
	now := time.Now()
	claim := func(key string) uint64 {
		t.Helper()
		rec, ok, err := s.Begin(ctx, key, "fp", now, lease, retention)
		if err != nil || !ok {
			t.Fatalf("Begin %q = %+v, %v, %v; want a claim", key, rec, ok, err)
		}
		return rec.Token
	}
	// lost runs f with the answer to its first statement lost.
	lost := func(f func() error) error {
		lose.Store(true)
		err := f()
		if lose.Load() {
			t.Fatal("no statement was sent")
		}
		return err
	}
	resp := idempotency.Response{Status: 201, Body: []byte("stored")}

	token := claim("complete")
	if err := lost(func() error { return s.Complete(ctx, "complete", token, resp, now, retention) }); err != nil {
		t.Errorf("Complete whose answer was lost = %v, want nil", err)
	}
	if rec, err := s.Get(ctx, "complete", now); err != nil || rec.State != idempotency.Done || string(rec.Response.Body) != "stored" {
		t.Errorf("after Complete: %+v, %v; want its result", rec, err)
	}

	token = claim("release")
	if err := lost(func() error { return s.Release(ctx, "release", token) }); err != nil {
		t.Errorf("Release whose answer was lost = %v, want nil", err)
	}
	if _, ok, err := s.Begin(ctx, "release", "fp2", now, lease, retention); err != nil || !ok {
		t.Errorf("Begin after Release = %v, %v; want a claim", ok, err)
	}

	token = claim("extend")
	later := now.Add(time.Minute)
	if err := lost(func() error { return s.Extend(ctx, "extend", token, later, lease) }); err != nil {
		t.Errorf("Extend whose answer was lost = %v, want nil", err)
	}
	if rec, err := s.Get(ctx, "extend", now); err != nil || !rec.LeaseUntil.Equal(later.Add(lease)) {
		t.Errorf("after Extend: %+v, %v; want the lease until %v", rec, err, later.Add(lease))
	}

	var (
		rec     idempotency.Record
		claimed bool
	)
	err = lost(func() error {
		var err error
		rec, claimed, err = s.Begin(ctx, "begin", "fp", now, lease, retention)
		return err
	})
	if err != nil || claimed || rec.State != idempotency.Processing || rec.Token == 0 {
		t.Errorf("Begin whose answer was lost = %+v, %v, %v; want its own claim, in flight", rec, claimed, err)
	}

	// A stale holder's writes, answers lost, changed nothing, and say so.
	stale := claim("taken-over")
	if rec, ok, err := s.Begin(ctx, "taken-over", "fp", now.Add(2*lease), lease, retention); err != nil || !ok || rec.Token <= stale {
		t.Fatalf("takeover = %+v, %v, %v; want a claim", rec, ok, err)
	}
	if err := lost(func() error { return s.Complete(ctx, "taken-over", stale, resp, now, retention) }); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Errorf("stale Complete whose answer was lost = %v, want ErrLeaseLost", err)
	}
	if err := lost(func() error { return s.Release(ctx, "taken-over", stale) }); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Errorf("stale Release whose answer was lost = %v, want ErrLeaseLost", err)
	}
	if rec, err := s.Get(ctx, "taken-over", now); err != nil || rec.State != idempotency.Processing || rec.Token == stale {
		t.Errorf("after the stale writes: %+v, %v; want the new claim in flight", rec, err)
	}

	token = claim("delete")
	retries := s.retries.Load()
	err = lost(func() error { return s.Delete(ctx, "delete") })
	mustUnavailable(t, "Delete whose answer was lost", err)
	if n := s.retries.Load() - retries; n != 0 {
		t.Errorf("Delete whose answer was lost was run again (%d)", n)
	}
	if _, err := s.Get(ctx, "delete", now); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Get after Delete = %v, want ErrNotFound", err)
	}
	if err := s.Complete(ctx, "delete", token, resp, now, retention); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Errorf("Complete of the deleted claim = %v, want ErrLeaseLost", err)
	}
}

// answerLoser is a connection to the server that, when lose is set, lets
// the next answer arrive in full (up to ReadyForQuery, sent once the
// statement's transaction has committed), throws it away, and closes.
type answerLoser struct {
	net.Conn
	lose *atomic.Bool
	mu   sync.Mutex
}

func (c *answerLoser) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.lose.CompareAndSwap(true, false) {
		return c.Conn.Read(p)
	}
	// Backend messages: a type byte, then a length that counts itself.
	var buf []byte
	chunk := make([]byte, 4096)
	for {
		for len(buf) >= 5 {
			n := int(binary.BigEndian.Uint32(buf[1:5])) + 1
			if len(buf) < n {
				break
			}
			if buf[0] == 'Z' {
				c.Conn.Close()
				return 0, io.ErrUnexpectedEOF
			}
			buf = buf[n:]
		}
		n, err := c.Conn.Read(chunk)
		if err != nil {
			return 0, err
		}
		buf = append(buf, chunk[:n]...)
	}
}
