package storecert

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/verdict"
)

// misbehaves is a MemoryStore whose method named method (every method, for
// anyMethod) does not return normally: it panics with a value naming it
// or, with block set, blocks until the test ends, whatever its ctx says.
type misbehaves struct {
	*idempotency.MemoryStore
	method string
	block  chan struct{} // nil: panic
}

const anyMethod = "*"

func (s misbehaves) act(method string) {
	if method != s.method && s.method != anyMethod {
		return
	}
	if s.block != nil {
		<-s.block
		return
	}
	panic(panicValue(method))
}

func panicValue(method string) string { return "store bug in " + method }

func (s misbehaves) Begin(ctx context.Context, key, fp string, now time.Time, lease, retention time.Duration) (idempotency.Record, bool, error) {
	s.act("Begin")
	return s.MemoryStore.Begin(ctx, key, fp, now, lease, retention)
}

func (s misbehaves) Complete(ctx context.Context, key string, token uint64, resp idempotency.Response, now time.Time, retention time.Duration) error {
	s.act("Complete")
	return s.MemoryStore.Complete(ctx, key, token, resp, now, retention)
}

func (s misbehaves) Extend(ctx context.Context, key string, token uint64, now time.Time, lease time.Duration) error {
	s.act("Extend")
	return s.MemoryStore.Extend(ctx, key, token, now, lease)
}

func (s misbehaves) Release(ctx context.Context, key string, token uint64) error {
	s.act("Release")
	return s.MemoryStore.Release(ctx, key, token)
}

func (s misbehaves) Get(ctx context.Context, key string, now time.Time) (idempotency.Record, error) {
	s.act("Get")
	return s.MemoryStore.Get(ctx, key, now)
}

func (s misbehaves) Delete(ctx context.Context, key string) error {
	s.act("Delete")
	return s.MemoryStore.Delete(ctx, key)
}

var storeMethods = []string{"Begin", "Complete", "Extend", "Release", "Get", "Delete"}

// blocker returns a channel closed when the test ends, which frees the
// calls of a store that blocks.
func blocker(t *testing.T) chan struct{} {
	ch := make(chan struct{})
	t.Cleanup(func() { close(ch) })
	return ch
}

// callAll calls every Store method of rec once on a fresh key, each with a
// claim of its own where it needs one (made on mem, the store under rec's
// misbehaving one), and returns each method's error.
func callAll(t *testing.T, rec *recorder, mem *idempotency.MemoryStore) map[string]error {
	t.Helper()
	ctx := context.Background()
	now := time.Now()
	claim := func(key string) uint64 {
		r, ok, err := mem.Begin(ctx, key, "fp", now, time.Minute, time.Hour)
		if err != nil || !ok {
			t.Fatalf("claiming %s on the inner store: %v (claimed %v)", key, err, ok)
		}
		return r.Token
	}
	errs := map[string]error{}
	_, _, errs["Begin"] = rec.Begin(ctx, "begin", "fp", now, time.Minute, time.Hour)
	errs["Complete"] = rec.Complete(ctx, "complete", claim("complete"), idempotency.Response{Status: 200}, now, time.Hour)
	errs["Extend"] = rec.Extend(ctx, "extend", claim("extend"), now, time.Minute)
	errs["Release"] = rec.Release(ctx, "release", claim("release"))
	claim("get")
	_, errs["Get"] = rec.Get(ctx, "get", now)
	errs["Delete"] = rec.Delete(ctx, "delete")
	return errs
}

// A store method that panics is, for whoever called it through the
// recorder, an error that names the method and the panic value, wraps
// ErrUnavailable (it may have been applied) and is recorded as a call of
// unknown outcome and as a fault; the other methods are untouched.
func TestRecorderPanickingStore(t *testing.T) {
	for _, method := range storeMethods {
		t.Run(method, func(t *testing.T) {
			inner := misbehaves{MemoryStore: idempotency.NewMemoryStore(), method: method}
			rec := newRecorder(inner, time.Second, false)
			errs := callAll(t, rec, inner.MemoryStore)
			for m, err := range errs {
				if m != method {
					if err != nil {
						t.Errorf("%s, which does not panic: %v", m, err)
					}
					continue
				}
				if err == nil || !strings.Contains(err.Error(), method) || !strings.Contains(err.Error(), panicValue(method)) {
					t.Errorf("%s panicked; the recorder returned %v, want an error naming %s and %q", m, err, method, panicValue(method))
				}
				if !errors.Is(err, idempotency.ErrUnavailable) {
					t.Errorf("%s panicked; the recorder's error %v does not wrap ErrUnavailable", m, err)
				}
			}
			calls, faults := rec.callStats()
			if calls != len(storeMethods) || len(faults) != 1 || !strings.Contains(faults[0].Error(), panicValue(method)) {
				t.Errorf("recorded %d calls and faults %v; want %d calls and the one panic of %s", calls, faults, len(storeMethods), method)
			}
			for _, o := range rec.history() {
				if o.in.kind.String() == method && !o.out.unknown {
					t.Errorf("the panicking %s was recorded with a known outcome: %v", method, o.out)
				}
			}
		})
	}
}

// A store method that ignores its ctx and never returns is given up on
// opTimeout+callGrace after the call: an error naming the method, and a
// fault.
func TestRecorderHungStore(t *testing.T) {
	inner := misbehaves{MemoryStore: idempotency.NewMemoryStore(), method: "Begin", block: blocker(t)}
	rec := newRecorder(inner, 10*time.Millisecond, false)
	_, _, err := rec.Begin(context.Background(), "k", "fp", time.Now(), time.Minute, time.Hour)
	if err == nil || !strings.Contains(err.Error(), "Begin") || !strings.Contains(err.Error(), "did not return") {
		t.Fatalf("Begin blocked for ever; the recorder returned %v, want an error saying it did not return", err)
	}
	if !errors.Is(err, idempotency.ErrUnavailable) {
		t.Errorf("the error of a hung call does not wrap ErrUnavailable: %v", err)
	}
	if _, faults := rec.callStats(); len(faults) != 1 || !faults[0].hung {
		t.Errorf("faults %v, want the one hung Begin", faults)
	}
}

// wantCallFault requires checkCallsReturn to have failed in rep, with an
// example that contains every one of want.
func wantCallFault(t *testing.T, rep *verdict.Report, seed int64, want ...string) {
	t.Helper()
	for _, c := range rep.Checks() {
		if c.Name != checkCallsReturn {
			continue
		}
		if c.Failed == 0 {
			break
		}
		for _, ex := range c.Examples {
			found := true
			for _, w := range want {
				found = found && strings.Contains(ex, w)
			}
			if found {
				return
			}
		}
		t.Fatalf("%q failed, but no example names %q (seed %d):\n%s", checkCallsReturn, want, seed, report(rep))
	}
	t.Fatalf("%q did not fail (seed %d):\n%s", checkCallsReturn, seed, report(rep))
}

// The campaign on a store that panics in one method (Begin and Complete on
// the workers' goroutines, Extend on the Guard's renewal goroutines and in
// the stale probe, Release after a refused fn) ends, and fails the check
// naming the method and the panic value; the contract runs on a correct
// store. Get and Delete are not called by the campaign (see
// TestRecorderPanickingStore).
func TestCampaignPanickingStore(t *testing.T) {
	for _, method := range []string{"Begin", "Complete", "Extend", "Release"} {
		t.Run(method, func(t *testing.T) {
			s := misbehaves{MemoryStore: idempotency.NewMemoryStore(), method: method}
			rep, progress, seed := certifyUnfaulted(t, "a store that panics in "+method, s, idempotency.NewMemoryStore())
			if rep.OK() {
				t.Fatalf("the certification passed a store that panics in %s (seed %d):\n%s\nprogress:\n%s", method, seed, report(rep), progress)
			}
			wantCallFault(t, rep, seed, method, panicValue(method))
			t.Logf("seed %d:\n%s", seed, report(rep))
		})
	}
}

// The campaign on a store whose Complete blocks for ever, whatever its
// ctx, ends (each call is given up after opTimeout+callGrace) and fails the
// check, naming the method.
func TestCampaignHungStore(t *testing.T) {
	s := misbehaves{MemoryStore: idempotency.NewMemoryStore(), method: "Complete", block: blocker(t)}
	rep, progress, seed := certifyUnfaulted(t, "a store whose Complete never returns", s, idempotency.NewMemoryStore())
	if rep.OK() {
		t.Fatalf("the certification passed a store whose Complete never returns (seed %d):\n%s\nprogress:\n%s", seed, report(rep), progress)
	}
	wantCallFault(t, rep, seed, "Complete", fmt.Sprintf("did not return within %v", campaignOpTimout+callGrace))
	t.Logf("seed %d:\n%s", seed, report(rep))
}

// hangsThenPanics is a store whose Begin ignores its ctx, blocks until
// free is closed, and then panics.
type hangsThenPanics struct {
	*idempotency.MemoryStore
	free chan struct{}
}

func (s hangsThenPanics) Begin(context.Context, string, string, time.Time, time.Duration, time.Duration) (idempotency.Record, bool, error) {
	<-s.free
	panic(panicValue("Begin"))
}

// A call given up on as hung that panics later is still one faulty call:
// one fault, the hung one (checkCallsReturn fails once per call). It was
// recorded twice, hung and then panicked.
func TestRecorderHungCallPanicsLater(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inner := hangsThenPanics{MemoryStore: idempotency.NewMemoryStore(), free: make(chan struct{})}
		rec := newRecorder(inner, 10*time.Millisecond, false)
		_, _, err := rec.Begin(context.Background(), "k", "fp", time.Now(), time.Minute, time.Hour)
		if !abandoned(err) {
			t.Fatalf("Begin blocked past its bound; the recorder returned %v, want it given up on as hung", err)
		}
		close(inner.free)
		synctest.Wait() // the call's goroutine panics and ends
		calls, faults := rec.callStats()
		if calls != 1 || len(faults) != 1 || !faults[0].hung {
			t.Errorf("recorded %d calls and faults %v; want 1 call and its one hung fault", calls, faults)
		}
	})
}
