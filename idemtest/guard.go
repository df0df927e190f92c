package idemtest

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/archlab/idempotency"
)

// guard returns a Guard on the env's store whose clock reads *clock. It does
// not renew leases: the suite moves the clock by hand, and renewal timers
// belong to the Guard's own tests.
func (e *env) guard(clock *atomic.Int64) *idempotency.Guard {
	clock.Store(int64(0))
	return &idempotency.Guard{Store: e.s, Lease: lease, Retention: retention, RenewEvery: -1,
		Now: func() time.Time { return e.t0.Add(time.Duration(clock.Load())) }}
}

// counted returns fn that counts its runs and answers resp.
func counted(runs *atomic.Int32, resp idempotency.Response) func(context.Context) (idempotency.Response, error) {
	return func(context.Context) (idempotency.Response, error) {
		runs.Add(1)
		return resp, nil
	}
}

func (e *env) do(g *idempotency.Guard, key, fp string, fn func(context.Context) (idempotency.Response, error), want idempotency.Outcome, wantErr error) idempotency.Response {
	e.t.Helper()
	resp, out, err := g.Do(e.ctx, key, fp, fn)
	if out != want || !errors.Is(err, wantErr) {
		e.fatalf("Guard.Do(%q, %q) = %s, %v; want %s, %v", shorten(key), fp, out, err, want, wantErr)
	}
	return resp
}

var guardClauses = []clause{
	{"executes-then-replays", func(e *env) {
		var clock atomic.Int64
		g := e.guard(&clock)
		k := e.key("guard")
		var runs atomic.Int32
		fn := counted(&runs, sampleResponse("guard"))
		e.wantResponse("Executed", e.do(g, k, "fp", fn, idempotency.Executed, nil), sampleResponse("guard"))
		clock.Store(int64(retention - time.Second))
		e.wantResponse("Replayed", e.do(g, k, "fp", fn, idempotency.Replayed, nil), sampleResponse("guard"))
		e.do(g, k, "other", fn, idempotency.Conflicted, idempotency.ErrConflict)
		if n := runs.Load(); n != 1 {
			e.fatalf("fn ran %d times, want 1", n)
		}
		// After the window the key runs again.
		clock.Store(int64(retention))
		e.do(g, k, "other", fn, idempotency.Executed, nil)
		if n := runs.Load(); n != 2 {
			e.fatalf("fn ran %d times after the window, want 2", n)
		}
	}},
	{"in-flight-then-takeover", func(e *env) {
		var clock atomic.Int64
		g := e.guard(&clock)
		k := e.key("guard-inflight")
		// A holder that dies: claimed in the store directly, never completed.
		dead := e.claim(k, "fp", e.at(0))
		var runs atomic.Int32
		fn := counted(&runs, sampleResponse("second"))
		clock.Store(int64(lease / 2))
		e.do(g, k, "fp", fn, idempotency.InFlight, idempotency.ErrInFlight)
		clock.Store(int64(lease))
		e.do(g, k, "fp", fn, idempotency.Executed, nil)
		if n := runs.Load(); n != 1 {
			e.fatalf("fn ran %d times, want 1 (after the takeover only)", n)
		}
		e.wantLeaseLost("Complete by the dead holder", e.s.Complete(e.ctx, k, dead.Token, sampleResponse("dead"), e.at(lease), retention))
		e.wantResponse("stored result", e.get(k, e.at(lease)).Response, sampleResponse("second"))
	}},
	{"retryable-releases", func(e *env) {
		var clock atomic.Int64
		g := e.guard(&clock)
		k := e.key("guard-retryable")
		refused := errors.New("refused before any side effect")
		_, out, err := g.Do(e.ctx, k, "fp", func(context.Context) (idempotency.Response, error) {
			return idempotency.Response{}, idempotency.Retryable(refused)
		})
		if out != idempotency.Executed || !errors.Is(err, refused) {
			e.fatalf("Do with a Retryable error = %s, %v; want %s and the error", out, err, idempotency.Executed)
		}
		var runs atomic.Int32
		e.do(g, k, "fp", counted(&runs, sampleResponse("x")), idempotency.Executed, nil)
		if runs.Load() != 1 {
			e.fatalf("the retry after a Retryable error did not run")
		}
	}},
}
