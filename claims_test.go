package idempotency_test

// Tests of promises made by the package's documentation that no other test
// pinned down: the defaults of a zero Guard and of a nil CacheOptions, which
// fields of a Result each outcome fills, OnRenew's silence about an attempt
// that fn's return cut short, and the MemoryStore's Fault hook and Keys.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/archlab/idempotency"
)

// argsStore records what the Guard hands its Store; it also hides a
// MemoryStore from the Guard's fast path.
type argsStore struct {
	idempotency.Store
	mu         sync.Mutex
	leases     []time.Duration // of each Begin
	retentions []time.Duration // of each Begin, then of each Complete
	extends    []time.Time     // the now of each Extend
}

func (s *argsStore) Begin(ctx context.Context, key, fp string, now time.Time, lease, retention time.Duration) (idempotency.Record, bool, error) {
	s.mu.Lock()
	s.leases = append(s.leases, lease)
	s.retentions = append(s.retentions, retention)
	s.mu.Unlock()
	return s.Store.Begin(ctx, key, fp, now, lease, retention)
}

func (s *argsStore) Complete(ctx context.Context, key string, token uint64, resp idempotency.Response, now time.Time, retention time.Duration) error {
	s.mu.Lock()
	s.retentions = append(s.retentions, retention)
	s.mu.Unlock()
	return s.Store.Complete(ctx, key, token, resp, now, retention)
}

func (s *argsStore) Extend(ctx context.Context, key string, token uint64, now time.Time, lease time.Duration) error {
	s.mu.Lock()
	s.extends = append(s.extends, now)
	s.leases = append(s.leases, lease)
	s.mu.Unlock()
	return s.Store.Extend(ctx, key, token, now, lease)
}

// TestGuardZeroValueDefaults: "The zero value of every field but Store is
// usable": Lease 30s (DefaultLease), Retention 24h (DefaultRetention),
// renewed every Lease/3, for a Guard literal and for NewGuard(store, nil)
// alike, on both ways to the store.
func TestGuardZeroValueDefaults(t *testing.T) {
	if idempotency.DefaultLease != 30*time.Second || idempotency.DefaultRetention != 24*time.Hour {
		t.Fatalf("DefaultLease %v, DefaultRetention %v; the docs say 30s and 24h", idempotency.DefaultLease, idempotency.DefaultRetention)
	}
	guards := map[string]func(idempotency.Store) *idempotency.Guard{
		"literal": func(s idempotency.Store) *idempotency.Guard { return &idempotency.Guard{Store: s} },
		"NewGuard(nil)": func(s idempotency.Store) *idempotency.Guard {
			g, err := idempotency.NewGuard(s, nil)
			if err != nil {
				t.Fatal(err)
			}
			return g
		},
	}
	for name, newGuard := range guards {
		t.Run(name+"/store interface", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := &argsStore{Store: idempotency.NewMemoryStore()}
				g := newGuard(s)
				start := time.Now()
				r, err := g.Run(context.Background(), "k", "fp", func(context.Context) (idempotency.Response, error) {
					time.Sleep(35 * time.Second) // past the lease: renewed at 10s, 20s and 30s
					return idempotency.Response{Status: 201}, nil
				})
				if err != nil || r.Outcome != idempotency.Executed {
					t.Fatalf("Do = %s, %v", r.Outcome, err)
				}
				s.mu.Lock()
				leases, retentions, extends := s.leases, s.retentions, s.extends
				s.mu.Unlock()
				for _, l := range leases {
					if l != 30*time.Second {
						t.Errorf("leases handed to the store: %v, want 30s each", leases)
						break
					}
				}
				if !slices.Equal(retentions, []time.Duration{24 * time.Hour, 24 * time.Hour}) {
					t.Errorf("retentions handed to Begin and Complete: %v, want 24h each", retentions)
				}
				var at []time.Duration
				for _, e := range extends {
					at = append(at, e.Sub(start))
				}
				if want := []time.Duration{10 * time.Second, 20 * time.Second, 30 * time.Second}; !slices.Equal(at, want) {
					t.Errorf("renewals at %v after the claim, want %v (every Lease/3)", at, want)
				}
				// The window is 24h from the result.
				if want := start.Add(35*time.Second + 24*time.Hour); !r.ExpiresAt.Equal(want) {
					t.Errorf("ExpiresAt %v, want %v", r.ExpiresAt, want)
				}
				time.Sleep(24*time.Hour - time.Second)
				if _, out, _ := g.Do(context.Background(), "k", "fp", okFn); out != idempotency.Replayed {
					t.Errorf("a second before the window ends: %s, want %s", out, idempotency.Replayed)
				}
				time.Sleep(time.Second)
				if _, out, err := g.Do(context.Background(), "k", "fp", okFn); out != idempotency.Executed {
					t.Errorf("when the window ends: %s, %v; want %s", out, err, idempotency.Executed)
				}
			})
		})
		t.Run(name+"/memory fast path", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := idempotency.NewMemoryStore()
				g := newGuard(s)
				start := time.Now()
				_, out, err := g.Do(context.Background(), "k", "fp", func(ctx context.Context) (idempotency.Response, error) {
					rec, err := s.Get(ctx, "k", time.Now())
					if err != nil || !rec.LeaseUntil.Equal(start.Add(30*time.Second)) || !rec.ExpiresAt.Equal(start.Add(24*time.Hour)) {
						t.Errorf("the claim: %+v, %v; want a 30s lease in a 24h window", rec, err)
					}
					time.Sleep(11 * time.Second)
					if rec, err := s.Get(ctx, "k", time.Now()); err != nil || !rec.LeaseUntil.Equal(start.Add(40*time.Second)) {
						t.Errorf("11s in: %+v, %v; want the lease renewed at 10s, to 40s", rec, err)
					}
					return idempotency.Response{Status: 201}, nil
				})
				if out != idempotency.Executed || err != nil {
					t.Fatalf("Do = %s, %v", out, err)
				}
				if rec, err := s.Get(context.Background(), "k", time.Now()); err != nil || !rec.ExpiresAt.Equal(start.Add(11*time.Second+24*time.Hour)) {
					t.Errorf("the result: %+v, %v; want a 24h window from it", rec, err)
				}
			})
		})
	}
}

func okFn(context.Context) (idempotency.Response, error) {
	return idempotency.Response{Status: 200}, nil
}

// TestResultFieldsPerOutcome: Result.Token is set for Executed only,
// LeaseUntil for InFlight only (the holder's lease, "Result.LeaseUntil says
// when"), ExpiresAt for Executed with a stored result and for Replayed.
func TestResultFieldsPerOutcome(t *testing.T) {
	paths := map[string]func(*idempotency.MemoryStore) idempotency.Store{
		"memory fast path": func(m *idempotency.MemoryStore) idempotency.Store { return m },
		"store interface":  func(m *idempotency.MemoryStore) idempotency.Store { return slowPath{m} },
	}
	for name, wrap := range paths {
		t.Run(name, func(t *testing.T) {
			m := idempotency.NewMemoryStore()
			g := &idempotency.Guard{Store: wrap(m), Lease: time.Minute, Retention: time.Hour, RenewEvery: -1}
			ctx := context.Background()
			check := func(what string, r idempotency.Result, token, lease, expires bool) {
				t.Helper()
				if (r.Token != 0) != token || !r.LeaseUntil.IsZero() != lease || !r.ExpiresAt.IsZero() != expires {
					t.Errorf("%s: %s with Token %d, LeaseUntil %v, ExpiresAt %v; want set: Token %v, LeaseUntil %v, ExpiresAt %v",
						what, r.Outcome, r.Token, r.LeaseUntil, r.ExpiresAt, token, lease, expires)
				}
			}

			stored, err := g.Run(ctx, "done", "fp", okFn)
			if err != nil || stored.Outcome != idempotency.Executed {
				t.Fatalf("Run = %s, %v", stored.Outcome, err)
			}
			check("stored", stored, true, false, true)
			if rec, err := m.Get(ctx, "done", time.Now()); err != nil || !rec.ExpiresAt.Equal(stored.ExpiresAt) || rec.Token != stored.Token {
				t.Errorf("the store holds %+v, %v; the Result said token %d, ExpiresAt %v", rec, err, stored.Token, stored.ExpiresAt)
			}

			replay, err := g.Run(ctx, "done", "fp", okFn)
			if err != nil || replay.Outcome != idempotency.Replayed {
				t.Fatalf("replay = %s, %v", replay.Outcome, err)
			}
			check("replay", replay, false, false, true)
			if !replay.ExpiresAt.Equal(stored.ExpiresAt) {
				t.Errorf("replay ExpiresAt %v, want the stored result's %v", replay.ExpiresAt, stored.ExpiresAt)
			}

			failed, err := g.Run(ctx, "failed", "fp", func(context.Context) (idempotency.Response, error) {
				return idempotency.Response{}, errors.New("maybe charged")
			})
			if err == nil || failed.Outcome != idempotency.Executed {
				t.Fatalf("fn failing = %s, %v", failed.Outcome, err)
			}
			check("fn failed", failed, true, false, false)

			// "failed" is held until its lease ends: a retry is in flight.
			inflight, err := g.Run(ctx, "failed", "fp", okFn)
			if !errors.Is(err, idempotency.ErrInFlight) {
				t.Fatalf("retry of a failed fn = %s, %v; want %s", inflight.Outcome, err, idempotency.InFlight)
			}
			check("in flight", inflight, false, true, false)
			if rec, err := m.Get(ctx, "failed", time.Now()); err != nil || !rec.LeaseUntil.Equal(inflight.LeaseUntil) {
				t.Errorf("in flight: LeaseUntil %v; the store's claim is %+v, %v", inflight.LeaseUntil, rec, err)
			}

			conflict, err := g.Run(ctx, "done", "other", okFn)
			if !errors.Is(err, idempotency.ErrConflict) {
				t.Fatalf("another fingerprint = %s, %v", conflict.Outcome, err)
			}
			check("conflict", conflict, false, false, false)

			m.Fault = func(string) error { return errors.New("down") }
			down, err := g.Run(ctx, "new", "fp", okFn)
			m.Fault = nil
			if !errors.Is(err, idempotency.ErrUnavailable) || down.Outcome != idempotency.Unavailable {
				t.Fatalf("store down = %s, %v", down.Outcome, err)
			}
			check("unavailable", down, false, false, false)
		})
	}
}

// blockingExtendStore makes Extend number block (counting from 1) until
// its ctx is done, after saying so on extending.
type blockingExtendStore struct {
	idempotency.Store
	block     int32
	n         atomic.Int32
	extending chan struct{}
}

func (s *blockingExtendStore) Extend(ctx context.Context, key string, token uint64, now time.Time, lease time.Duration) error {
	if s.n.Add(1) == s.block {
		close(s.extending)
		<-ctx.Done()
		return ctx.Err()
	}
	return s.Store.Extend(ctx, key, token, now, lease)
}

// TestOnRenewSilentWhenFnReturnsMidAttempt: OnRenew "is called after every
// renewal attempt, with its error ...; not for an attempt cut short because
// fn returned". The first renewal is reported; the second, under way when
// fn returns, is cut short and not reported (it would be, with
// context.Canceled, as a failure that did not happen).
func TestOnRenewSilentWhenFnReturnsMidAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &blockingExtendStore{Store: idempotency.NewMemoryStore(), block: 2, extending: make(chan struct{})}
		var mu sync.Mutex
		var reported []error
		g := &idempotency.Guard{Store: s, Lease: 3 * time.Second, Retention: time.Hour,
			OnRenew: func(_ string, err error) {
				mu.Lock()
				reported = append(reported, err)
				mu.Unlock()
			}}
		_, out, err := g.Do(context.Background(), "k", "fp", func(context.Context) (idempotency.Response, error) {
			<-s.extending // the second renewal is waiting on the store
			return idempotency.Response{Status: 200}, nil
		})
		if out != idempotency.Executed || err != nil {
			t.Fatalf("Do = %s, %v", out, err)
		}
		time.Sleep(time.Minute) // whatever the renewer still had to do, it has done
		mu.Lock()
		defer mu.Unlock()
		if len(reported) != 1 || reported[0] != nil {
			t.Errorf("OnRenew saw %v; want one successful renewal, and nothing for the attempt cut short", reported)
		}
	})
}

// TestReplayCacheDefaults: a nil CacheOptions answers a finished record
// from memory for one second (TTL), and holds up to 64 MiB (MaxBytes), a
// record being cached only if its estimate is within MaxBytes/64; MaxBytes
// may be as small as 80 KiB.
func TestReplayCacheDefaults(t *testing.T) {
	ctx := context.Background()
	t.Run("TTL", func(t *testing.T) {
		cs := &countingStore{Store: idempotency.NewMemoryStore()}
		c := newCache(t, cs, nil)
		finish(t, c, "k", "fp", "body", t0, time.Hour)
		base := cs.begins.Load()
		for _, step := range []struct {
			at    time.Duration
			store bool // the store is asked
		}{{0, true}, {500 * time.Millisecond, false}, {time.Second - 1, false}, {time.Second, true}} {
			before := cs.begins.Load()
			if rec, _ := begin(t, c, "k", "fp", t0.Add(step.at)); rec.State != idempotency.Done {
				t.Fatalf("Begin at +%v = %s, want %s", step.at, rec.State, idempotency.Done)
			}
			if asked := cs.begins.Load() > before; asked != step.store {
				t.Errorf("Begin at +%v: store asked %v, want %v (a 1s TTL from the read at +0)", step.at, asked, step.store)
			}
		}
		if got := cs.begins.Load() - base; got != 2 {
			t.Errorf("%d Begins reached the store, want 2", got)
		}
	})
	t.Run("MaxBytes", func(t *testing.T) {
		// 64 MiB over 64 shards: a record is cached if its estimate, its
		// bytes and a few hundred more, is within 1 MiB.
		for _, tc := range []struct {
			body   int
			cached bool
		}{{1<<20 - 1024, true}, {1<<20 + 1, false}} {
			c := newCache(t, idempotency.NewMemoryStore(), nil)
			rec, _, err := c.Begin(ctx, "k", "fp", t0, time.Minute, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Complete(ctx, "k", rec.Token, idempotency.Response{Status: 200, Body: make([]byte, tc.body)}, t0, time.Hour); err != nil {
				t.Fatal(err)
			}
			if rec, _ := begin(t, c, "k", "fp", t0); len(rec.Response.Body) != tc.body {
				t.Fatalf("replay of %d bytes has %d", tc.body, len(rec.Response.Body))
			}
			if st := c.Stats(); (st.Entries == 1) != tc.cached {
				t.Errorf("a %d-byte body under the default MaxBytes: %+v; want cached %v", tc.body, st, tc.cached)
			}
		}
	})
	t.Run("smallest MaxBytes", func(t *testing.T) {
		if _, err := idempotency.NewReplayCache(idempotency.NewMemoryStore(), &idempotency.CacheOptions{MaxBytes: 80 << 10}); err != nil {
			t.Errorf("MaxBytes 80 KiB: %v, want accepted", err)
		}
		if _, err := idempotency.NewReplayCache(idempotency.NewMemoryStore(), &idempotency.CacheOptions{MaxBytes: 80<<10 - 1}); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("MaxBytes below 80 KiB: %v, want ErrInvalidConfig", err)
		}
	})
}

// TestMemoryFaultNotCalledWhenCtxDone: the Fault hook "is called at the
// start of each operation whose ctx is not done"; a done ctx fails the
// operation with ctx's error, and changes nothing.
func TestMemoryFaultNotCalledWhenCtxDone(t *testing.T) {
	s := idempotency.NewMemoryStore()
	rec, _, err := s.Begin(context.Background(), "k", "fp", t0, time.Minute, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var calls []string
	s.Fault = func(op string) error { calls = append(calls, op); return nil }
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	errs := map[string]error{}
	_, _, errs["begin"] = s.Begin(ctx, "k2", "fp", t0, time.Minute, time.Hour)
	errs["complete"] = s.Complete(ctx, "k", rec.Token, idempotency.Response{Status: 1}, t0, time.Hour)
	errs["extend"] = s.Extend(ctx, "k", rec.Token, t0, time.Hour)
	errs["release"] = s.Release(ctx, "k", rec.Token)
	_, errs["get"] = s.Get(ctx, "k", t0)
	errs["delete"] = s.Delete(ctx, "k")
	for op, err := range errs {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a done ctx = %v, want context.Canceled", op, err)
		}
	}
	if len(calls) != 0 {
		t.Errorf("Fault called for %v with a done ctx", calls)
	}
	s.Fault = nil
	if got, err := s.Get(context.Background(), "k", t0); err != nil || got.State != idempotency.Processing || !got.LeaseUntil.Equal(rec.LeaseUntil) {
		t.Errorf("after the calls with a done ctx: %+v, %v; want the claim unchanged", got, err)
	}
	if keys := s.Keys(t0); !slices.Equal(keys, []string{"k"}) {
		t.Errorf("Keys = %q, want only [k]", keys)
	}
}

// TestMemoryKeysLiveSorted: Keys returns "the keys of the live records at
// now, sorted", while Len counts "expired ones not yet reclaimed" too.
func TestMemoryKeysLiveSorted(t *testing.T) {
	s := idempotency.NewMemoryStore()
	ctx := context.Background()
	names := strings.Fields("m b z a q c y")
	for i, k := range names {
		// "a", "c", "y" expire a minute in; the others live an hour.
		ret := time.Hour
		if strings.Contains("acy", k) {
			ret = time.Minute
		}
		if _, ok, err := s.Begin(ctx, k, "fp", t0.Add(time.Duration(i)), time.Second, ret); err != nil || !ok {
			t.Fatal(k, ok, err)
		}
	}
	if got, want := s.Keys(t0.Add(time.Second)), []string{"a", "b", "c", "m", "q", "y", "z"}; !slices.Equal(got, want) {
		t.Errorf("Keys = %q, want %q", got, want)
	}
	if got, want := s.Keys(t0.Add(2*time.Minute)), []string{"b", "m", "q", "z"}; !slices.Equal(got, want) {
		t.Errorf("Keys after three expired = %q, want %q", got, want)
	}
	if s.Len() != len(names) {
		t.Errorf("Len = %d, want %d: expired records not yet reclaimed still count", s.Len(), len(names))
	}
}

// TestRejectedRenewalWithFnError: "If a renewal is rejected ..., fn's ctx is
// cancelled, the result is not stored and Do returns an error wrapping
// ErrLeaseLost", whatever fn returns: here fn gives up with its ctx's error,
// as most do, and the caller must still learn that the key is no longer its
// own (and not be told it is free, as a plain error would suggest once its
// lease ends).
func TestRejectedRenewalWithFnError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := idempotency.NewMemoryStore()
		g := &idempotency.Guard{Store: s, Lease: 3 * time.Second, Retention: time.Hour}
		var other idempotency.Record
		_, out, err := g.Do(context.Background(), "k", "fp", func(ctx context.Context) (idempotency.Response, error) {
			// An operator deletes the key and another caller claims it.
			if err := s.Delete(context.Background(), "k"); err != nil {
				t.Fatal(err)
			}
			var ok bool
			var err error
			if other, ok, err = s.Begin(context.Background(), "k", "fp", time.Now(), time.Hour, time.Hour); err != nil || !ok {
				t.Fatalf("reclaiming the deleted key: %v, %v", ok, err)
			}
			<-ctx.Done() // the next renewal is rejected
			return idempotency.Response{}, ctx.Err()
		})
		if out != idempotency.Executed || !errors.Is(err, idempotency.ErrLeaseLost) || !errors.Is(err, context.Canceled) {
			t.Errorf("Do = %s, %v; want %s with ErrLeaseLost and fn's error", out, err, idempotency.Executed)
		}
		if got, err := s.Get(context.Background(), "k", time.Now()); err != nil || got.Token != other.Token || got.State != idempotency.Processing {
			t.Errorf("the new holder's claim: %+v, %v; want it untouched", got, err)
		}
	})
}

// lostAckStore applies Begin or Complete, as chosen by lose, and then
// reports the store unavailable, as a write whose acknowledgement was lost.
type lostAckStore struct {
	idempotency.Store
	lose string // "begin", "complete" or "" (none)
}

func (s *lostAckStore) Begin(ctx context.Context, key, fp string, now time.Time, lease, retention time.Duration) (idempotency.Record, bool, error) {
	rec, ok, err := s.Store.Begin(ctx, key, fp, now, lease, retention)
	if err == nil && s.lose == "begin" {
		return idempotency.Record{}, false, fmt.Errorf("lost reply: %w", idempotency.ErrUnavailable)
	}
	return rec, ok, err
}

func (s *lostAckStore) Complete(ctx context.Context, key string, token uint64, resp idempotency.Response, now time.Time, retention time.Duration) error {
	if s.lose == "complete" {
		return fmt.Errorf("connection reset: %w", idempotency.ErrUnavailable)
	}
	return s.Store.Complete(ctx, key, token, resp, now, retention)
}

// TestUnavailableWriteRetried: what a retry sees after a write failed with
// ErrUnavailable (errors.go). A Begin applied but unacknowledged: fn did
// not run, and the retry finds the claim, in flight until its lease ends,
// then claims the key and runs fn once. A Complete that failed: fn ran, its
// result is not stored, and a retry is in flight until the lease ends and
// then runs fn again: that is what TokenFrom is for.
func TestUnavailableWriteRetried(t *testing.T) {
	for _, tc := range []struct {
		lose      string
		firstOut  idempotency.Outcome
		firstRuns int32
	}{
		{"begin", idempotency.Unavailable, 0},
		{"complete", idempotency.Executed, 1},
	} {
		t.Run(tc.lose, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := &lostAckStore{Store: idempotency.NewMemoryStore(), lose: tc.lose}
				g := &idempotency.Guard{Store: s, Lease: 10 * time.Second, Retention: time.Hour}
				var runs atomic.Int32
				fn := func(context.Context) (idempotency.Response, error) {
					runs.Add(1)
					return idempotency.Response{Status: 201}, nil
				}
				_, out, err := g.Do(context.Background(), "k", "fp", fn)
				if out != tc.firstOut || !errors.Is(err, idempotency.ErrUnavailable) || runs.Load() != tc.firstRuns {
					t.Fatalf("Do = %s, %v, fn ran %d times; want %s, ErrUnavailable, %d", out, err, runs.Load(), tc.firstOut, tc.firstRuns)
				}
				s.lose = ""
				time.Sleep(9 * time.Second)
				if _, out, err := g.Do(context.Background(), "k", "fp", fn); out != idempotency.InFlight {
					t.Errorf("retry inside the lease = %s, %v; want %s", out, err, idempotency.InFlight)
				}
				time.Sleep(time.Second)
				if _, out, err := g.Do(context.Background(), "k", "fp", fn); out != idempotency.Executed || err != nil {
					t.Errorf("retry after the lease = %s, %v; want %s", out, err, idempotency.Executed)
				}
				if got := runs.Load(); got != tc.firstRuns+1 {
					t.Errorf("fn ran %d times, want %d", got, tc.firstRuns+1)
				}
			})
		})
	}
}
