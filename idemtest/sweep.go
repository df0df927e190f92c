package idemtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/archlab/idempotency"
)

// sweeper is the method of a store that collects expired records on
// demand (boltstore, pgstore). The Store contract leaves collection to the
// engine, but a collection is one more way for a key's record to end, so
// the suite checks tokens across it when the store offers one.
type sweeper interface {
	Sweep(ctx context.Context, now time.Time, limit int) (int, error)
}

// sweep calls the store's Sweep at e.t0, if it has one, and reports whether
// it did. Every record that Sweep may remove at e.t0 has expired by the
// wall clock too (e.t0 is the time the clause began), so a sweep is safe
// on a shared, live store.
func (e *env) sweep() bool {
	e.t.Helper()
	sw, ok := e.s.(sweeper)
	if !ok {
		return false
	}
	if _, err := sw.Sweep(e.ctx, e.t0, 0); err != nil {
		e.fatalf("Sweep(%v): unexpected error: %v", e.t0, err)
	}
	return true
}

// increaseAcrossSweep checks that a claim after a Sweep collected the
// key's record, however it ended, gets a larger token, and that Sweep
// leaves live records alone.
func increaseAcrossSweep(e *env) {
	if _, ok := e.s.(sweeper); !ok {
		e.t.Logf("%s: the store has no Sweep(ctx, now, limit); nothing to check", e.clause)
		return
	}
	// Claims made this long before t0 have left their window by t0.
	past := e.at(-2*retention - lease)
	ends := []struct {
		name string
		end  func(key string, rec idempotency.Record)
	}{
		{"abandoned", func(string, idempotency.Record) {}},
		{"released", func(k string, rec idempotency.Record) {
			if err := e.s.Release(e.ctx, k, rec.Token); err != nil {
				e.fatalf("Release: unexpected error: %v", err)
			}
		}},
		{"deleted", func(k string, _ idempotency.Record) {
			if err := e.s.Delete(e.ctx, k); err != nil {
				e.fatalf("Delete: unexpected error: %v", err)
			}
		}},
		{"completed", func(k string, rec idempotency.Record) {
			e.complete(k, rec.Token, sampleResponse("swept"), past)
		}},
		{"completed-then-deleted", func(k string, rec idempotency.Record) {
			e.complete(k, rec.Token, sampleResponse("swept"), past)
			if err := e.s.Delete(e.ctx, k); err != nil {
				e.fatalf("Delete: unexpected error: %v", err)
			}
		}},
	}
	keys := make([]string, len(ends))
	firsts := make([]idempotency.Record, len(ends))
	for i, end := range ends {
		keys[i] = e.key("sweep-" + end.name)
		firsts[i] = e.claim(keys[i], "fp", past)
		end.end(keys[i], firsts[i])
	}
	// Live records, Processing (past its lease: Sweep judges windows, not
	// leases) and Done, must survive the sweep.
	liveProc := e.key("sweep-live-processing")
	proc := e.claim(liveProc, "fp", e.at(-2*lease))
	liveDone := e.key("sweep-live-done")
	done := e.claim(liveDone, "fp", e.at(-2*lease))
	e.complete(liveDone, done.Token, sampleResponse("kept"), e.at(-lease))
	doneBefore := e.get(liveDone, e.t0)

	e.sweep()
	for i, end := range ends {
		e.wantNotFound(keys[i], e.t0)
		next := e.claim(keys[i], "other", e.t0)
		if next.Token <= firsts[i].Token {
			e.fatalf("token of the claim after a Sweep collected the %s record: %d, not larger than %d", end.name, next.Token, firsts[i].Token)
		}
	}
	e.wantState("the live Processing record after Sweep", e.get(liveProc, e.t0), idempotency.Processing, "fp", proc.Token)
	e.unchanged(liveDone, e.t0, doneBefore)
	// A second round: the claims made after the sweep end, and another
	// sweep collects them.
	for i := range keys {
		cur := e.get(keys[i], e.t0)
		if err := e.s.Release(e.ctx, keys[i], cur.Token); err != nil {
			e.fatalf("Release: unexpected error: %v", err)
		}
		firsts[i] = cur
	}
	e.sweep()
	for i := range keys {
		if next := e.claim(keys[i], "fp", e.t0); next.Token <= firsts[i].Token {
			e.fatalf("token of the claim after a Sweep collected a released record: %d, not larger than %d", next.Token, firsts[i].Token)
		}
	}
}

// Churn sizes: workers racing for one key, and the Begins each makes.
const (
	churnWorkers = 8
	churnBegins  = 40
)

// tokensInClaimOrder checks that claims of one key, made one after
// another by racing callers, get increasing tokens, while each claim ends
// (Release, Delete, Complete then Delete) and, if the store has one, Sweep
// collects what is left. Time does not move, so a claim ends only by its
// holder's hand: claims cannot overlap, and the order in which holders
// note their tokens (before ending their claims) is the order of the
// claims. A store that draws a token before it holds the key (a sequence
// read outside the row lock, a counter read before a compare-and-set) can
// hand a slow claimer a token smaller than that of a claim made and ended
// meanwhile.
func tokensInClaimOrder(e *env) {
	k := e.key("churn")
	now := e.t0
	var (
		mu     sync.Mutex
		tokens []uint64
		errs   []error
	)
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	var stop atomic.Bool
	var sweeps sync.WaitGroup
	if sw, ok := e.s.(sweeper); ok {
		sweeps.Add(1)
		go func() {
			defer sweeps.Done()
			defer panicked(fail)
			for !stop.Load() {
				if _, err := sw.Sweep(e.ctx, now, 0); err != nil {
					fail(fmt.Errorf("Sweep: %w", err))
					return
				}
			}
		}()
	}
	var wg sync.WaitGroup
	for w := range churnWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer panicked(fail)
			for i := range churnBegins {
				rec, ok, err := e.s.Begin(e.ctx, k, "fp", now, lease, retention)
				if err != nil {
					fail(fmt.Errorf("Begin: %w", err))
					return
				}
				if !ok {
					continue
				}
				mu.Lock()
				tokens = append(tokens, rec.Token)
				mu.Unlock()
				switch (w + i) % 3 {
				case 0:
					err = e.s.Release(e.ctx, k, rec.Token)
				case 1:
					err = e.s.Delete(e.ctx, k)
				default:
					err = e.s.Complete(e.ctx, k, rec.Token, sampleResponse("churn"), now, retention)
					if err == nil {
						err = e.s.Delete(e.ctx, k)
					}
				}
				if err != nil {
					fail(fmt.Errorf("ending the claim of token %d: %w", rec.Token, err))
					return
				}
			}
		}()
	}
	wg.Wait()
	stop.Store(true)
	sweeps.Wait()
	if err := errors.Join(errs...); err != nil {
		e.fatalf("unexpected error: %v", err)
	}
	if len(tokens) < 2 {
		e.fatalf("%d claims in %d Begins of a key whose claims all ended; want many", len(tokens), churnWorkers*churnBegins)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			e.fatalf("claim %d of %d got token %d after claim %d got %d (tokens in claim order: %v); want strictly increasing",
				i+1, len(tokens), tokens[i], i, tokens[i-1], tokens)
		}
	}
}
