package pgstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/testenv"
)

// faultGuard is a Guard on s with a test clock and no renewal, so that the
// lease ends only when the test says.
func faultGuard(t *testing.T, s *Store, clk *clock) *idempotency.Guard {
	t.Helper()
	g, err := idempotency.NewGuard(s, &idempotency.Options{Lease: lease, Retention: retention, Now: clk.Now, RenewEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestConnectionKilledMidComplete terminates the backend that runs
// Complete's UPDATE while it waits on a row lock (the server rolls the
// statement back and ends the session with a FATAL notice): Complete runs
// again on another connection and, once the lock is gone, stores the
// result. fn ran once, Do succeeds, and the result is replayed. The
// terminated statement used to fail the Guard's Complete with
// ErrUnavailable, leaving the key in flight for the rest of its lease.
func TestConnectionKilledMidComplete(t *testing.T) {
	s, pool := newTestStore(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clk := newClock()
	g := faultGuard(t, s, clk)
	const key = "killed-mid-complete"

	blocker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(context.Background())

	killed := make(chan error, 1)
	var runs atomic.Int32
	fn := func(context.Context) (idempotency.Response, error) {
		runs.Add(1)
		// Hold the row so that Complete's UPDATE waits, then kill the
		// backend that waits, and let the row go once another waits.
		if _, err := blocker.Exec(ctx, s.names.Replace("SELECT 1 FROM {{table}} WHERE key = $1 FOR UPDATE"), []byte(key)); err != nil {
			t.Errorf("locking the row: %v", err)
		}
		go func() {
			killed <- func() error {
				pid, err := waitingComplete(ctx, pool, s, 0)
				if err != nil {
					return err
				}
				var ok bool
				if err := pool.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil || !ok {
					return errors.Join(errors.New("pg_terminate_backend failed"), err)
				}
				if _, err := waitingComplete(ctx, pool, s, pid); err != nil {
					return fmt.Errorf("after the kill: %w", err)
				}
				return blocker.Rollback(ctx)
			}()
		}()
		return idempotency.Response{Status: 200, Body: []byte("charged")}, nil
	}
	_, out, err := g.Do(ctx, key, "fp", fn)
	if kerr := <-killed; kerr != nil {
		t.Fatalf("killing the backend: %v", kerr)
	}
	if out != idempotency.Executed || err != nil {
		t.Fatalf("Do with the connection killed in Complete = %v, %v; want Executed", out, err)
	}
	again := func(context.Context) (idempotency.Response, error) {
		runs.Add(1)
		return idempotency.Response{Status: 200, Body: []byte("charged again")}, nil
	}
	if resp, out, err := g.Do(ctx, key, "fp", again); out != idempotency.Replayed || err != nil || string(resp.Body) != "charged" {
		t.Fatalf("Do after the kill = %q, %v, %v; want the result replayed", resp.Body, out, err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("fn ran %d times, want 1", n)
	}
}

// waitingComplete returns the pid of a backend, other than except, that
// waits on a lock in Complete's UPDATE of s's table, polling for at most 10
// seconds.
func waitingComplete(ctx context.Context, pool *pgxpool.Pool, s *Store, except int32) (int32, error) {
	table := s.names.Replace("{{table}}")
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var pid int32
		err := pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity
			WHERE pid <> pg_backend_pid() AND pid <> $2 AND wait_event_type = 'Lock'
			AND position($1 IN query) > 0 AND position('''DONE''' IN query) > 0`, table, except).Scan(&pid)
		if err == nil {
			return pid, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return 0, errors.New("no backend waited in Complete within 10s")
}

// TestCompleteAppliedButAckLost cuts the server's answer to Complete (a
// toxiproxy timeout toxic between pool and server): the UPDATE commits but
// the Guard sees ErrUnavailable. A retry replays; fn never runs twice.
func TestCompleteAppliedButAckLost(t *testing.T) {
	direct := testPool(t, 4, nil)
	schema := freshSchema(t, direct)

	proxy, proxied := proxiedPool(t, direct, 1) // Begin and Complete share the one proxied connection
	s := migratedStore(t, direct, schema, Options{Table: "acklost"})
	ps, err := New(proxied, &Options{Schema: schema, Table: "acklost"})
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clk := newClock()
	const key = "ack-lost"
	var runs atomic.Int32
	fn := func(context.Context) (idempotency.Response, error) {
		runs.Add(1)
		// Begin has answered; from now on the server's answers are dropped
		// and the connection is closed after 300ms.
		if _, err := proxy.Toxics.AddToxicJson(strings.NewReader(
			`{"name":"drop","type":"timeout","stream":"downstream","attributes":{"timeout":300}}`)); err != nil {
			t.Errorf("adding toxic: %v", err)
		}
		return idempotency.Response{Status: 200, Body: []byte("charged")}, nil
	}
	// pgx prepares a statement on its first use, in a round trip of its
	// own; warm the one connection up so that Complete's UPDATE is sent in
	// full before the answer is lost.
	pg := faultGuard(t, ps, clk)
	if _, out, err := pg.Do(ctx, "warm-up", "fp", func(context.Context) (idempotency.Response, error) {
		return idempotency.Response{Status: 200}, nil
	}); out != idempotency.Executed || err != nil {
		t.Fatalf("warm-up Do = %v, %v", out, err)
	}
	_, out, err := pg.Do(ctx, key, "fp", fn)
	if out != idempotency.Executed || !errors.Is(err, idempotency.ErrUnavailable) {
		t.Fatalf("Do with the answer to Complete lost = %v, %v; want Executed and ErrUnavailable", out, err)
	}
	// The write was applied although it failed: a retry (here through a
	// direct pool) replays it, inside the lease and after it.
	g := faultGuard(t, s, clk)
	for _, advance := range []time.Duration{0, 2 * lease} {
		clk.Advance(advance)
		resp, out, err := g.Do(ctx, key, "fp", fn)
		if out != idempotency.Replayed || err != nil || string(resp.Body) != "charged" {
			t.Fatalf("retry %v later = %q, %v, %v; want the stored result replayed", advance, resp.Body, out, err)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("fn ran %d times, want 1", n)
	}
}

// TestBlackHoledServerFailsClosed drops every answer of the server (a
// toxiproxy timeout toxic that never closes the connection) and checks that
// each operation gives up within OpTimeout with ErrUnavailable, even when
// its ctx has no deadline: a request ctx usually has none, and the Guard
// stores a result with a ctx that is never cancelled.
func TestBlackHoledServerFailsClosed(t *testing.T) {
	const opTimeout = 300 * time.Millisecond
	const limit = 10 * time.Second // hang guard, not a timing goal
	direct := testPool(t, 4, nil)
	schema := freshSchema(t, direct)
	migratedStore(t, direct, schema, Options{Table: "blackhole"})

	proxy, proxied := proxiedPool(t, direct, 2)
	// Stopping the proxy closes its connections, so that a call still
	// stuck in the black hole (the test failed) lets the pool close.
	t.Cleanup(proxy.Stop)
	s, err := New(proxied, &Options{Schema: schema, Table: "blackhole", OpTimeout: opTimeout})
	if err != nil {
		t.Fatal(err)
	}
	blackHole := func() {
		t.Helper()
		if _, err := proxy.Toxics.AddToxicJson(strings.NewReader(
			`{"name":"hole","type":"timeout","stream":"downstream","attributes":{"timeout":0}}`)); err != nil {
			t.Fatalf("adding toxic: %v", err)
		}
	}
	heal := func() {
		t.Helper()
		if err := proxy.Toxics.RemoveToxic(context.Background(), "hole"); err != nil {
			t.Fatal(err)
		}
	}
	bounded := func(what string, f func() error) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- f() }()
		select {
		case err := <-done:
			if !errors.Is(err, idempotency.ErrUnavailable) {
				t.Fatalf("%s on a black-holed server: %v, want ErrUnavailable", what, err)
			}
		case <-time.After(limit):
			t.Fatalf("%s on a black-holed server still blocked after %v (OpTimeout %v)", what, limit, opTimeout)
		}
	}
	g := faultGuard(t, s, newClock())
	ctx := context.Background() // no deadline, like most request contexts

	// Complete: the claim was made, the answers stop while fn runs, and
	// the Guard stores the result with a ctx that never ends.
	bounded("Complete (through Guard.Do)", func() error {
		_, out, err := g.Do(ctx, "complete", "fp", func(context.Context) (idempotency.Response, error) {
			blackHole()
			return idempotency.Response{Status: 200}, nil
		})
		if out != idempotency.Executed {
			return fmt.Errorf("outcome %v (%w)", out, err)
		}
		return err
	})
	// Begin: the Guard fails closed, fn does not run.
	bounded("Begin (through Guard.Do)", func() error {
		_, out, err := g.Do(ctx, "begin", "fp", func(context.Context) (idempotency.Response, error) {
			return idempotency.Response{}, errors.New("fn ran on a black-holed store")
		})
		if out != idempotency.Unavailable {
			return fmt.Errorf("outcome %v (%w)", out, err)
		}
		return err
	})
	bounded("Get", func() error { _, err := s.Get(ctx, "begin", time.Now()); return err })
	bounded("Delete", func() error { return s.Delete(ctx, "begin") })
	heal()
}

// proxiedPool returns a toxiproxy in front of direct's server and a pool of
// at most maxConns connections through it, closed when t ends.
func proxiedPool(t *testing.T, direct *pgxpool.Pool, maxConns int32) (*toxiproxy.Proxy, *pgxpool.Pool) {
	t.Helper()
	cfg := direct.Config()
	proxy := testenv.Toxiproxy(t, "pg", net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	host, port, err := net.SplitHostPort(proxy.Listen)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	cfg.MaxConns = maxConns
	proxied, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxied.Close)
	return proxy, proxied
}
