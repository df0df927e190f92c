package pgstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/testenv"
)

// oddResponse is a response that only a byte-exact store keeps: header
// names and values with NUL, invalid UTF-8 and an empty value, and a body
// of size bytes of random data, seeded.
func oddResponse(seed uint64, size int) idempotency.Response {
	body := make([]byte, size)
	r := rand.New(rand.NewPCG(seed, seed))
	for i := range body {
		body[i] = byte(r.UintN(256))
	}
	return idempotency.Response{
		Status: 201,
		Header: map[string][]string{
			"X-Nul\x00Name": {"a\x00b", ""},
			"X-Bad-\xff":    {"\xfe\xff\xc3\x28", "ok"},
			"Content-Type":  {"application/octet-stream"},
		},
		Body: body,
	}
}

// responseDiff is cmp.Diff(want, got) for responses, with bodies compared
// as bytes: cmp walks a multi-MB slice element by element.
func responseDiff(want, got idempotency.Response) string {
	if !bytes.Equal(want.Body, got.Body) {
		return fmt.Sprintf("body of %d bytes differs from the %d stored", len(got.Body), len(want.Body))
	}
	if (want.Body == nil) != (got.Body == nil) {
		return fmt.Sprintf("body nil %v, want nil %v", got.Body == nil, want.Body == nil)
	}
	want.Body, got.Body = nil, nil
	return cmp.Diff(want, got)
}

// mustUnavailable fails t unless err wraps ErrUnavailable.
func mustUnavailable(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, idempotency.ErrUnavailable) {
		t.Errorf("%s = %v, want ErrUnavailable", what, err)
	}
}

// within runs f and fails t if it has not returned after limit: a guard
// against hangs, not a timing goal. It returns f's error.
func within(t *testing.T, limit time.Duration, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		t.Fatalf("%s still blocked after %v", what, limit)
		return nil
	}
}

// TestServerCrashAndRestart kills a private server (every process at once,
// SIGKILL) with a result stored and a claim held, and starts it again:
// while it is down each operation fails with ErrUnavailable and fn does not
// run; afterwards the stored result is replayed byte for byte, the claim
// is still in flight (fn does not run again) and its holder can complete
// it, and the deletion feed has reported the outage, reset and announces
// deletions again.
func TestServerCrashAndRestart(t *testing.T) {
	setWatchTimes(t, 15*time.Second, 50*time.Millisecond)
	srv := startPrivatePG(t)
	pool := srv.Pool(4, nil)
	s := migratedStore(t, pool, "crash", Options{Table: "keys", OpTimeout: 2 * time.Second})
	ctx := context.Background()
	clk := newClock()
	g := faultGuard(t, s, clk)
	w := testenv.Watch(t, s.WatchDeletes)
	w.Wait = 20 * time.Second

	want := oddResponse(1, 3<<20)
	var runs atomic.Int32
	run := func(resp idempotency.Response) func(context.Context) (idempotency.Response, error) {
		return func(context.Context) (idempotency.Response, error) {
			runs.Add(1)
			return resp, nil
		}
	}
	if _, out, err := g.Do(ctx, "done\x00\xff", "fp", run(want)); out != idempotency.Executed || err != nil {
		t.Fatalf("Do before the crash = %v, %v", out, err)
	}
	held, ok, err := s.Begin(ctx, "held", "fp", clk.Now(), lease, retention)
	if err != nil || !ok {
		t.Fatalf("Begin before the crash = %v, %v", ok, err)
	}

	srv.Kill()
	mustUnavailable(t, "the deletion feed's report", w.WantReport(t))
	_, out, err := g.Do(ctx, "new", "fp", run(idempotency.Response{Status: 500}))
	if out != idempotency.Unavailable {
		t.Errorf("Do while the server is down: outcome %v, want Unavailable", out)
	}
	mustUnavailable(t, "Do while the server is down", err)
	_, err = s.Get(ctx, "done\x00\xff", clk.Now())
	mustUnavailable(t, "Get while the server is down", err)
	mustUnavailable(t, "Complete while the server is down", s.Complete(ctx, "held", held.Token, idempotency.Response{}, clk.Now(), retention))
	mustUnavailable(t, "Extend while the server is down", s.Extend(ctx, "held", held.Token, clk.Now(), lease))
	mustUnavailable(t, "Release while the server is down", s.Release(ctx, "held", held.Token))
	mustUnavailable(t, "Delete while the server is down", s.Delete(ctx, "done\x00\xff"))
	_, err = s.Sweep(ctx, clk.Now(), 0)
	mustUnavailable(t, "Sweep while the server is down", err)
	mustUnavailable(t, "CheckSchema while the server is down", s.CheckSchema(ctx))
	mustUnavailable(t, "Migrate while the server is down", s.Migrate(ctx))
	if n := runs.Load(); n != 1 {
		t.Fatalf("fn ran %d times, want 1 (not while the server was down)", n)
	}

	srv.Start()
	w.WantReset(t)
	got, out, err := g.Do(ctx, "done\x00\xff", "fp", run(idempotency.Response{Status: 500}))
	if out != idempotency.Replayed || err != nil {
		t.Fatalf("Do after the restart = %v, %v; want the stored result replayed", out, err)
	}
	if diff := responseDiff(want, got); diff != "" {
		t.Fatalf("replayed response after the restart (-stored +replayed):\n%s", diff)
	}
	if _, out, err := g.Do(ctx, "held", "fp", run(idempotency.Response{Status: 500})); out != idempotency.InFlight {
		t.Fatalf("Do on the claim held across the restart = %v, %v; want InFlight", out, err)
	}
	if err := s.Complete(ctx, "held", held.Token, want, clk.Now(), retention); err != nil {
		t.Fatalf("Complete of the claim held across the restart: %v", err)
	}
	if _, out, err := g.Do(ctx, "new", "fp", run(idempotency.Response{Status: 202})); out != idempotency.Executed || err != nil {
		t.Fatalf("Do of a new key after the restart = %v, %v", out, err)
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("fn ran %d times, want 2", n)
	}
	mustDelete(t, s, "done\x00\xff")
	w.WantForgot(t, "done\x00\xff")
}

// TestServerPausedFailsWithinOpTimeout freezes a private server (SIGSTOP
// to every process: connections stay open, new ones are accepted by the
// kernel, nothing answers). Every operation, with a ctx that has no
// deadline, fails with ErrUnavailable once OpTimeout has passed instead of
// waiting for the server; CheckSchema included. fn does not run. The
// deletion feed reports. After SIGCONT everything works again, and what
// the frozen server did with the statements it had received is one of
// the answers the errors allowed.
func TestServerPausedFailsWithinOpTimeout(t *testing.T) {
	const opTimeout = 500 * time.Millisecond
	const limit = 15 * time.Second // hang guard, not a timing goal
	setWatchTimes(t, 300*time.Millisecond, 50*time.Millisecond)
	srv := startPrivatePG(t)
	pool := srv.Pool(4, nil)
	s := migratedStore(t, pool, "pause", Options{Table: "keys", OpTimeout: opTimeout})
	ctx := context.Background() // no deadline, like most request contexts
	clk := newClock()
	g := faultGuard(t, s, clk)
	w := testenv.Watch(t, s.WatchDeletes)
	w.Wait = limit

	want := oddResponse(2, 1<<20)
	var runs atomic.Int32
	if _, out, err := g.Do(ctx, "done", "fp", func(context.Context) (idempotency.Response, error) {
		runs.Add(1)
		return want, nil
	}); out != idempotency.Executed || err != nil {
		t.Fatalf("Do before the pause = %v, %v", out, err)
	}
	held, ok, err := s.Begin(ctx, "held", "fp", clk.Now(), lease, retention)
	if err != nil || !ok {
		t.Fatalf("Begin before the pause = %v, %v", ok, err)
	}

	// Complete through the Guard, which stores a result with a ctx that
	// never ends: the server freezes while fn runs.
	err = within(t, limit, "Do whose Complete meets a frozen server", func() error {
		_, out, err := g.Do(ctx, "frozen-complete", "fp", func(context.Context) (idempotency.Response, error) {
			runs.Add(1)
			srv.Pause()
			return idempotency.Response{Status: 200, Body: []byte("frozen")}, nil
		})
		if out != idempotency.Executed {
			return fmt.Errorf("outcome %v (%w)", out, err)
		}
		return err
	})
	mustUnavailable(t, "Complete on a frozen server (through Do)", err)
	for _, op := range []struct {
		name string
		f    func() error
	}{
		{"Do", func() error {
			_, out, err := g.Do(ctx, "new", "fp", func(context.Context) (idempotency.Response, error) {
				runs.Add(1)
				return idempotency.Response{}, nil
			})
			if out != idempotency.Unavailable {
				return fmt.Errorf("outcome %v (%w)", out, err)
			}
			return err
		}},
		{"Get", func() error { _, err := s.Get(ctx, "done", clk.Now()); return err }},
		{"Complete", func() error { return s.Complete(ctx, "held", held.Token, want, clk.Now(), retention) }},
		{"Extend", func() error { return s.Extend(ctx, "held", held.Token, clk.Now(), lease) }},
		{"Release", func() error { return s.Release(ctx, "held", held.Token) }},
		{"Delete", func() error { return s.Delete(ctx, "absent") }},
		{"Sweep", func() error { _, err := s.Sweep(ctx, clk.Now(), 0); return err }},
		{"CheckSchema", func() error { return s.CheckSchema(ctx) }},
		{"SchemaVersion", func() error { _, _, err := s.SchemaVersion(ctx); return err }},
	} {
		err := within(t, limit, op.name+" on a frozen server", op.f)
		mustUnavailable(t, op.name+" on a frozen server", err)
	}
	// Migrate is bounded by its ctx.
	mctx, cancel := context.WithTimeout(ctx, opTimeout)
	err = within(t, limit, "Migrate with a deadline on a frozen server", func() error { return s.Migrate(mctx) })
	cancel()
	mustUnavailable(t, "Migrate with a deadline on a frozen server", err)
	mustUnavailable(t, "the deletion feed's report", w.WantReport(t))
	if n := runs.Load(); n != 2 {
		t.Fatalf("fn ran %d times, want 2 (not on the frozen server)", n)
	}

	srv.Resume()
	w.WantReset(t)
	got, out, err := g.Do(ctx, "done", "fp", func(context.Context) (idempotency.Response, error) {
		runs.Add(1)
		return idempotency.Response{}, nil
	})
	if out != idempotency.Replayed || err != nil {
		t.Fatalf("Do after the resume = %v, %v; want a replay", out, err)
	}
	if diff := responseDiff(want, got); diff != "" {
		t.Fatalf("replayed response after the resume (-stored +replayed):\n%s", diff)
	}
	// The frozen server may have run, after the resume, statements whose
	// callers had given up: each key is in one of the states its errors
	// allowed, never another.
	rec, err := s.Get(ctx, "frozen-complete", clk.Now())
	if err != nil || rec.State == idempotency.Done && !bytes.Equal(rec.Response.Body, []byte("frozen")) {
		t.Fatalf("frozen-complete after the resume = %+v, %v; want in flight or its own result", rec, err)
	}
	if rec, err := s.Get(ctx, "held", clk.Now()); err == nil && rec.Token != held.Token {
		t.Fatalf("held after the resume = %+v; want its claim, its result or nothing", rec)
	} else if err != nil && !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("Get held after the resume: %v", err)
	}
	if _, err := s.Get(ctx, "new", clk.Now()); err != nil && !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("Get new after the resume: %v", err)
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("fn ran %d times, want 2", n)
	}
	mustDelete(t, s, "done")
	w.WantForgot(t, "done")
}

// TestMigrateDeadlineOnFrozenServer: Migrate's ctx ends between two of
// its statements, and the server freezes at that moment. Migrate must
// return (with ErrUnavailable) instead of waiting for ever for the answer
// to its ROLLBACK.
func TestMigrateDeadlineOnFrozenServer(t *testing.T) {
	const limit = 15 * time.Second // hang guard, not a timing goal
	srv := startPrivatePG(t)
	var (
		armed  atomic.Bool
		cancel context.CancelFunc
	)
	tracer := &hookTracer{end: func(sql string) {
		// After the first advisory lock: the next statement is not sent.
		if strings.Contains(sql, "pg_advisory_xact_lock") && armed.CompareAndSwap(true, false) {
			srv.Pause()
			cancel()
		}
	}}
	pool := srv.Pool(4, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = tracer })
	s, err := New(pool, &Options{Schema: "frozen", Table: "keys", OpTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var ctx context.Context
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	armed.Store(true)
	err = within(t, limit, "Migrate whose ctx ended as the server froze", func() error { return s.Migrate(ctx) })
	mustUnavailable(t, "Migrate whose ctx ended as the server froze", err)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Migrate = %v, want it to wrap context.Canceled", err)
	}
	srv.Resume()
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate after the resume: %v", err)
	}
}

// hookTracer calls end with each statement's SQL once it has been
// answered.
type hookTracer struct{ end func(sql string) }

type traceSQLKey struct{}

func (h *hookTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, traceSQLKey{}, d.SQL)
}

func (h *hookTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	sql, _ := ctx.Value(traceSQLKey{}).(string)
	h.end(sql)
}

// TestServerStatementTimeout: a statement the server cancels (here by the
// pool's statement_timeout, while Complete waits on a row lock) fails with
// ErrUnavailable and the server's error, is not run again, and applied
// nothing: the claim is still in flight and its holder completes it once
// the lock is gone.
func TestServerStatementTimeout(t *testing.T) {
	direct := testPool(t, 2, nil)
	schema := freshSchema(t, direct)
	migratedStore(t, direct, schema, Options{Table: "stmt_timeout"})
	cfg := direct.Config()
	cfg.MaxConns = 2
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = "200"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := New(pool, &Options{Schema: schema, Table: "stmt_timeout"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	now := time.Now()
	rec, ok, err := s.Begin(ctx, "k", "fp", now, lease, retention)
	if err != nil || !ok {
		t.Fatalf("Begin = %v, %v", ok, err)
	}
	blocker, err := direct.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(ctx)
	if _, err := blocker.Exec(ctx, s.names.Replace("SELECT FROM {{table}} WHERE key = $1 FOR UPDATE"), []byte("k")); err != nil {
		t.Fatal(err)
	}
	err = within(t, 10*time.Second, "Complete on a locked row", func() error {
		return s.Complete(ctx, "k", rec.Token, idempotency.Response{Status: 200}, now, retention)
	})
	var pgErr *pgconn.PgError
	if !errors.Is(err, idempotency.ErrUnavailable) || !errors.As(err, &pgErr) || pgErr.Code != "57014" {
		t.Fatalf("Complete cancelled by statement_timeout = %v; want ErrUnavailable wrapping SQLSTATE 57014", err)
	}
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, "k", now); err != nil || got.State != idempotency.Processing || got.Token != rec.Token {
		t.Fatalf("after the cancelled Complete: %+v, %v; want the claim in flight", got, err)
	}
	if err := s.Complete(ctx, "k", rec.Token, idempotency.Response{Status: 200}, now, retention); err != nil {
		t.Fatalf("Complete once the lock is gone: %v", err)
	}
}
