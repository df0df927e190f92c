package idemtest

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/archlab/idempotency"
)

// racers is how many goroutines race for one key.
const racers = 64

type beginResult struct {
	rec     idempotency.Record
	claimed bool
	err     error
}

// race runs Begin of key at e.at(0) from racers goroutines released at
// once; fp(i) names the fingerprint of goroutine i.
func (e *env) race(key string, fp func(i int) string) []beginResult {
	e.t.Helper()
	return e.raceAt(key, e.at(0), fp)
}

// raceAt is race at now.
func (e *env) raceAt(key string, now time.Time, fp func(i int) string) []beginResult {
	e.t.Helper()
	out := make([]beginResult, racers)
	var start, done sync.WaitGroup
	start.Add(1)
	for i := range out {
		done.Add(1)
		go func() {
			defer done.Done()
			defer panicked(func(err error) { out[i] = beginResult{err: err} })
			start.Wait()
			rec, ok, err := e.s.Begin(e.ctx, key, fp(i), now, lease, retention)
			out[i] = beginResult{rec, ok, err}
		}()
	}
	start.Done()
	done.Wait()
	for i, r := range out {
		if r.err != nil {
			e.fatalf("Begin of racer %d: unexpected error: %v", i, r.err)
		}
	}
	return out
}

// together runs f and g at once, released together. Go's scheduler tends
// to run the goroutine started last first; swap says which that is, so
// that a clause alternating it sees both orders, and with them the window
// between a store's check and its write. A panic in either (the store's)
// fails the clause once both are done.
func (e *env) together(swap bool, f, g func()) {
	e.t.Helper()
	if swap {
		f, g = g, f
	}
	var start, done sync.WaitGroup
	errs := make([]error, 2)
	start.Add(1)
	for i, fn := range []func(){f, g} {
		done.Add(1)
		go func() {
			defer done.Done()
			defer panicked(func(err error) { errs[i] = err })
			start.Wait()
			fn()
		}()
	}
	start.Done()
	done.Wait()
	if err := errors.Join(errs...); err != nil {
		e.fatalf("a store call made at the same time as another: %v", err)
	}
}

// panicked, deferred in a goroutine a clause starts, hands report a panic
// of the store as an error, so that the clause fails (and Clause.Check
// reports it) rather than the process ending: only the clause's own
// goroutine is recovered by Check.
func panicked(report func(error)) {
	if r := recover(); r != nil {
		report(fmt.Errorf("panic: %v", r))
	}
}

// oneWinner checks the results of racers Begins with fingerprint "fp" of
// key at now, whose record before the race was described by what: exactly
// one claimed, with a token larger than after, and every other racer saw
// that claim in flight.
func (e *env) oneWinner(key, what string, now time.Time, res []beginResult, after uint64) {
	e.t.Helper()
	var winner *beginResult
	for i := range res {
		if res[i].claimed {
			if winner != nil {
				e.fatalf("%d concurrent Begins of %s: two claims (tokens %d and %d), want exactly one", racers, what, winner.rec.Token, res[i].rec.Token)
			}
			winner = &res[i]
		}
	}
	if winner == nil {
		e.fatalf("%d concurrent Begins of %s: no claim, want exactly one", racers, what)
	}
	if winner.rec.Token <= after {
		e.fatalf("%d concurrent Begins of %s: the claim's token %d is not larger than the previous %d", racers, what, winner.rec.Token, after)
	}
	for i, r := range res {
		if !r.claimed {
			e.wantState(fmt.Sprintf("racer %d (in flight)", i), r.rec, idempotency.Processing, "fp", winner.rec.Token)
		}
	}
	e.wantState("Get after the race", e.get(key, now), idempotency.Processing, "fp", winner.rec.Token)
}

var concurrencyClauses = []clause{
	{"one-claim-of-64", func(e *env) {
		k := e.key("race")
		res := e.race(k, func(int) string { return "fp" })
		e.oneWinner(k, "an absent key", e.at(0), res, 0)
	}},
	{"one-takeover-of-64", func(e *env) {
		// The takeover path must be as atomic as the creation path.
		k := e.key("race-takeover")
		first := e.claim(k, "fp", e.at(0))
		now := e.at(lease)
		res := e.raceAt(k, now, func(int) string { return "fp" })
		e.oneWinner(k, "a key whose lease ran out", now, res, first.Token)
	}},
	{"one-claim-of-64-after-expiry", func(e *env) {
		// So must the re-creation of a key whose record left the window but
		// may still be stored.
		k := e.key("race-expired")
		first := e.claim(k, "fp", e.at(0))
		e.complete(k, first.Token, sampleResponse("old"), e.at(0))
		now := first.ExpiresAt
		res := e.raceAt(k, now, func(int) string { return "fp" })
		e.oneWinner(k, "a key whose record expired", now, res, first.Token)
	}},
	{"one-claim-of-64-mixed-fingerprints", func(e *env) {
		k := e.key("race-mixed")
		fp := func(i int) string { return fmt.Sprintf("fp-%d", i%3) }
		res := e.race(k, fp)
		claims := 0
		var owner string
		for i, r := range res {
			if r.claimed {
				claims++
				owner = fp(i)
			}
		}
		if claims != 1 {
			e.fatalf("%d concurrent Begins with 3 fingerprints: %d claims, want exactly one", racers, claims)
		}
		for i, r := range res {
			switch {
			case r.claimed:
			case fp(i) == owner && r.rec.State != idempotency.Processing:
				e.fatalf("racer %d with the winner's fingerprint: State %q, want %q", i, r.rec.State, idempotency.Processing)
			case fp(i) != owner && r.rec.State != idempotency.Conflict:
				e.fatalf("racer %d with another fingerprint: State %q, want %q", i, r.rec.State, idempotency.Conflict)
			}
		}
	}},
	{"holder-races-takeover", func(e *env) {
		// A holder whose lease just ran out finishes (Complete or Extend)
		// while another caller's Begin takes over. Exactly one may win, and
		// the loser must see the winner's state.
		const rounds = 16
		for round := range rounds {
			k := e.key(fmt.Sprintf("holder-race-%d", round))
			first := e.claim(k, "fp", e.at(0))
			now := e.at(lease)
			extend := round%2 == 1
			var holderErr error
			var taker beginResult
			e.together(round/2%2 == 1, func() {
				if extend {
					holderErr = e.s.Extend(e.ctx, k, first.Token, now, lease)
				} else {
					holderErr = e.s.Complete(e.ctx, k, first.Token, sampleResponse("holder"), now, retention)
				}
			}, func() {
				rec, ok, err := e.s.Begin(e.ctx, k, "fp", now, lease, retention)
				taker = beginResult{rec, ok, err}
			})
			if taker.err != nil {
				e.fatalf("round %d: Begin: unexpected error: %v", round, taker.err)
			}
			switch {
			case holderErr == nil && taker.claimed:
				e.fatalf("round %d: both the holder (extend=%v) and the takeover (token %d) succeeded", round, extend, taker.rec.Token)
			case holderErr == nil:
				want := idempotency.Done
				if extend {
					want = idempotency.Processing
				}
				e.wantState(fmt.Sprintf("round %d: Begin after the holder won", round), taker.rec, want, "fp", first.Token)
			case errors.Is(holderErr, idempotency.ErrLeaseLost):
				if !taker.claimed {
					e.fatalf("round %d: the holder lost its lease (%v) but the Begin did not claim (%+v)", round, holderErr, taker.rec)
				}
				if taker.rec.Token <= first.Token {
					e.fatalf("round %d: takeover token %d is not larger than %d", round, taker.rec.Token, first.Token)
				}
			default:
				e.fatalf("round %d: holder: unexpected error: %v", round, holderErr)
			}
		}
	}},
	{"holder-release-races-takeover", func(e *env) {
		// A holder whose lease just ran out gives the key back while
		// another caller's Begin takes it over. Either goes first, and
		// either way the key ends up claimed by the Begin: a Release that
		// checked the token, then removed the record after the takeover,
		// would delete the new holder's claim.
		const rounds = 16
		for round := range rounds {
			k := e.key(fmt.Sprintf("release-race-%d", round))
			first := e.claim(k, "fp", e.at(0))
			now := e.at(lease)
			var releaseErr error
			var taker beginResult
			e.together(round%2 == 1, func() {
				releaseErr = e.s.Release(e.ctx, k, first.Token)
			}, func() {
				rec, ok, err := e.s.Begin(e.ctx, k, "fp", now, lease, retention)
				taker = beginResult{rec, ok, err}
			})
			if taker.err != nil {
				e.fatalf("round %d: Begin: unexpected error: %v", round, taker.err)
			}
			if releaseErr != nil && !errors.Is(releaseErr, idempotency.ErrLeaseLost) {
				e.fatalf("round %d: Release: unexpected error: %v", round, releaseErr)
			}
			if !taker.claimed || taker.rec.Token <= first.Token {
				e.fatalf("round %d: Begin past the lease = %+v, claimed %v; want a claim with a token larger than %d (Release: %v)",
					round, taker.rec, taker.claimed, first.Token, releaseErr)
			}
			got, err := e.s.Get(e.ctx, k, now)
			if err != nil {
				e.fatalf("round %d: Get after Release (%v) raced the takeover: %v; want the new claim (token %d)", round, releaseErr, err, taker.rec.Token)
			}
			e.wantState(fmt.Sprintf("round %d: Get after Release (%v) raced the takeover", round, releaseErr), got, idempotency.Processing, "fp", taker.rec.Token)
		}
	}},
	{"holder-races-delete", func(e *env) {
		// An operator deletes a key while its holder finishes (Complete or
		// Extend). Either goes first, and either way the key ends up
		// absent: a holder that checked its token, then wrote after the
		// Delete, would bring the deleted record back.
		const rounds = 16
		for round := range rounds {
			k := e.key(fmt.Sprintf("delete-race-%d", round))
			first := e.claim(k, "fp", e.at(0))
			now := e.at(1)
			extend := round%2 == 1
			var holderErr, deleteErr error
			e.together(round/2%2 == 1, func() {
				if extend {
					holderErr = e.s.Extend(e.ctx, k, first.Token, now, lease)
				} else {
					holderErr = e.s.Complete(e.ctx, k, first.Token, sampleResponse("holder"), now, retention)
				}
			}, func() {
				deleteErr = e.s.Delete(e.ctx, k)
			})
			if deleteErr != nil {
				e.fatalf("round %d: Delete: unexpected error: %v", round, deleteErr)
			}
			if holderErr != nil && !errors.Is(holderErr, idempotency.ErrLeaseLost) {
				e.fatalf("round %d: holder (extend=%v): unexpected error: %v", round, extend, holderErr)
			}
			if rec, err := e.s.Get(e.ctx, k, now); !errors.Is(err, idempotency.ErrNotFound) {
				e.fatalf("round %d: Get after the holder (extend=%v, err %v) raced Delete = %+v, %v; want ErrNotFound (the record was deleted)",
					round, extend, holderErr, rec, err)
			}
			e.wantLeaseLost(fmt.Sprintf("round %d: Complete by the deleted holder", round),
				e.s.Complete(e.ctx, k, first.Token, sampleResponse("holder"), now, retention))
		}
	}},
	{"tokens-in-claim-order", tokensInClaimOrder},
	{"distinct-keys-64", func(e *env) {
		keys := make([]string, racers)
		for i := range keys {
			keys[i] = e.key(fmt.Sprintf("parallel-%d", i))
		}
		errs := make([]error, racers)
		var wg sync.WaitGroup
		for i, k := range keys {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer panicked(func(err error) { errs[i] = err })
				rec, ok, err := e.s.Begin(e.ctx, k, "fp", e.at(0), lease, retention)
				switch {
				case err != nil:
					errs[i] = fmt.Errorf("Begin: %w", err)
				case !ok:
					errs[i] = fmt.Errorf("Begin of a fresh key did not claim: %+v", rec)
				default:
					errs[i] = e.s.Complete(e.ctx, k, rec.Token, sampleResponse(k), e.at(0), retention)
				}
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				e.fatalf("key %d: %v", i, err)
			}
		}
		for _, k := range keys {
			e.wantResponse("Get of "+k, e.get(k, e.at(1)).Response, sampleResponse(k))
		}
	}},
}
