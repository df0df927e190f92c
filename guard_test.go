package idempotency_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/archlab/idempotency"
	"go.uber.org/goleak"
)

// The tests that own timers run in a synctest bubble with Guard.Now nil:
// the bubble's fake clock drives both the renewal timers and the times the
// Guard hands to the store, and a 10-second handler takes no real time.

// callCountingStore counts the calls of a MemoryStore's operations.
type callCountingStore struct {
	*idempotency.MemoryStore
	begins, extends, completes, releases atomic.Int32
}

func newCallCountingStore() *callCountingStore {
	return &callCountingStore{MemoryStore: idempotency.NewMemoryStore()}
}

func (s *callCountingStore) Begin(ctx context.Context, key, fp string, now time.Time, lease, retention time.Duration) (idempotency.Record, bool, error) {
	s.begins.Add(1)
	return s.MemoryStore.Begin(ctx, key, fp, now, lease, retention)
}

func (s *callCountingStore) Extend(ctx context.Context, key string, token uint64, now time.Time, lease time.Duration) error {
	s.extends.Add(1)
	return s.MemoryStore.Extend(ctx, key, token, now, lease)
}

func (s *callCountingStore) Complete(ctx context.Context, key string, token uint64, resp idempotency.Response, now time.Time, retention time.Duration) error {
	s.completes.Add(1)
	return s.MemoryStore.Complete(ctx, key, token, resp, now, retention)
}

func (s *callCountingStore) Release(ctx context.Context, key string, token uint64) error {
	s.releases.Add(1)
	return s.MemoryStore.Release(ctx, key, token)
}

type asyncResult struct {
	resp idempotency.Response
	out  idempotency.Outcome
	err  error
}

// doAsync runs g.Do in a goroutine and returns a channel with its result.
func doAsync(g *idempotency.Guard, key, fp string, fn func(context.Context) (idempotency.Response, error)) <-chan asyncResult {
	ch := make(chan asyncResult, 1)
	go func() {
		resp, out, err := g.Do(context.Background(), key, fp, fn)
		ch <- asyncResult{resp, out, err}
	}()
	return ch
}

func sleepyFn(runs *atomic.Int32, d time.Duration, resp idempotency.Response) func(context.Context) (idempotency.Response, error) {
	return func(ctx context.Context) (idempotency.Response, error) {
		runs.Add(1)
		select {
		case <-time.After(d):
			return resp, nil
		case <-ctx.Done():
			return idempotency.Response{}, ctx.Err()
		}
	}
}

func TestGuardRenewsSlowHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newCallCountingStore()
		var renewals, renewErrs atomic.Int32
		g := &idempotency.Guard{Store: s, Lease: 3 * time.Second, Retention: time.Hour,
			OnRenew: func(key string, err error) {
				renewals.Add(1)
				if err != nil || key != "slow" {
					renewErrs.Add(1)
				}
			}}
		var runs atomic.Int32
		want := idempotency.Response{Status: 200, Body: []byte("slow but once")}
		start := time.Now()
		first := doAsync(g, "slow", "fp", sleepyFn(&runs, 10*time.Second, want))
		// Retries arrive long after the first lease (3s) would have ended.
		for _, at := range []time.Duration{2 * time.Second, 5 * time.Second, 9 * time.Second} {
			time.Sleep(time.Until(start.Add(at)))
			_, out, err := g.Do(context.Background(), "slow", "fp", sleepyFn(&runs, 0, idempotency.Response{}))
			if out != idempotency.InFlight || !errors.Is(err, idempotency.ErrInFlight) {
				t.Fatalf("retry at %v of a 10s handler with a 3s lease = %s, %v; want %s", at, out, err, idempotency.InFlight)
			}
		}
		r := <-first
		if r.out != idempotency.Executed || r.err != nil || string(r.resp.Body) != string(want.Body) {
			t.Fatalf("the slow call = %s, %v, %q; want %s", r.out, r.err, r.resp.Body, idempotency.Executed)
		}
		if n := runs.Load(); n != 1 {
			t.Fatalf("fn ran %d times, want 1", n)
		}
		// Renewed every Lease/3 = 1s for 10s.
		if n := renewals.Load(); n < 8 || renewErrs.Load() != 0 {
			t.Errorf("OnRenew: %d renewals, %d with an error or the wrong key; want about 9, all successful", n, renewErrs.Load())
		}
		if _, out, _ := g.Do(context.Background(), "slow", "fp", sleepyFn(&runs, 0, idempotency.Response{})); out != idempotency.Replayed {
			t.Errorf("a retry after the slow call = %s, want %s", out, idempotency.Replayed)
		}
	})
}

func TestGuardRejectedRenewalCancelsFn(t *testing.T) {
	for _, how := range []string{"deleted", "deleted-and-reclaimed"} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := idempotency.NewMemoryStore()
				var lost atomic.Int32
				g := &idempotency.Guard{Store: s, Lease: 3 * time.Second, Retention: time.Hour,
					OnRenew: func(_ string, err error) {
						if errors.Is(err, idempotency.ErrLeaseLost) {
							lost.Add(1)
						}
					}}
				var fnErr error
				started := make(chan struct{})
				res := doAsync(g, "k", "fp", func(ctx context.Context) (idempotency.Response, error) {
					close(started)
					select {
					case <-time.After(time.Minute):
						return idempotency.Response{Status: 200, Body: []byte("too late")}, nil
					case <-ctx.Done():
						fnErr = ctx.Err()
						return idempotency.Response{Status: 200, Body: []byte("cancelled")}, nil
					}
				})
				<-started
				time.Sleep(1500 * time.Millisecond) // one renewal done, the next at 2s
				if err := s.Delete(context.Background(), "k"); err != nil {
					t.Fatal(err)
				}
				var other idempotency.Record
				if how == "deleted-and-reclaimed" {
					var ok bool
					var err error
					other, ok, err = s.Begin(context.Background(), "k", "fp", time.Now(), time.Hour, time.Hour)
					if err != nil || !ok {
						t.Fatalf("reclaiming the deleted key: %v, %v", ok, err)
					}
				}
				start := time.Now()
				r := <-res
				if !errors.Is(r.err, idempotency.ErrLeaseLost) {
					t.Fatalf("Do after its renewal was rejected = %s, %v; want an error wrapping ErrLeaseLost", r.out, r.err)
				}
				if !errors.Is(fnErr, context.Canceled) {
					t.Fatalf("fn's ctx ended with %v, want context.Canceled", fnErr)
				}
				if d := time.Since(start); d > 2*time.Second {
					t.Errorf("fn was cancelled %v after the key was deleted; want at the next renewal (1s)", d)
				}
				if lost.Load() != 1 {
					t.Errorf("OnRenew saw ErrLeaseLost %d times, want 1", lost.Load())
				}
				got, err := s.Get(context.Background(), "k", time.Now())
				switch how {
				case "deleted":
					if !errors.Is(err, idempotency.ErrNotFound) {
						t.Errorf("Get after the lost lease = %+v, %v; want ErrNotFound (result not stored)", got, err)
					}
				default:
					if err != nil || got.State != idempotency.Processing || got.Token != other.Token {
						t.Errorf("Get after the lost lease = %+v, %v; want the new holder's claim untouched", got, err)
					}
				}
			})
		})
	}
}

// TestGuardRenewalFailingPastLease: when the store cannot be reached for a
// whole lease, fn is cancelled (another holder may take over), but if
// nobody did, its result is still stored: the token decides.
func TestGuardRenewalFailingPastLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := idempotency.NewMemoryStore()
		var failing atomic.Bool
		s.Fault = func(op string) error {
			if op == "extend" && failing.Load() {
				return errors.New("store unreachable")
			}
			return nil
		}
		var renewErrs atomic.Int32
		g := &idempotency.Guard{Store: s, Lease: 3 * time.Second, Retention: time.Hour,
			OnRenew: func(_ string, err error) {
				if errors.Is(err, idempotency.ErrUnavailable) {
					renewErrs.Add(1)
				}
			}}
		failing.Store(true)
		var cancelled time.Duration
		start := time.Now()
		resp, out, err := g.Do(context.Background(), "k", "fp", func(ctx context.Context) (idempotency.Response, error) {
			select {
			case <-time.After(time.Minute):
			case <-ctx.Done():
				cancelled = time.Since(start)
			}
			return idempotency.Response{Status: 202}, nil
		})
		if cancelled == 0 || cancelled > 3*time.Second {
			t.Fatalf("fn cancelled after %v of failing renewals, want by the end of the 3s lease", cancelled)
		}
		if renewErrs.Load() < 2 {
			t.Errorf("OnRenew saw %d ErrUnavailable renewals, want the failed attempts reported", renewErrs.Load())
		}
		if out != idempotency.Executed || err != nil || resp.Status != 202 {
			t.Fatalf("Do = %s, %v, %d; want %s with the result stored (nobody took over)", out, err, resp.Status, idempotency.Executed)
		}
		if rec, err := s.Get(context.Background(), "k", time.Now()); err != nil || rec.State != idempotency.Done {
			t.Fatalf("Get = %+v, %v; want Done", rec, err)
		}
	})
}

func TestTokenFrom(t *testing.T) {
	if tok, ok := idempotency.TokenFrom(context.Background()); ok || tok != 0 {
		t.Errorf("TokenFrom outside fn = %d, %v; want 0, false", tok, ok)
	}
	s := idempotency.NewMemoryStore()
	g := &idempotency.Guard{Store: s}
	type ctxKey struct{}
	var inside, derived uint64
	var okInside, okDerived bool
	res, err := g.Run(context.Background(), "k", "fp", func(ctx context.Context) (idempotency.Response, error) {
		inside, okInside = idempotency.TokenFrom(ctx)
		dctx, cancel := context.WithTimeout(context.WithValue(ctx, ctxKey{}, 1), time.Minute)
		defer cancel()
		derived, okDerived = idempotency.TokenFrom(dctx)
		return idempotency.Response{Status: 200}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(context.Background(), "k", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if !okInside || inside == 0 || inside != res.Token || inside != rec.Token {
		t.Errorf("TokenFrom inside fn = %d, %v; want the claim's token %d (Result.Token %d)", inside, okInside, rec.Token, res.Token)
	}
	if !okDerived || derived != inside {
		t.Errorf("TokenFrom of a context derived from fn's = %d, %v; want %d", derived, okDerived, inside)
	}
	// A second claim (after a Delete) has a larger token.
	if err := s.Delete(context.Background(), "k"); err != nil {
		t.Fatal(err)
	}
	var second uint64
	if _, _, err := g.Do(context.Background(), "k", "fp", func(ctx context.Context) (idempotency.Response, error) {
		second, _ = idempotency.TokenFrom(ctx)
		return idempotency.Response{}, nil
	}); err != nil {
		t.Fatal(err)
	}
	if second <= inside {
		t.Errorf("token of the second claim %d is not larger than the first's %d", second, inside)
	}
}

func TestGuardRetryable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newCallCountingStore()
		g := &idempotency.Guard{Store: s, Lease: 5 * time.Second, Retention: time.Hour}
		refused := errors.New("downstream refused the call before sending it")
		var runs atomic.Int32
		ok := func(context.Context) (idempotency.Response, error) {
			runs.Add(1)
			return idempotency.Response{Status: 200}, nil
		}

		// Retryable: the key is released, the retry runs at once.
		_, out, err := g.Do(context.Background(), "retryable", "fp", func(context.Context) (idempotency.Response, error) {
			return idempotency.Response{}, idempotency.Retryable(refused)
		})
		if out != idempotency.Executed || !errors.Is(err, refused) || !idempotency.IsRetryable(err) {
			t.Fatalf("Do with a Retryable error = %s, %v; want %s and the Retryable error", out, err, idempotency.Executed)
		}
		if s.releases.Load() != 1 {
			t.Errorf("Release called %d times, want 1", s.releases.Load())
		}
		if _, out, err := g.Do(context.Background(), "retryable", "fp", ok); out != idempotency.Executed || err != nil {
			t.Fatalf("retry after a Retryable error = %s, %v; want %s at once", out, err, idempotency.Executed)
		}

		// A plain error: maybe something happened, the key stays in flight
		// until the lease ends (no renewal once fn has returned).
		plain := errors.New("timeout talking to the bank")
		_, out, err = g.Do(context.Background(), "plain", "fp", func(context.Context) (idempotency.Response, error) {
			return idempotency.Response{}, plain
		})
		if out != idempotency.Executed || !errors.Is(err, plain) || idempotency.IsRetryable(err) {
			t.Fatalf("Do with a plain error = %s, %v; want %s and the error", out, err, idempotency.Executed)
		}
		time.Sleep(4 * time.Second)
		if _, out, err := g.Do(context.Background(), "plain", "fp", ok); out != idempotency.InFlight || !errors.Is(err, idempotency.ErrInFlight) {
			t.Fatalf("retry inside the lease after a plain error = %s, %v; want %s", out, err, idempotency.InFlight)
		}
		time.Sleep(time.Second)
		if _, out, err := g.Do(context.Background(), "plain", "fp", ok); out != idempotency.Executed || err != nil {
			t.Fatalf("retry after the lease = %s, %v; want %s", out, err, idempotency.Executed)
		}
		if runs.Load() != 2 {
			t.Errorf("fn ran %d times, want 2", runs.Load())
		}
	})
}

func TestGuardPanicReleases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := idempotency.NewMemoryStore()
		g := &idempotency.Guard{Store: s, Lease: time.Minute, Retention: time.Hour}
		type boom struct{ n int }
		value := &boom{42}
		func() {
			defer func() {
				if r := recover(); r != value {
					t.Fatalf("recovered %v, want the original panic value %v", r, value)
				}
			}()
			_, _, _ = g.Do(context.Background(), "k", "fp", func(context.Context) (idempotency.Response, error) {
				panic(value)
			})
			t.Fatal("Do returned; want the panic to go on")
		}()
		if _, err := s.Get(context.Background(), "k", time.Now()); !errors.Is(err, idempotency.ErrNotFound) {
			t.Fatalf("Get after the panic = %v, want ErrNotFound (released)", err)
		}
		_, out, err := g.Do(context.Background(), "k", "fp", func(context.Context) (idempotency.Response, error) {
			return idempotency.Response{Status: 200}, nil
		})
		if out != idempotency.Executed || err != nil {
			t.Fatalf("retry after the panic = %s, %v; want %s at once", out, err, idempotency.Executed)
		}
	})
}

// TestGuardNothingOutlivesDo: once Do has returned, no renewal runs and no
// goroutine of the Guard is left.
func TestGuardNothingOutlivesDo(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	synctest.Test(t, func(t *testing.T) {
		s := newCallCountingStore()
		g := &idempotency.Guard{Store: s, Lease: 3 * time.Second, Retention: time.Hour}
		var runs atomic.Int32
		var wg sync.WaitGroup
		for i, d := range []time.Duration{0, 500 * time.Millisecond, 2500 * time.Millisecond, 7 * time.Second} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := string(rune('a' + i))
				if _, out, err := g.Do(context.Background(), key, "fp", sleepyFn(&runs, d, idempotency.Response{Status: 200})); err != nil || out != idempotency.Executed {
					t.Errorf("Do(%s) = %s, %v", key, out, err)
				}
			}()
		}
		wg.Wait()
		n := s.extends.Load()
		if n == 0 {
			t.Fatal("no renewal at all during a 7s handler with a 3s lease")
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if m := s.extends.Load(); m != n {
			t.Fatalf("%d renewals happened after every Do had returned", m-n)
		}
	})
}

func TestNewGuardValidates(t *testing.T) {
	s := idempotency.NewMemoryStore()
	bad := []struct {
		name  string
		store idempotency.Store
		opts  idempotency.Options
	}{
		{"nil-store", nil, idempotency.Options{}},
		{"negative-lease", s, idempotency.Options{Lease: -time.Second}},
		{"retention-shorter-than-lease", s, idempotency.Options{Lease: time.Minute, Retention: time.Second}},
		{"default-retention-shorter-than-lease", s, idempotency.Options{Lease: 48 * time.Hour}},
		{"renew-every-equal-lease", s, idempotency.Options{Lease: time.Second, RenewEvery: time.Second}},
		{"renew-every-longer-than-lease", s, idempotency.Options{Lease: time.Second, RenewEvery: time.Minute}},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			if g, err := idempotency.NewGuard(c.store, &c.opts); !errors.Is(err, idempotency.ErrInvalidConfig) || g != nil {
				t.Errorf("NewGuard = %v, %v; want nil and ErrInvalidConfig", g, err)
			}
			// A literal with the same fields fails closed: fn does not run.
			g := &idempotency.Guard{Store: c.store, Lease: c.opts.Lease, Retention: c.opts.Retention, RenewEvery: c.opts.RenewEvery}
			if err := g.Validate(); !errors.Is(err, idempotency.ErrInvalidConfig) {
				t.Errorf("Validate = %v, want ErrInvalidConfig", err)
			}
			ran := false
			_, out, err := g.Do(context.Background(), "k", "fp", func(context.Context) (idempotency.Response, error) {
				ran = true
				return idempotency.Response{}, nil
			})
			if ran || out != idempotency.Unavailable || !errors.Is(err, idempotency.ErrUnavailable) || !errors.Is(err, idempotency.ErrInvalidConfig) {
				t.Errorf("Do on an invalid Guard: ran %v, %s, %v; want fn not run, %s, ErrUnavailable and ErrInvalidConfig", ran, out, err, idempotency.Unavailable)
			}
		})
	}
	// An error about a default the caller did not set says it is one.
	for _, c := range []struct {
		opts idempotency.Options
		want string
	}{
		{idempotency.Options{Retention: 10 * time.Second}, "Retention 10s is shorter than Lease 30s (the default Lease, DefaultLease)"},
		{idempotency.Options{Lease: 48 * time.Hour}, "Retention 24h0m0s is shorter than Lease 48h0m0s (the default Retention, DefaultRetention)"},
		{idempotency.Options{Lease: time.Minute, Retention: time.Second}, "Retention 1s is shorter than Lease 1m0s"},
	} {
		_, err := idempotency.NewGuard(s, &c.opts)
		if err == nil || !strings.HasSuffix(err.Error(), c.want) {
			t.Errorf("NewGuard(%+v) = %v; want an error ending %q", c.opts, err, c.want)
		}
	}
	for _, opts := range []*idempotency.Options{nil, {}, {Lease: time.Second, Retention: time.Second}, {RenewEvery: -1}} {
		if _, err := idempotency.NewGuard(s, opts); err != nil {
			t.Errorf("NewGuard(%+v) = %v, want a Guard", opts, err)
		}
	}
}

// TestGuardCompleteUnavailable: the side effect happened but its result
// could not be stored: Do says Executed, returns fn's response and an error
// wrapping ErrUnavailable.
func TestGuardCompleteUnavailable(t *testing.T) {
	s := idempotency.NewMemoryStore()
	s.Fault = func(op string) error {
		if op == "complete" {
			return errors.New("connection reset")
		}
		return nil
	}
	g := &idempotency.Guard{Store: s, RenewEvery: -1}
	resp, out, err := g.Do(context.Background(), "k", "fp", func(context.Context) (idempotency.Response, error) {
		return idempotency.Response{Status: 201, Body: []byte("charged")}, nil
	})
	if out != idempotency.Executed || !errors.Is(err, idempotency.ErrUnavailable) || resp.Status != 201 || string(resp.Body) != "charged" {
		t.Fatalf("Do with Complete failing = %s, %v, %+v; want %s, ErrUnavailable and fn's response", out, err, resp, idempotency.Executed)
	}
	// The claim is left to its lease: a retry now is in flight.
	if _, out, _ := g.Do(context.Background(), "k", "fp", func(context.Context) (idempotency.Response, error) {
		t.Error("fn ran again inside the lease")
		return idempotency.Response{}, nil
	}); out != idempotency.InFlight {
		t.Errorf("retry = %s, want %s", out, idempotency.InFlight)
	}
}

// TestGuardRenewerAcrossSynctestBubbles: renewal timers made inside a
// bubble belong to it; a Guard used inside bubbles, then outside, then
// inside again must renew on the right clock each time and never touch a
// timer of another bubble (which aborts the program).
func TestGuardRenewerAcrossSynctestBubbles(t *testing.T) {
	slowInBubble := func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := newCallCountingStore()
			g := &idempotency.Guard{Store: s, Lease: 3 * time.Second, Retention: time.Hour}
			var runs atomic.Int32
			for i := range 8 { // quick calls: their renewers end before firing
				if _, _, err := g.Do(context.Background(), string(rune('a'+i)), "fp", sleepyFn(&runs, 0, idempotency.Response{})); err != nil {
					t.Fatal(err)
				}
			}
			res := doAsync(g, "slow", "fp", sleepyFn(&runs, 10*time.Second, idempotency.Response{Status: 200}))
			time.Sleep(6 * time.Second)
			if _, out, _ := g.Do(context.Background(), "slow", "fp", sleepyFn(&runs, 0, idempotency.Response{})); out != idempotency.InFlight {
				t.Fatalf("retry 6s into a 10s handler with a 3s lease = %s, want %s (renewed on the bubble's clock)", out, idempotency.InFlight)
			}
			if r := <-res; r.err != nil || s.extends.Load() < 8 {
				t.Fatalf("slow call: %v after %d renewals; want success after about 9", r.err, s.extends.Load())
			}
		})
	}
	slowInBubble(t)
	// Outside any bubble, with real timers: fn waits for two renewals.
	renewed := make(chan struct{}, 16)
	g := &idempotency.Guard{Store: idempotency.NewMemoryStore(), Lease: 300 * time.Millisecond,
		RenewEvery: 100 * time.Millisecond, Retention: time.Hour,
		OnRenew: func(_ string, err error) {
			if err == nil {
				select {
				case renewed <- struct{}{}:
				default:
				}
			}
		}}
	var runs atomic.Int32
	for i := range 8 {
		if _, _, err := g.Do(context.Background(), string(rune('a'+i)), "fp", sleepyFn(&runs, 0, idempotency.Response{})); err != nil {
			t.Fatal(err)
		}
	}
	_, out, err := g.Do(context.Background(), "real", "fp", func(context.Context) (idempotency.Response, error) {
		for range 2 {
			select {
			case <-renewed:
			case <-time.After(10 * time.Second): // a hang guard, not a timing goal
				return idempotency.Response{}, errors.New("no renewal outside a bubble within 10s")
			}
		}
		return idempotency.Response{Status: 200}, nil
	})
	if err != nil || out != idempotency.Executed {
		t.Fatalf("Do outside a bubble = %s, %v", out, err)
	}
	slowInBubble(t)
}
