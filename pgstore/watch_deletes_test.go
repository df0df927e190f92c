package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/testenv"
)

// watcher runs WatchDeletes on s until the test ends, reporting each
// forgotten key, each reset and each failure on channels.
type watcher struct {
	forgot  chan string
	resets  chan struct{}
	reports chan error
	done    chan error
	cancel  context.CancelFunc
}

func watch(t *testing.T, s *Store) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{forgot: make(chan string, 100), resets: make(chan struct{}, 100), reports: make(chan error, 1000),
		done: make(chan error, 1), cancel: cancel}
	go func() {
		w.done <- s.WatchDeletes(ctx, func(k string) { w.forgot <- k }, func() { w.resets <- struct{}{} },
			func(err error) { w.reports <- err })
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-w.done:
		case <-time.After(5 * time.Second):
			t.Error("WatchDeletes did not return within 5s of its context's end")
		}
	})
	w.wantReset(t)
	return w
}

func (w *watcher) wantReset(t *testing.T) {
	t.Helper()
	select {
	case <-w.resets:
	case k := <-w.forgot:
		t.Fatalf("forgot %.20q, want a reset", k)
	case <-time.After(5 * time.Second):
		t.Fatal("no reset within 5s")
	}
}

// wantForgot waits for the next key forgotten: deletions are announced in
// commit order, so one that should not have been announced shows up here
// in place of key.
func (w *watcher) wantForgot(t *testing.T, key string) {
	t.Helper()
	select {
	case k := <-w.forgot:
		if k != key {
			t.Fatalf("forgot %.40q, want %.40q", k, key)
		}
	case <-w.resets:
		t.Fatalf("reset, want %.40q forgotten", key)
	case <-time.After(5 * time.Second):
		t.Fatalf("%.40q was not forgotten within 5s of its deletion", key)
	}
}

func (w *watcher) wantReport(t *testing.T) error {
	t.Helper()
	select {
	case err := <-w.reports:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("no failure reported within 5s")
	}
	return nil
}

// wantReturn cancels the watch and waits for WatchDeletes to return
// context.Canceled promptly.
func (w *watcher) wantReturn(t *testing.T) {
	t.Helper()
	start := time.Now()
	w.cancel()
	select {
	case err := <-w.done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("WatchDeletes = %v, want context.Canceled", err)
		}
		w.done <- err // for the cleanup
	case <-time.After(3 * time.Second):
		t.Fatal("WatchDeletes did not return within 3s of its context's end")
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("WatchDeletes returned %v after its context's end", took)
	}
}

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
	b := make([]byte, 6)
	rand.Read(b)
	app := "pgstore_watch_" + hex.EncodeToString(b)
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
func watchedStore(t *testing.T, schema, table string, opts Options) (*Store, string) {
	t.Helper()
	pool, app := watcherPool(t)
	opts.Schema, opts.Table = schema, table
	s, err := New(pool, &opts)
	if err != nil {
		t.Fatal(err)
	}
	return s, app
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
	direct := testPool(t, 4, nil)
	schema := freshSchema(t, direct)
	other := migratedStore(t, direct, schema, Options{Table: "watched"}) // another process, in effect
	elsewhere := migratedStore(t, direct, schema, Options{Table: "elsewhere"})
	watched, _ := watchedStore(t, schema, "watched", Options{})
	w := watch(t, watched)

	const binary = "\x00\xff\xfe bytes"
	for _, k := range []string{"a", "b", binary, "c", ""} {
		mustFinish(t, other, k)
	}
	mustFinish(t, elsewhere, "not-mine")

	mustDelete(t, other, "a")
	w.wantForgot(t, "a")
	mustDelete(t, watched, "b") // its own deletions too
	w.wantForgot(t, "b")
	mustDelete(t, other, binary)
	w.wantForgot(t, binary)
	mustDelete(t, other, "")
	w.wantForgot(t, "")
	mustDelete(t, elsewhere, "not-mine")
	mustDelete(t, other, "absent") // no row: nothing to forget
	mustDelete(t, other, "c")
	w.wantForgot(t, "c") // not "not-mine", nor "absent"
	if _, err := other.Get(context.Background(), "c", time.Now()); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("Get after Delete = %v, want ErrNotFound", err)
	}
}

// TestWatchDeletesTransactional: Delete's statement announces the key
// when its transaction commits, not before, and not at all if it rolls
// back. No API runs Delete in a caller's transaction; its statement is
// run in one here.
func TestWatchDeletesTransactional(t *testing.T) {
	direct := testPool(t, 4, nil)
	schema := freshSchema(t, direct)
	s := migratedStore(t, direct, schema, Options{Table: "tx"})
	watched, _ := watchedStore(t, schema, "tx", Options{})
	w := watch(t, watched)
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
	w.wantForgot(t, "meanwhile") // not "rolled-back", and not "committed" yet
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	w.wantForgot(t, "committed")
	mustDelete(t, s, "after")
	w.wantForgot(t, "after")
}

// TestWatchDeletesReconnects: a listening backend that is terminated is
// reported and replaced, with a reset (deletions in between are lost), and
// deletions reach the watcher again; the watcher holds one connection, and
// none once it has returned.
func TestWatchDeletesReconnects(t *testing.T) {
	setWatchTimes(t, 15*time.Second, 50*time.Millisecond)
	direct := testPool(t, 4, nil)
	schema := freshSchema(t, direct)
	s := migratedStore(t, direct, schema, Options{Table: "reconnect"})
	watched, app := watchedStore(t, schema, "reconnect", Options{})
	w := watch(t, watched)
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
		if err := w.wantReport(t); !errors.Is(err, idempotency.ErrUnavailable) {
			t.Errorf("reported %v, want ErrUnavailable", err)
		}
		w.wantReset(t)
		key := "after-" + string(rune('0'+i))
		mustFinish(t, s, key)
		mustDelete(t, s, key)
		w.wantForgot(t, key)
		wantBackends(t, direct, app, 1)
	}
	w.wantReturn(t)
	wantBackends(t, direct, app, 0)
}

// TestWatchDeletesEndsWithContext: WatchDeletes returns ctx's error at
// once when ctx ends, and closes its connection.
func TestWatchDeletesEndsWithContext(t *testing.T) {
	direct := testPool(t, 4, nil)
	schema := freshSchema(t, direct)
	migratedStore(t, direct, schema, Options{Table: "ends"})
	watched, app := watchedStore(t, schema, "ends", Options{})
	w := watch(t, watched)
	wantBackends(t, direct, app, 1)
	w.wantReturn(t)
	wantBackends(t, direct, app, 0)
}

// TestWatchDeletesLongKeys: a key too long for a notification payload
// (under 8000 bytes, as hex) is deleted all the same, and makes the watcher
// reset; the longest that fits is forgotten by name.
func TestWatchDeletesLongKeys(t *testing.T) {
	direct := testPool(t, 4, nil)
	schema := freshSchema(t, direct)
	s := migratedStore(t, direct, schema, Options{Table: "long"})
	watched, _ := watchedStore(t, schema, "long", Options{})
	w := watch(t, watched)

	// Repetitive keys: the primary key's index compresses them, so they
	// are stored although longer than an index entry may be.
	fits := strings.Repeat("k", maxAnnouncedKey)
	for _, key := range []string{strings.Repeat("k", maxAnnouncedKey+1), strings.Repeat("k", 20000)} {
		mustFinish(t, s, key)
		mustDelete(t, s, key)
		w.wantReset(t)
		if _, err := s.Get(context.Background(), key, time.Now()); !errors.Is(err, idempotency.ErrNotFound) {
			t.Fatalf("Get after Delete of a %d-byte key = %v, want ErrNotFound", len(key), err)
		}
	}
	mustFinish(t, s, fits)
	mustDelete(t, s, fits)
	w.wantForgot(t, fits)
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
	watched, _ := watchedStore(t, schema63, table+"a", Options{})
	w := watch(t, watched)
	mustFinish(t, theirs, "theirs")
	mustFinish(t, mine, "mine")
	mustDelete(t, theirs, "theirs")
	mustDelete(t, mine, "mine")
	w.wantForgot(t, "mine")
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
	direct := testPool(t, 4, nil)
	schema := freshSchema(t, direct)
	s := migratedStore(t, direct, schema, Options{Table: "quiet"})
	watched, _ := watchedStore(t, schema, "quiet", Options{})
	w := watch(t, watched)
	mustFinish(t, s, "k")
	time.Sleep(20 * watchPing)
	select {
	case err := <-w.reports:
		t.Fatalf("a quiet connection failed: %v", err)
	case <-w.resets:
		t.Fatal("a quiet connection was made again")
	default:
	}
	mustDelete(t, s, "k")
	w.wantForgot(t, "k")
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
	w := watch(t, watched)
	const hole = `{"name":"hole","type":"timeout","stream":"downstream","attributes":{"timeout":0}}`

	testenv.AddToxic(t, proxy, hole)
	err = w.wantReport(t)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, idempotency.ErrUnavailable) {
		t.Errorf("reported %v, want ErrUnavailable and a timeout", err)
	}
	testenv.RemoveToxic(proxy, "hole")
	w.wantReset(t)
	mustFinish(t, s, "after")
	mustDelete(t, s, "after")
	w.wantForgot(t, "after")

	testenv.AddToxic(t, proxy, hole)
	w.wantReport(t)
	w.wantReturn(t)
}
