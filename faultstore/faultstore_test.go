package faultstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/faultstore"
)

var t0 = time.Date(2026, 10, 19, 4, 0, 0, 0, time.UTC)

const (
	lease     = time.Second
	retention = time.Hour
)

var errCause = errors.New("connection reset")

// begin claims key on s and reports the error.
func begin(s idempotency.Store, key string) (idempotency.Record, bool, error) {
	return s.Begin(context.Background(), key, "fp", t0, lease, retention)
}

func TestErrorIsNotApplied(t *testing.T) {
	mem := idempotency.NewMemoryStore()
	s := faultstore.New(mem, faultstore.OnOps(faultstore.Error(errCause), faultstore.OpBegin))
	_, claimed, err := begin(s, "k")
	if err == nil || claimed {
		t.Fatalf("Begin = claimed %v, err %v; want an injected error", claimed, err)
	}
	for _, target := range []error{idempotency.ErrUnavailable, faultstore.ErrInjected, errCause} {
		if !errors.Is(err, target) {
			t.Errorf("Begin error %q does not wrap %q", err, target)
		}
	}
	var ie *faultstore.InjectedError
	if !errors.As(err, &ie) || ie.Applied || ie.Op != faultstore.OpBegin || ie.Key != "k" {
		t.Errorf("Begin error = %#v; want an unapplied InjectedError for begin k", ie)
	}
	if _, err := mem.Get(context.Background(), "k", t0); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("inner Get after an Error fault = %v; want ErrNotFound (nothing applied)", err)
	}
	if got := s.Injected(faultstore.OpBegin); got != 1 {
		t.Errorf("Injected(begin) = %d; want 1", got)
	}
}

func TestLostAckIsApplied(t *testing.T) {
	mem := idempotency.NewMemoryStore()
	s := faultstore.New(mem, faultstore.OnOps(faultstore.LostAck(nil), faultstore.OpBegin, faultstore.OpComplete))
	_, _, err := begin(s, "k")
	var ie *faultstore.InjectedError
	if !errors.As(err, &ie) || !ie.Applied || !errors.Is(err, idempotency.ErrUnavailable) {
		t.Fatalf("Begin error = %v; want an applied InjectedError wrapping ErrUnavailable", err)
	}
	rec, err := mem.Get(context.Background(), "k", t0)
	if err != nil || rec.State != idempotency.Processing {
		t.Fatalf("inner Get after a lost Begin ack = %+v, %v; want the claim", rec, err)
	}
	// A lost ack on a write the store refused is reported as not applied,
	// and the store's ErrLeaseLost stays out of the chain.
	err = s.Complete(context.Background(), "k", rec.Token+1, idempotency.Response{Status: 200}, t0, retention)
	if !errors.As(err, &ie) || ie.Applied || errors.Is(err, idempotency.ErrLeaseLost) {
		t.Errorf("Complete with a stale token under LostAck = %v (applied %v); want unapplied, no ErrLeaseLost", err, ie.Applied)
	}
	if err := s.Complete(context.Background(), "k", rec.Token, idempotency.Response{Status: 201}, t0, retention); !errors.As(err, &ie) || !ie.Applied {
		t.Errorf("Complete under LostAck = %v; want an applied InjectedError", err)
	}
	if rec, err := mem.Get(context.Background(), "k", t0); err != nil || rec.State != idempotency.Done || rec.Response.Status != 201 {
		t.Errorf("inner Get after a lost Complete ack = %+v, %v; want Done with 201", rec, err)
	}
	if s.Injected(faultstore.OpBegin) != 1 || s.Injected(faultstore.OpComplete) != 2 || s.InjectedTotal() != 3 {
		t.Errorf("counts begin %d complete %d total %d; want 1, 2, 3",
			s.Injected(faultstore.OpBegin), s.Injected(faultstore.OpComplete), s.InjectedTotal())
	}
}

func TestNoInjectorDelegates(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		inj       faultstore.Injector
		wantCount int
	}{
		{"nil", nil, 0},
		{"None", faultstore.None, 0},
		{"empty Chain", faultstore.Chain(), 7}, // a fault that changes nothing, counted
		{"zero Latency", faultstore.Latency(1, 0, 0), 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := faultstore.New(idempotency.NewMemoryStore(), tc.inj)
			rec, claimed, err := begin(s, "k")
			if err != nil || !claimed {
				t.Fatalf("Begin = %v, %v", claimed, err)
			}
			if err := s.Extend(ctx, "k", rec.Token, t0, lease); err != nil {
				t.Errorf("Extend: %v", err)
			}
			if err := s.Complete(ctx, "k", rec.Token, idempotency.Response{Status: 7}, t0, retention); err != nil {
				t.Errorf("Complete: %v", err)
			}
			if got, err := s.Get(ctx, "k", t0); err != nil || got.Response.Status != 7 {
				t.Errorf("Get = %+v, %v", got, err)
			}
			if err := s.Release(ctx, "k", rec.Token); !errors.Is(err, idempotency.ErrLeaseLost) {
				t.Errorf("Release of a Done record = %v; want ErrLeaseLost", err)
			}
			if err := s.Delete(ctx, "k"); err != nil {
				t.Errorf("Delete: %v", err)
			}
			if _, err := s.Get(ctx, "k", t0); !errors.Is(err, idempotency.ErrNotFound) {
				t.Errorf("Get after Delete = %v; want ErrNotFound", err)
			}
			if n := s.InjectedTotal(); n != tc.wantCount {
				t.Errorf("InjectedTotal = %d; want %d", n, tc.wantCount)
			}
		})
	}
}

func TestCancelledContextConsultsNoInjector(t *testing.T) {
	consulted := 0
	s := faultstore.New(idempotency.NewMemoryStore(), faultstore.InjectorFunc(func(faultstore.Op, string) faultstore.Fault {
		consulted++
		return faultstore.Error(nil)
	}))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _, err := s.Begin(ctx, "k", "fp", t0, lease, retention)
	if !errors.Is(err, context.Canceled) || errors.Is(err, faultstore.ErrInjected) || consulted != 0 {
		t.Errorf("Begin with a cancelled ctx = %v, injector consulted %d times; want context.Canceled, not injected, 0", err, consulted)
	}
}

// pattern returns, for n calls of op on key, which got a fault ('x') and which did not ('.').
func pattern(inj faultstore.Injector, op faultstore.Op, key string, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = '.'
		if inj.MaybeFault(op, key) != nil {
			b[i] = 'x'
		}
	}
	return string(b)
}

func TestCombinators(t *testing.T) {
	e := faultstore.Error(nil)
	isA := func(k string) bool { return k == "a" }
	for _, tc := range []struct {
		name string
		inj  func() faultstore.Injector
		op   faultstore.Op
		key  string
		want string
	}{
		{"fault injects itself", func() faultstore.Injector { return e }, faultstore.OpGet, "a", "xxxx"},
		{"OnOps match", func() faultstore.Injector { return faultstore.OnOps(e, faultstore.OpBegin, faultstore.OpGet) }, faultstore.OpGet, "a", "xxxx"},
		{"OnOps miss", func() faultstore.Injector { return faultstore.OnOps(e, faultstore.OpBegin) }, faultstore.OpGet, "a", "...."},
		{"OnOps none", func() faultstore.Injector { return faultstore.OnOps(e) }, faultstore.OpGet, "a", "...."},
		{"OnKeys match", func() faultstore.Injector { return faultstore.OnKeys(isA, e) }, faultstore.OpGet, "a", "xxxx"},
		{"OnKeys miss", func() faultstore.Injector { return faultstore.OnKeys(isA, e) }, faultstore.OpGet, "b", "...."},
		{"Times", func() faultstore.Injector { return faultstore.Times(2, e) }, faultstore.OpGet, "a", "xx...."},
		{"Times 0", func() faultstore.Injector { return faultstore.Times(0, e) }, faultstore.OpGet, "a", "...."},
		{"Nth", func() faultstore.Injector { return faultstore.Nth(3, e) }, faultstore.OpGet, "a", "..x..."},
		{"Times counts only matches", func() faultstore.Injector {
			return faultstore.Times(1, faultstore.OnOps(e, faultstore.OpBegin))
		}, faultstore.OpGet, "a", "...."},
		{"Random 0", func() faultstore.Injector { return faultstore.Random(1, 0, e) }, faultstore.OpGet, "a", "........"},
		{"Random 1", func() faultstore.Injector { return faultstore.Random(1, 1, e) }, faultstore.OpGet, "a", "xxxxxxxx"},
		{"Any first", func() faultstore.Injector {
			return faultstore.Any(nil, faultstore.OnOps(e, faultstore.OpBegin), faultstore.OnKeys(isA, e))
		}, faultstore.OpGet, "a", "xxx"},
		{"Any none", func() faultstore.Injector { return faultstore.Any(faultstore.None, faultstore.OnKeys(isA, e)) }, faultstore.OpGet, "b", "..."},
		{"All none", func() faultstore.Injector { return faultstore.All(faultstore.None) }, faultstore.OpGet, "b", "..."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := len(tc.want)
			if got := pattern(tc.inj(), tc.op, tc.key, n); got != tc.want {
				t.Errorf("faults = %s; want %s", got, tc.want)
			}
		})
	}
}

func TestAnyTakesTheFirstFault(t *testing.T) {
	inj := faultstore.Any(faultstore.OnOps(faultstore.LostAck(nil), faultstore.OpBegin), faultstore.Error(nil))
	if f := inj.MaybeFault(faultstore.OpBegin, "k"); f == nil || f.String() != "lostack" {
		t.Errorf("Any for begin = %v; want lostack", f)
	}
	if f := inj.MaybeFault(faultstore.OpGet, "k"); f == nil || f.String() != "error" {
		t.Errorf("Any for get = %v; want error", f)
	}
	all := faultstore.All(faultstore.Latency(1, 0, 0), faultstore.OnOps(faultstore.LostAck(nil), faultstore.OpBegin))
	if f := all.MaybeFault(faultstore.OpBegin, "k"); f == nil || f.String() != "latency=0s+lostack" {
		t.Errorf("All for begin = %v; want latency=0s+lostack", f)
	}
}

func TestRandomIsSeeded(t *testing.T) {
	run := func(seed uint64) string {
		return pattern(faultstore.Random(seed, 0.3, faultstore.Error(nil)), faultstore.OpBegin, "k", 200)
	}
	a, b, c := run(42), run(42), run(43)
	if a != b {
		t.Errorf("two runs with seed 42 differ:\n%s\n%s", a, b)
	}
	if a == c {
		t.Errorf("seeds 42 and 43 gave the same 200 choices: %s", a)
	}
	hits := 0
	for _, ch := range a {
		if ch == 'x' {
			hits++
		}
	}
	// 200 draws at p=0.3: 60 expected; 30..90 is more than 6 standard deviations.
	if hits < 30 || hits > 90 {
		t.Errorf("Random(0.3) hit %d of 200", hits)
	}
}

func TestLatencyIsSeededAndBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		waits := func(seed uint64) []time.Duration {
			s := faultstore.New(idempotency.NewMemoryStore(), faultstore.Latency(seed, 10*time.Millisecond, 50*time.Millisecond))
			var out []time.Duration
			for range 20 {
				start := time.Now()
				if _, err := s.Get(context.Background(), "k", t0); !errors.Is(err, idempotency.ErrNotFound) {
					t.Fatalf("Get through Latency = %v; want the inner ErrNotFound", err)
				}
				out = append(out, time.Since(start))
			}
			return out
		}
		a, b, c := waits(7), waits(7), waits(8)
		if fmt.Sprint(a) != fmt.Sprint(b) {
			t.Errorf("seed 7 waited %v, then %v", a, b)
		}
		if fmt.Sprint(a) == fmt.Sprint(c) {
			t.Errorf("seeds 7 and 8 waited the same: %v", a)
		}
		for _, d := range a {
			if d < 10*time.Millisecond || d > 50*time.Millisecond {
				t.Errorf("waited %v, outside [10ms, 50ms]", d)
			}
		}
	})
}

func TestLatencyAndHangHonourContext(t *testing.T) {
	for _, f := range []faultstore.Fault{faultstore.Latency(1, time.Hour, time.Hour), faultstore.Hang()} {
		t.Run(f.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := idempotency.NewMemoryStore()
				s := faultstore.New(mem, f)
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				start := time.Now()
				_, _, err := s.Begin(ctx, "k", "fp", t0, lease, retention)
				if waited := time.Since(start); waited != time.Second {
					t.Errorf("Begin returned after %v; want the ctx timeout, 1s", waited)
				}
				if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, idempotency.ErrUnavailable) || !errors.Is(err, faultstore.ErrInjected) {
					t.Errorf("Begin = %v; want DeadlineExceeded, ErrUnavailable and ErrInjected", err)
				}
				if _, err := mem.Get(context.Background(), "k", t0); !errors.Is(err, idempotency.ErrNotFound) {
					t.Errorf("inner Get = %v; want ErrNotFound (not applied)", err)
				}
			})
		})
	}
}

func TestChainOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := idempotency.NewMemoryStore()
		s := faultstore.New(mem, faultstore.Chain(faultstore.Latency(1, time.Second, time.Second), faultstore.LostAck(nil)))
		start := time.Now()
		_, _, err := begin(s, "k")
		var ie *faultstore.InjectedError
		if !errors.As(err, &ie) || !ie.Applied || time.Since(start) != time.Second {
			t.Errorf("Chain(latency 1s, lostack) = %v after %v; want an applied lost ack after 1s", err, time.Since(start))
		}
	})
}

func TestSetInjector(t *testing.T) {
	s := faultstore.New(idempotency.NewMemoryStore(), faultstore.Error(nil))
	if _, _, err := begin(s, "k"); !errors.Is(err, faultstore.ErrInjected) {
		t.Fatalf("Begin = %v; want injected", err)
	}
	s.SetInjector(nil)
	if _, claimed, err := begin(s, "k"); err != nil || !claimed {
		t.Fatalf("Begin after healing = %v, %v; want a claim", claimed, err)
	}
}

// TestConcurrentUse runs many goroutines through shared combinators; -race
// checks the injectors' state, and the counts must add up.
func TestConcurrentUse(t *testing.T) {
	inj := faultstore.Any(
		faultstore.Times(50, faultstore.OnOps(faultstore.Error(nil), faultstore.OpGet)),
		faultstore.Random(3, 0.5, faultstore.OnOps(faultstore.LostAck(nil), faultstore.OpBegin)),
	)
	s := faultstore.New(idempotency.NewMemoryStore(), inj)
	var wg sync.WaitGroup
	var mu sync.Mutex
	injectedGets := 0
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				key := fmt.Sprintf("k%d-%d", g, i)
				_, _, _ = s.Begin(context.Background(), key, "fp", t0, lease, retention)
				if _, err := s.Get(context.Background(), key, t0); errors.Is(err, faultstore.ErrInjected) {
					mu.Lock()
					injectedGets++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if injectedGets != 50 || s.Injected(faultstore.OpGet) != 50 {
		t.Errorf("injected gets: seen %d, counted %d; want 50", injectedGets, s.Injected(faultstore.OpGet))
	}
	if b := s.Injected(faultstore.OpBegin); b < 100 || b > 300 {
		t.Errorf("injected begins = %d of 400 at p=0.5", b)
	}
}
