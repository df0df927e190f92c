package pgstore

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/archlab/idempotency"
)

const (
	lease     = 10 * time.Second
	retention = time.Hour
)

func TestNewValidatesOptions(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		ok   bool
	}{
		{"defaults", Options{}, true},
		{"named", Options{Schema: "billing", Table: "idem_keys", SweepBatch: 10}, true},
		{"server clock", Options{Clock: ServerClock}, true},
		{"upper case table", Options{Table: "Keys"}, false},
		{"quote in schema", Options{Schema: `a"b`}, false},
		{"leading digit", Options{Table: "1keys"}, false},
		{"long table", Options{Table: "t234567890123456789012345678901234567890x"}, false},
		{"unknown clock", Options{Clock: 7}, false},
		{"negative batch", Options{SweepBatch: -1}, false},
		{"negative op timeout", Options{OpTimeout: -time.Second}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(nil, &tt.opts)
			if err == nil || !errors.Is(err, idempotency.ErrInvalidConfig) {
				t.Fatalf("New(nil pool) = %v, want ErrInvalidConfig", err)
			}
			_, err = New(new(pgxpool.Pool), &tt.opts)
			if (err == nil) != tt.ok {
				t.Fatalf("New(%+v) error = %v, want ok=%v", tt.opts, err, tt.ok)
			}
			if err != nil && !errors.Is(err, idempotency.ErrInvalidConfig) {
				t.Fatalf("error %v does not wrap ErrInvalidConfig", err)
			}
		})
	}
}

// TestLifecycle walks one key through every transition of the contract,
// checking the exact times and that tokens only grow.
func TestLifecycle(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	ctx := context.Background()
	t0 := time.Now()
	const key, fp = "order-1", "fp-a"
	var last uint64
	claim := func(now time.Time) idempotency.Record {
		t.Helper()
		rec, ok, err := s.Begin(ctx, key, fp, now, lease, retention)
		if err != nil || !ok {
			t.Fatalf("Begin at %v = %+v, %v, %v; want a claim", now.Sub(t0), rec, ok, err)
		}
		if rec.State != idempotency.Processing || !rec.LeaseUntil.Equal(now.Add(lease)) || rec.Token <= last {
			t.Fatalf("claim = %+v, want Processing, lease until %v, token > %d", rec, now.Add(lease), last)
		}
		last = rec.Token
		return rec
	}

	first := claim(t0)
	if !first.ExpiresAt.Equal(t0.Add(retention)) {
		t.Fatalf("ExpiresAt = %v, want %v", first.ExpiresAt, t0.Add(retention))
	}
	// In flight: same token, nothing changed.
	rec, ok, err := s.Begin(ctx, key, fp, t0.Add(lease-time.Nanosecond), lease, retention)
	if err != nil || ok || rec.State != idempotency.Processing || rec.Token != first.Token {
		t.Fatalf("Begin in flight = %+v, %v, %v", rec, ok, err)
	}
	// Another fingerprint: conflict, in any state.
	rec, ok, err = s.Begin(ctx, key, "fp-b", t0, lease, retention)
	if err != nil || ok || rec.State != idempotency.Conflict || rec.Fingerprint != fp {
		t.Fatalf("Begin other fingerprint = %+v, %v, %v", rec, ok, err)
	}
	// Lease over: takeover with a larger token, ExpiresAt kept.
	t1 := t0.Add(lease)
	second := claim(t1)
	if !second.ExpiresAt.Equal(first.ExpiresAt) {
		t.Fatalf("takeover moved ExpiresAt to %v", second.ExpiresAt)
	}
	for name, err := range map[string]error{
		"complete": s.Complete(ctx, key, first.Token, idempotency.Response{Status: 500}, t1, retention),
		"extend":   s.Extend(ctx, key, first.Token, t1, lease),
		"release":  s.Release(ctx, key, first.Token),
	} {
		if !errors.Is(err, idempotency.ErrLeaseLost) {
			t.Errorf("%s with the taken-over token = %v, want ErrLeaseLost", name, err)
		}
	}
	// Extend past the window pushes ExpiresAt along.
	t2 := t0.Add(retention - time.Second)
	if err := s.Extend(ctx, key, second.Token, t2, lease); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	got, err := s.Get(ctx, key, t2)
	if err != nil || !got.LeaseUntil.Equal(t2.Add(lease)) || !got.ExpiresAt.Equal(t2.Add(lease)) {
		t.Fatalf("Get after Extend = %+v, %v; want lease and expiry %v", got, err, t2.Add(lease))
	}
	// Complete, then replay.
	resp := idempotency.Response{Status: 201, Header: map[string][]string{"Location": {"/orders/1"}, "X-Empty": {}}, Body: []byte(`{"id":1}`)}
	if err := s.Complete(ctx, key, second.Token, resp, t2, retention); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if err := s.Complete(ctx, key, second.Token, resp, t2, retention); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("second Complete = %v, want ErrLeaseLost (not Processing)", err)
	}
	rec, ok, err = s.Begin(ctx, key, fp, t2.Add(time.Minute), lease, retention)
	want := idempotency.Record{Fingerprint: fp, State: idempotency.Done, Response: resp, Token: second.Token, ExpiresAt: t2.Add(retention)}
	if err != nil || ok {
		t.Fatalf("Begin after Complete = %v, %v", ok, err)
	}
	if diff := cmp.Diff(want, rec); diff != "" {
		t.Fatalf("replayed record (-want +got):\n%s", diff)
	}
	// Window over: the key is absent, then claimed afresh.
	t3 := t2.Add(retention)
	if _, err := s.Get(ctx, key, t3); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("Get after the window = %v, want ErrNotFound", err)
	}
	third := claim(t3)
	if !third.ExpiresAt.Equal(t3.Add(retention)) {
		t.Fatalf("re-created ExpiresAt = %v", third.ExpiresAt)
	}
	// Release, then Delete: each following Begin claims with a larger token.
	if err := s.Release(ctx, key, third.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
	claim(t3)
	if err := s.Delete(ctx, key); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if err := s.Delete(ctx, key); err != nil {
		t.Fatalf("Delete of an absent key: %v", err)
	}
	claim(t3)
}

func TestResponseRoundTrip(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	ctx := context.Background()
	tests := []struct {
		name string
		resp idempotency.Response
	}{
		{"zero", idempotency.Response{}},
		{"empty body and header", idempotency.Response{Status: 204, Header: map[string][]string{}, Body: []byte{}}},
		{"nil header value", idempotency.Response{Status: 200, Header: map[string][]string{"A": nil, "B": {"1", "2"}}}},
		{"binary body", idempotency.Response{Status: 1 << 40, Body: []byte{0, 0xff, '\'', '"', 0}}},
		{"unicode and invalid utf-8", idempotency.Response{Status: -1, Header: map[string][]string{"Ünï": {"çødé\u0000x", "\xff\xfe"}, "": {""}}}},
	}
	now := time.Now()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec, ok, err := s.Begin(ctx, tt.name, "fp", now, lease, retention)
			if err != nil || !ok {
				t.Fatalf("Begin = %v, %v", ok, err)
			}
			if err := s.Complete(ctx, tt.name, rec.Token, tt.resp, now, retention); err != nil {
				t.Fatalf("Complete: %v", err)
			}
			got, err := s.Get(ctx, tt.name, now)
			if err != nil {
				t.Fatalf("Get: %v", err)
			}
			if diff := cmp.Diff(tt.resp, got.Response); diff != "" {
				t.Fatalf("response (-stored +read):\n%s", diff)
			}
		})
	}
}

// TestServerClock: the server's clock judges, whatever now says.
func TestServerClock(t *testing.T) {
	s, _ := newTestStore(t, Options{Clock: ServerClock})
	ctx := context.Background()
	past := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	before := time.Now()
	rec, ok, err := s.Begin(ctx, "k", "fp", past, lease, retention)
	if err != nil || !ok {
		t.Fatalf("Begin = %v, %v", ok, err)
	}
	// Server and test share a host here; allow for a slow statement.
	if d := rec.LeaseUntil.Sub(before.Add(lease)); d < -time.Second || d > 10*time.Second {
		t.Fatalf("LeaseUntil = %v, want about %v (server time, not the given now)", rec.LeaseUntil, before.Add(lease))
	}
	// A now far past the lease does not take over: the server says in flight.
	future := before.Add(100 * retention)
	got, ok, err := s.Begin(ctx, "k", "fp", future, lease, retention)
	if err != nil || ok || got.Token != rec.Token {
		t.Fatalf("Begin with a late now = %+v, %v, %v; want in flight", got, ok, err)
	}
	if _, err := s.Get(ctx, "k", future); err != nil {
		t.Fatalf("Get with a late now: %v", err)
	}
	if n, err := s.Sweep(ctx, future, 0); err != nil || n != 0 {
		t.Fatalf("Sweep with a late now = %d, %v; want nothing swept", n, err)
	}
	// A zero lease has ended by the server's clock at once.
	if err := s.Extend(ctx, "k", rec.Token, past, 0); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	got, ok, err = s.Begin(ctx, "k", "fp", past, lease, retention)
	if err != nil || !ok || got.Token <= rec.Token {
		t.Fatalf("Begin after the lease ended = %+v, %v, %v; want a takeover", got, ok, err)
	}
	if err := s.Complete(ctx, "k", got.Token, idempotency.Response{Status: 200}, past, time.Millisecond); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	time.Sleep(5 * time.Millisecond) // the server's clock has to pass the window
	if n, err := s.Sweep(ctx, past, 0); err != nil || n != 1 {
		t.Fatalf("Sweep after the window = %d, %v; want 1", n, err)
	}
}

// TestConcurrentBeginClaimsOnce races Begins on an absent key, on an
// abandoned claim and on an expired record: each time exactly one claims,
// and every other caller sees that claim (the retry after a stale snapshot).
func TestConcurrentBeginClaimsOnce(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	ctx := context.Background()
	t0 := time.Now()
	for round := range 3 {
		key := "race-" + string(rune('a'+round))
		var last uint64
		for _, at := range []time.Duration{0, lease, 2*lease + retention} {
			now := t0.Add(at)
			var (
				wg      sync.WaitGroup
				mu      sync.Mutex
				claims  int
				answers = map[uint64]int{}
			)
			for range 16 {
				wg.Go(func() {
					rec, ok, err := s.Begin(ctx, key, "fp", now, lease, retention)
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						t.Errorf("Begin: %v", err)
						return
					}
					if ok {
						claims++
					}
					if rec.State != idempotency.Processing || !rec.LeaseUntil.After(now) {
						t.Errorf("Begin at +%v answered %+v, a record that is not in flight", at, rec)
					}
					answers[rec.Token]++
				})
			}
			wg.Wait()
			if claims != 1 || len(answers) != 1 {
				t.Fatalf("round %d at +%v: %d claims, tokens seen %v; want one claim and one token", round, at, claims, answers)
			}
			for tok := range answers {
				if tok <= last {
					t.Fatalf("round %d at +%v: token %d not above %d", round, at, tok, last)
				}
				last = tok
			}
		}
	}
	t.Logf("%d Begins ran again after a stale snapshot", s.retries.Load())
}

// TestSerializableRetries runs racing Begins on a pool whose transactions
// are SERIALIZABLE, where a concurrent claim fails with SQLSTATE 40001:
// Begin retries it, and still exactly one caller claims.
func TestSerializableRetries(t *testing.T) {
	direct := testPool(t, 2, nil)
	schema := freshSchema(t, direct)
	cfg := direct.Config()
	cfg.MaxConns = 16
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "serializable"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	migratedStore(t, direct, schema, Options{Table: "serial"})
	s, err := New(pool, &Options{Schema: schema, Table: "serial"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	now := time.Now()
	for round := range 5 {
		key := "serial-" + string(rune('a'+round))
		var (
			wg     sync.WaitGroup
			claims atomic.Int32
		)
		for range 12 {
			wg.Go(func() {
				_, ok, err := s.Begin(ctx, key, "fp", now, lease, retention)
				if err != nil {
					t.Errorf("Begin: %v", err)
				}
				if ok {
					claims.Add(1)
				}
			})
		}
		wg.Wait()
		if n := claims.Load(); n != 1 {
			t.Fatalf("round %d: %d claims, want 1", round, n)
		}
	}
	t.Logf("%d statements retried", s.retries.Load())
}

func TestGuardRunsOnceUnderConcurrency(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	g, err := idempotency.NewGuard(s, &idempotency.Options{Lease: lease, Retention: retention})
	if err != nil {
		t.Fatal(err)
	}
	var runs sync.Map
	var wg sync.WaitGroup
	outcomes := make(chan idempotency.Outcome, 64)
	for i := range 64 {
		key := []string{"a", "b", "c", "d"}[i%4]
		wg.Go(func() {
			_, out, err := g.Do(context.Background(), key, "fp", func(context.Context) (idempotency.Response, error) {
				n, _ := runs.LoadOrStore(key, new(int64))
				*n.(*int64)++ // guarded by the claim: a race detector report means a double run
				return idempotency.Response{Status: 200, Body: []byte(key)}, nil
			})
			if err != nil && !errors.Is(err, idempotency.ErrInFlight) {
				t.Errorf("Do: %v", err)
			}
			outcomes <- out
		})
	}
	wg.Wait()
	close(outcomes)
	count := map[idempotency.Outcome]int{}
	for o := range outcomes {
		count[o]++
	}
	if count[idempotency.Executed] != 4 {
		t.Fatalf("outcomes %v; want exactly 4 executions (one per key)", count)
	}
	runs.Range(func(k, v any) bool {
		if n := *v.(*int64); n != 1 {
			t.Errorf("key %v ran %d times", k, n)
		}
		return true
	})
}

func TestContextDoneChangesNothing(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	now := time.Now()
	if _, _, err := s.Begin(ctx, "k", "fp", now, lease, retention); !errors.Is(err, context.Canceled) {
		t.Fatalf("Begin with a done ctx = %v, want context.Canceled", err)
	}
	if _, err := s.Get(context.Background(), "k", now); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("Get after a cancelled Begin = %v, want ErrNotFound", err)
	}
	rec, _, err := s.Begin(context.Background(), "k", "fp", now, lease, retention)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, "k", rec.Token, idempotency.Response{}, now, retention); !errors.Is(err, context.Canceled) {
		t.Fatalf("Complete with a done ctx = %v", err)
	}
	if got, err := s.Get(context.Background(), "k", now); err != nil || got.State != idempotency.Processing {
		t.Fatalf("after a cancelled Complete: %+v, %v; want Processing", got, err)
	}
}

func TestUnreachableServerIsUnavailable(t *testing.T) {
	s := brokenStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	now := time.Now()
	_, _, err := s.Begin(ctx, "k", "fp", now, lease, retention)
	if !errors.Is(err, idempotency.ErrUnavailable) {
		t.Fatalf("Begin = %v, want ErrUnavailable", err)
	}
	var netErr *net.OpError
	if !errors.As(err, &netErr) {
		t.Errorf("Begin error %v does not wrap the native *net.OpError", err)
	}
	for name, err := range map[string]error{
		"complete": s.Complete(ctx, "k", 1, idempotency.Response{}, now, retention),
		"extend":   s.Extend(ctx, "k", 1, now, lease),
		"release":  s.Release(ctx, "k", 1),
		"delete":   s.Delete(ctx, "k"),
		"migrate":  s.Migrate(ctx),
	} {
		if !errors.Is(err, idempotency.ErrUnavailable) {
			t.Errorf("%s = %v, want ErrUnavailable", name, err)
		}
	}
	if _, err := s.Get(ctx, "k", now); !errors.Is(err, idempotency.ErrUnavailable) {
		t.Errorf("Get = %v, want ErrUnavailable", err)
	}
	if ctx.Err() != nil {
		t.Fatalf("the calls took longer than 5s: failing fast is part of the contract")
	}
}

func TestSweep(t *testing.T) {
	s, pool := newTestStore(t, Options{SweepBatch: 3})
	ctx := context.Background()
	t0 := time.Now()
	for i := range 10 {
		key := string(rune('a' + i))
		rec, _, err := s.Begin(ctx, key, "fp", t0, lease, retention)
		if err != nil {
			t.Fatal(err)
		}
		if i < 7 { // 7 done records expire at t0+retention, 3 in flight later
			if err := s.Complete(ctx, key, rec.Token, idempotency.Response{Status: 200}, t0, retention); err != nil {
				t.Fatal(err)
			}
		} else if err := s.Extend(ctx, key, rec.Token, t0.Add(retention), lease); err != nil {
			t.Fatal(err)
		}
	}
	count := func() (n int) {
		t.Helper()
		if err := pool.QueryRow(ctx, s.names.Replace("SELECT count(*) FROM {{table}}")).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n, err := s.Sweep(ctx, t0, 0); err != nil || n != 0 {
		t.Fatalf("Sweep before anything expired = %d, %v", n, err)
	}
	at := t0.Add(retention)
	if n, err := s.Sweep(ctx, at, 5); err != nil || n != 5 {
		t.Fatalf("Sweep with limit 5 = %d, %v; want 5", n, err)
	}
	if n, err := s.Sweep(ctx, at, 0); err != nil || n != 2 {
		t.Fatalf("Sweep of the rest = %d, %v; want 2", n, err)
	}
	if n := count(); n != 3 {
		t.Fatalf("%d rows left, want the 3 live ones", n)
	}
	for _, key := range []string{"h", "i", "j"} {
		if _, err := s.Get(ctx, key, at); err != nil {
			t.Errorf("live key %s after Sweep: %v", key, err)
		}
	}
}

func TestRoundTripsPerRequest(t *testing.T) {
	tracer := &countingTracer{}
	pool := testPool(t, 4, tracer)
	s := migratedStore(t, pool, freshSchema(t, pool), Options{})
	g, err := idempotency.NewGuard(s, &idempotency.Options{Lease: lease, Retention: retention})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	fn := func(context.Context) (idempotency.Response, error) {
		return idempotency.Response{Status: 200, Body: []byte("ok")}, nil
	}
	do := func(want idempotency.Outcome) int64 {
		t.Helper()
		before := tracer.n.Load()
		_, out, err := g.Do(ctx, "stmt-key", "fp", fn)
		if err != nil || out != want {
			t.Fatalf("Do = %v, %v; want %v", out, err, want)
		}
		return tracer.n.Load() - before
	}
	if n := do(idempotency.Executed); n != 2 {
		t.Errorf("a new request took %d round trips, want 2 (Begin, Complete)", n)
	}
	if n := do(idempotency.Replayed); n != 1 {
		t.Errorf("a replay took %d round trips, want 1 (Begin)", n)
	}
}

// TestSweepDeletesTombstones: the tombstones of Release and Delete are
// expired rows like any other, deleted by the next Sweep: a Begin's token
// is drawn under the key's row lock, and needs no tombstone to stay larger
// than the released one (see
// TestLateBeginAfterReleaseGetsLargerToken/*/ReleaseSweep).
func TestSweepDeletesTombstones(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	ctx := context.Background()
	now := time.Now()
	rec, _, err := s.Begin(ctx, "released", "fp", now, lease, retention)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, "released", rec.Token); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Begin(ctx, "deleted", "fp", now, lease, retention); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "deleted"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Begin(ctx, "live", "fp", now, lease, retention); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Sweep(ctx, now, 0); err != nil || n != 2 {
		t.Fatalf("Sweep of two tombstones = %d, %v; want 2", n, err)
	}
	if _, err := s.Get(ctx, "live", now); err != nil {
		t.Fatalf("live claim after Sweep: %v", err)
	}
}
