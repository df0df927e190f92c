package pgstore

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/archlab/idempotency/internal/testenv"
)

// TestWatchDeletesNetworkCut: the network between the watcher and the
// server is cut (every connection through it closed, new ones refused)
// and comes back. The watcher reports the cut, and once it listens again
// calls reset, before any later deletion is forgotten: a key deleted during
// the cut, announced to nobody, is then dropped from the cache.
func TestWatchDeletesNetworkCut(t *testing.T) {
	setWatchTimes(t, 15*time.Second, 50*time.Millisecond)
	direct := testPool(t, 4, nil)
	schema := freshSchema(t, direct)
	s := migratedStore(t, direct, schema, Options{Table: "cut"})
	proxy, proxied := proxiedPool(t, direct, 2)
	watched, err := New(proxied, &Options{Schema: schema, Table: "cut", OpTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	w := testenv.Watch(t, watched.WatchDeletes)
	mustFinish(t, s, "during")
	mustFinish(t, s, "after")

	proxy.Stop()
	mustUnavailable(t, "the report of the cut", w.WantReport(t))
	mustDelete(t, s, "during")
	if err := proxy.Start(); err != nil {
		t.Fatalf("restoring the network: %v", err)
	}
	w.WantReset(t)
	mustDelete(t, s, "after")
	w.WantForgot(t, "after")
}

// TestWatchDeletesAfterRestartSkipsDeadConnections: the server restarts
// while the pool the watcher takes its connections from holds several,
// dead from then on (the pool does not ping them, as in a busy pool). The
// watcher reports the loss of its own connection, then listens again, with
// a reset, on a sound one: it used to send LISTEN on each dead connection in
// turn, reporting each failure and waiting a second after each, all that
// time without the feed.
func TestWatchDeletesAfterRestartSkipsDeadConnections(t *testing.T) {
	setWatchTimes(t, 15*time.Second, 200*time.Millisecond)
	srv := startPrivatePG(t)
	const conns = 4
	pool := srv.Pool(conns, func(cfg *pgxpool.Config) {
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	})
	s := migratedStore(t, pool, "watch_restart", Options{Table: "keys"})
	var (
		mu      sync.Mutex
		reports []error
	)
	w := testenv.Watch(t, func(ctx context.Context, forget func(string), reset func(), report func(error)) error {
		return s.WatchDeletes(ctx, forget, reset, func(err error) {
			mu.Lock()
			reports = append(reports, err)
			mu.Unlock()
			report(err)
		})
	})
	w.Wait = 20 * time.Second
	ctx := context.Background()
	held := make([]*pgxpool.Conn, 0, conns)
	for range conns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	for _, c := range held {
		c.Release()
	}

	srv.Kill()
	srv.Start()
	mustUnavailable(t, "the report of the lost connection", w.WantReport(t))
	w.WantReset(t)
	// Reports after the first: the server was still down (a failure to
	// connect, allowed), or LISTEN went to a dead connection (not).
	mu.Lock()
	for _, err := range reports[1:] {
		if connLost(err) {
			t.Errorf("reported %v: LISTEN was sent on a connection that died with the old server", err)
		}
	}
	mu.Unlock()
	mustFinish(t, s, "k")
	mustDelete(t, s, "k")
	w.WantForgot(t, "k")
}
