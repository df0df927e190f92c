package pgstore

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/testenv"
)

// setWatchTimes shortens WatchDeletes's ping interval and retry pause for
// the test.
func setWatchTimes(t *testing.T, ping, retry time.Duration) {
	oldPing, oldRetry := watchPing, watchRetry
	watchPing, watchRetry = ping, retry
	t.Cleanup(func() { watchPing, watchRetry = oldPing, oldRetry })
}

// watcherPool is a pool whose connections carry an application_name of
// their own, so that the test can find (and terminate) the backends of the
// store that uses it. It makes no connection until one is needed.
func watcherPool(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	app := testenv.Unique("pgstore_watch_")
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, app
}

// backends returns the pids of the server's backends named app.
func backends(t *testing.T, direct *pgxpool.Pool, app string) []int32 {
	t.Helper()
	rows, err := direct.Query(context.Background(), "SELECT pid FROM pg_stat_activity WHERE application_name = $1", app)
	if err != nil {
		t.Fatal(err)
	}
	var pids []int32
	for rows.Next() {
		var pid int32
		if err := rows.Scan(&pid); err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return pids
}

// wantBackends waits (bounded) until app has n backends.
func wantBackends(t *testing.T, direct *pgxpool.Pool, app string, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := backends(t, direct, app)
		if len(got) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d backends of the watcher's pool, want %d", len(got), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// watchedStore is a Store on table in schema, through a pool of its own
// named app, that only the watcher uses.
func watchedStore(t *testing.T, schema, table string) (*Store, string) {
	t.Helper()
	pool, app := watcherPool(t)
	s, err := New(pool, &Options{Schema: schema, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	return s, app
}

// watchedTable is a table, migrated in a fresh schema, and a watch of its
// deletions.
type watchedTable struct {
	direct  *pgxpool.Pool    // the test's pool
	schema  string           // the fresh schema
	s       *Store           // on the table, through direct
	watched *Store           // on the table, through a pool of its own named app
	app     string           // the application_name of watched's connections
	w       *testenv.Watcher // running watched.WatchDeletes, past its first reset
}

// watchTable makes table in a fresh schema and watches its deletions.
func watchTable(t *testing.T, table string) watchedTable {
	t.Helper()
	direct := testPool(t, 4, nil)
	schema := freshSchema(t, direct)
	s := migratedStore(t, direct, schema, Options{Table: table})
	watched, app := watchedStore(t, schema, table)
	w := testenv.Watch(t, watched.WatchDeletes)
	return watchedTable{direct: direct, schema: schema, s: s, watched: watched, app: app, w: w}
}

// mustFinish stores a finished record for key.
func mustFinish(t *testing.T, s *Store, key string) {
	t.Helper()
	ctx := context.Background()
	now := time.Now()
	rec, ok, err := s.Begin(ctx, key, "fp", now, lease, retention)
	if err != nil || !ok {
		t.Fatalf("Begin %.40q = %v, %v", key, ok, err)
	}
	if err := s.Complete(ctx, key, rec.Token, idempotency.Response{Status: 200}, now, retention); err != nil {
		t.Fatal(err)
	}
}

func mustDelete(t *testing.T, s *Store, key string) {
	t.Helper()
	if err := s.Delete(context.Background(), key); err != nil {
		t.Fatalf("Delete %.40q: %v", key, err)
	}
}

// TestWatchDeletes: deletions through any Store of the same table are
// forgotten, its own included, byte for byte; other tables' deletions and
// the deletion of an absent key are not announced.
func TestWatchDeletes(t *testing.T) {
	wt := watchTable(t, "watched")
	other, watched, w := wt.s, wt.watched, wt.w // other: another process, in effect
	elsewhere := migratedStore(t, wt.direct, wt.schema, Options{Table: "elsewhere"})

	const binary = "\x00\xff\xfe bytes"
	for _, k := range []string{"a", "b", binary, "c", ""} {
		mustFinish(t, other, k)
	}
	mustFinish(t, elsewhere, "not-mine")

	mustDelete(t, other, "a")
	w.WantForgot(t, "a")
	mustDelete(t, watched, "b") // its own deletions too
	w.WantForgot(t, "b")
	mustDelete(t, other, binary)
	w.WantForgot(t, binary)
	mustDelete(t, other, "")
	w.WantForgot(t, "")
	mustDelete(t, elsewhere, "not-mine")
	mustDelete(t, other, "absent") // no row: nothing to forget
	mustDelete(t, other, "c")
	w.WantForgot(t, "c") // not "not-mine", nor "absent"
	if _, err := other.Get(context.Background(), "c", time.Now()); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("Get after Delete = %v, want ErrNotFound", err)
	}
}

// TestWatchDeletesTransactional: Delete's statement announces the key
// when its transaction commits, not before, and not at all if it rolls
// back. No API runs Delete in a caller's transaction; its statement is
// run in one here.
func TestWatchDeletesTransactional(t *testing.T) {
	wt := watchTable(t, "tx")
	direct, s, w := wt.direct, wt.s, wt.w
	ctx := context.Background()
	for _, k := range []string{"rolled-back", "committed", "meanwhile", "after"} {
		mustFinish(t, s, k)
	}

	tx, err := direct.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, s.deleteSQL, []byte("rolled-back")); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "rolled-back", time.Now()); err != nil {
		t.Fatalf("Get after a rolled-back delete = %v", err)
	}

	tx, err = direct.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, s.deleteSQL, []byte("committed")); err != nil {
		t.Fatal(err)
	}
	mustDelete(t, s, "meanwhile")
	w.WantForgot(t, "meanwhile") // not "rolled-back", and not "committed" yet
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	w.WantForgot(t, "committed")
	mustDelete(t, s, "after")
	w.WantForgot(t, "after")
}

// TestWatchDeletesReconnects: a listening backend that is terminated is
// reported and replaced, with a reset (deletions in between are lost), and
// deletions reach the watcher again; the watcher holds one connection, and
// none once it has returned.
func TestWatchDeletesReconnects(t *testing.T) {
	setWatchTimes(t, 15*time.Second, 50*time.Millisecond)
	wt := watchTable(t, "reconnect")
	direct, s, app, w := wt.direct, wt.s, wt.app, wt.w
	ctx := context.Background()

	for i := range 2 {
		pids := backends(t, direct, app)
		if len(pids) != 1 {
			t.Fatalf("%d backends of the watcher, want 1 (the listening one)", len(pids))
		}
		var ok bool
		if err := direct.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pids[0]).Scan(&ok); err != nil || !ok {
			t.Fatalf("pg_terminate_backend = %v, %v", ok, err)
		}
		if err := w.WantReport(t); !errors.Is(err, idempotency.ErrUnavailable) {
			t.Errorf("reported %v, want ErrUnavailable", err)
		}
		w.WantReset(t)
		key := "after-" + string(rune('0'+i))
		mustFinish(t, s, key)
		mustDelete(t, s, key)
		w.WantForgot(t, key)
		wantBackends(t, direct, app, 1)
	}
	w.WantReturn(t, time.Second)
	wantBackends(t, direct, app, 0)
}

// TestWatchDeletesEndsWithContext: WatchDeletes returns ctx's error at
// once when ctx ends, and closes its connection.
func TestWatchDeletesEndsWithContext(t *testing.T) {
	wt := watchTable(t, "ends")
	wantBackends(t, wt.direct, wt.app, 1)
	wt.w.WantReturn(t, time.Second)
	wantBackends(t, wt.direct, wt.app, 0)
}

// TestWatchDeletesLongKeys: a key too long for a notification payload
// (under 8000 bytes, as hex) is deleted all the same, and makes the watcher
// reset; the longest that fits is forgotten by name.
func TestWatchDeletesLongKeys(t *testing.T) {
	wt := watchTable(t, "long")
	s, w := wt.s, wt.w

	// Repetitive keys: the primary key's index compresses them, so they
	// are stored although longer than an index entry may be.
	fits := strings.Repeat("k", maxAnnouncedKey)
	for _, key := range []string{strings.Repeat("k", maxAnnouncedKey+1), strings.Repeat("k", 20000)} {
		mustFinish(t, s, key)
		mustDelete(t, s, key)
		w.WantReset(t)
		if _, err := s.Get(context.Background(), key, time.Now()); !errors.Is(err, idempotency.ErrNotFound) {
			t.Fatalf("Get after Delete of a %d-byte key = %v, want ErrNotFound", len(key), err)
		}
	}
	mustFinish(t, s, fits)
	mustDelete(t, s, fits)
	w.WantForgot(t, fits)
}

// TestWatchDeletesLongNames: with the longest schema and table names, the
// channel is still distinct per table and fits an identifier.
func TestWatchDeletesLongNames(t *testing.T) {
	direct := testPool(t, 4, nil)
	schema := freshSchema(t, direct)
	schema63 := schema + strings.Repeat("x", maxIdentLen-len(schema))
	if _, err := direct.Exec(context.Background(), "CREATE SCHEMA "+schema63); err != nil {
		t.Fatal(err)
	}
	execOnCleanup(t, direct, "DROP SCHEMA "+schema63+" CASCADE")
	table := strings.Repeat("t", maxTableLen-1)
	mine := migratedStore(t, direct, schema63, Options{Table: table + "a"})
	theirs := migratedStore(t, direct, schema63, Options{Table: table + "b"})
	if mine.channel == theirs.channel {
		t.Fatalf("tables %s and %s share channel %q", mine.table, theirs.table, mine.channel)
	}
	watched, _ := watchedStore(t, schema63, table+"a")
	w := testenv.Watch(t, watched.WatchDeletes)
	mustFinish(t, theirs, "theirs")
	mustFinish(t, mine, "mine")
	mustDelete(t, theirs, "theirs")
	mustDelete(t, mine, "mine")
	w.WantForgot(t, "mine")
}

func TestDeletesChannel(t *testing.T) {
	long63 := strings.Repeat("s", 63)
	long40 := strings.Repeat("t", 40)
	for _, tc := range []struct{ schema, table, want string }{
		{"public", "idempotency_keys", "public.idempotency_keys.deleted"},
		{strings.Repeat("s", 22), strings.Repeat("t", 32), strings.Repeat("s", 22) + "." + strings.Repeat("t", 32) + ".deleted"},
	} {
		if got := deletesChannel(tc.schema, tc.table); got != tc.want {
			t.Errorf("deletesChannel(%q, %q) = %q, want %q", tc.schema, tc.table, got, tc.want)
		}
	}
	seen := map[string]string{}
	for _, pair := range [][2]string{
		{long63, long40}, {long63, long40[1:] + "u"}, {long63[1:] + "u", long40}, {long63[:40], long40},
		{strings.Repeat("s", 23), strings.Repeat("t", 32)}, {strings.Repeat("s", 22), strings.Repeat("t", 33)},
	} {
		ch := deletesChannel(pair[0], pair[1])
		if len(ch) > maxIdentLen {
			t.Errorf("deletesChannel(%q, %q) = %q, %d bytes, over %d", pair[0], pair[1], ch, len(ch), maxIdentLen)
		}
		if prev, ok := seen[ch]; ok {
			t.Errorf("deletesChannel(%q, %q) = %q, as for %s", pair[0], pair[1], ch, prev)
		}
		seen[ch] = pair[0] + "." + pair[1]
	}
}

// TestWatchDeletesQuietConnection: a listening connection that is pinged
// and answers stays: no report, and no reset, which would empty a cache.
func TestWatchDeletesQuietConnection(t *testing.T) {
	setWatchTimes(t, 20*time.Millisecond, 10*time.Millisecond)
	wt := watchTable(t, "quiet")
	s, w := wt.s, wt.w
	mustFinish(t, s, "k")
	time.Sleep(20 * watchPing)
	w.WantNoReport(t) // the connection did not fail
	w.WantQuiet(t)    // nor was it made again
	mustDelete(t, s, "k")
	w.WantForgot(t, "k")
}

// TestWatchDeletesBlackHoled: a server whose answers stop coming (the
// connection stays open, as when a host or a network path dies without a
// reset) is noticed by the ping and reported as a timeout; once it answers
// again the watcher listens again, with a reset. Cancelled while the
// server is silent, WatchDeletes returns at once.
func TestWatchDeletesBlackHoled(t *testing.T) {
	setWatchTimes(t, 100*time.Millisecond, 50*time.Millisecond)
	direct := testPool(t, 4, nil)
	schema := freshSchema(t, direct)
	s := migratedStore(t, direct, schema, Options{Table: "hole"})
	proxy, proxied := proxiedPool(t, direct, 2)
	t.Cleanup(proxy.Stop)
	watched, err := New(proxied, &Options{Schema: schema, Table: "hole", OpTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	w := testenv.Watch(t, watched.WatchDeletes)
	const hole = `{"name":"hole","type":"timeout","stream":"downstream","attributes":{"timeout":0}}`

	testenv.AddToxic(t, proxy, hole)
	err = w.WantReport(t)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, idempotency.ErrUnavailable) {
		t.Errorf("reported %v, want ErrUnavailable and a timeout", err)
	}
	testenv.RemoveToxic(proxy, "hole")
	w.WantReset(t)
	mustFinish(t, s, "after")
	mustDelete(t, s, "after")
	w.WantForgot(t, "after")

	testenv.AddToxic(t, proxy, hole)
	w.WantReport(t)
	w.WantReturn(t, time.Second)
}
