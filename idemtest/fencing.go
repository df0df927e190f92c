package idemtest

import (
	"fmt"
	"time"

	"github.com/archlab/idempotency"
)

// wantLarger fails unless every token is larger than the one before.
func (e *env) wantLarger(how string, tokens []uint64) {
	e.t.Helper()
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			e.fatalf("tokens across %s: %v; want strictly increasing", how, tokens)
		}
	}
}

// takenOver returns a key whose first claim (returned first) was taken over
// by a second one.
func (e *env) takenOver(name string) (key string, stale, current idempotency.Record) {
	e.t.Helper()
	key = e.key(name)
	stale = e.claim(key, "fp", e.at(0))
	current = e.claim(key, "fp", e.at(lease))
	if current.Token <= stale.Token {
		e.fatalf("takeover token %d is not larger than %d", current.Token, stale.Token)
	}
	return key, stale, current
}

var fencingClauses = []clause{
	{"increase-across-takeover", func(e *env) {
		k := e.key("tokens-takeover")
		var tokens []uint64
		for i := range 5 {
			tokens = append(tokens, e.claim(k, "fp", e.at(time.Duration(i)*lease)).Token)
		}
		e.wantLarger("takeovers", tokens)
	}},
	{"increase-across-release", func(e *env) {
		// The clock does not move: the token must grow anyway.
		k := e.key("tokens-release")
		var tokens []uint64
		for i := range 5 {
			rec := e.claim(k, fmt.Sprintf("fp-%d", i), e.at(0))
			tokens = append(tokens, rec.Token)
			if err := e.s.Release(e.ctx, k, rec.Token); err != nil {
				e.fatalf("Release(token %d): unexpected error: %v", rec.Token, err)
			}
		}
		e.wantLarger("release and reclaim", tokens)
	}},
	{"increase-across-delete", func(e *env) {
		k := e.key("tokens-delete")
		var tokens []uint64
		for i := range 5 {
			rec := e.claim(k, "fp", e.at(0))
			tokens = append(tokens, rec.Token)
			if i%2 == 1 {
				e.complete(k, rec.Token, sampleResponse("x"), e.at(0))
			}
			if err := e.s.Delete(e.ctx, k); err != nil {
				e.fatalf("Delete: unexpected error: %v", err)
			}
		}
		e.wantLarger("delete and reclaim", tokens)
	}},
	{"increase-across-expiry", func(e *env) {
		k := e.key("tokens-expiry")
		var tokens []uint64
		now := e.at(0)
		for i := range 4 {
			if i%2 == 1 {
				// A store may collect the expired record when it is read;
				// the next claim's token must be larger all the same.
				e.wantNotFound(k, now)
			}
			rec := e.claim(k, "fp", now)
			tokens = append(tokens, rec.Token)
			if i%2 == 0 {
				e.complete(k, rec.Token, sampleResponse("x"), now)
			}
			now = now.Add(retention + lease) // past both the lease and the window
		}
		e.wantLarger("expiry and re-creation", tokens)
	}},
	{"increase-across-sweep", increaseAcrossSweep},
	{"stale-complete-rejected", func(e *env) {
		k, stale, cur := e.takenOver("stale-complete")
		now := e.at(lease + 1)
		e.wantLeaseLost("Complete with the taken-over token", e.s.Complete(e.ctx, k, stale.Token, sampleResponse("stale"), now, retention))
		before := e.get(k, now)
		e.wantState("record after the stale Complete", before, idempotency.Processing, "fp", cur.Token)
		// The winner completes; the stale holder still cannot overwrite it.
		e.complete(k, cur.Token, sampleResponse("winner"), now)
		e.wantLeaseLost("Complete with the taken-over token after the winner's", e.s.Complete(e.ctx, k, stale.Token, sampleResponse("stale"), now, retention))
		e.wantResponse("stored result", e.get(k, now).Response, sampleResponse("winner"))
	}},
	{"stale-extend-rejected", func(e *env) {
		k, stale, cur := e.takenOver("stale-extend")
		now := e.at(lease + lease/2)
		before := e.get(k, now)
		e.wantLeaseLost("Extend with the taken-over token", e.s.Extend(e.ctx, k, stale.Token, now, lease))
		e.unchanged(k, now, before)
		e.wantState("record after the stale Extend", before, idempotency.Processing, "fp", cur.Token)
	}},
	{"stale-release-rejected", func(e *env) {
		k, stale, _ := e.takenOver("stale-release")
		now := e.at(lease + 1)
		before := e.get(k, now)
		e.wantLeaseLost("Release with the taken-over token", e.s.Release(e.ctx, k, stale.Token))
		e.unchanged(k, now, before)
	}},
	{"unknown-token-rejected", func(e *env) {
		k := e.key("unknown-token")
		rec := e.claim(k, "fp", e.at(0))
		now := e.at(1)
		for _, tok := range []uint64{0, rec.Token + 1, rec.Token + 1<<40} {
			e.wantLeaseLost(fmt.Sprintf("Complete(token %d)", tok), e.s.Complete(e.ctx, k, tok, sampleResponse("x"), now, retention))
			e.wantLeaseLost(fmt.Sprintf("Extend(token %d)", tok), e.s.Extend(e.ctx, k, tok, now, lease))
			e.wantLeaseLost(fmt.Sprintf("Release(token %d)", tok), e.s.Release(e.ctx, k, tok))
		}
		e.unchanged(k, now, rec)
	}},
	{"done-not-processing-rejected", func(e *env) {
		k := e.key("done-token")
		rec := e.claim(k, "fp", e.at(0))
		e.complete(k, rec.Token, sampleResponse("first"), e.at(0))
		now := e.at(1)
		before := e.get(k, now)
		e.wantLeaseLost("a second Complete with the same token", e.s.Complete(e.ctx, k, rec.Token, sampleResponse("second"), now, retention))
		e.wantLeaseLost("Extend of a Done record", e.s.Extend(e.ctx, k, rec.Token, now, lease))
		e.wantLeaseLost("Release of a Done record", e.s.Release(e.ctx, k, rec.Token))
		e.unchanged(k, now, before)
	}},
	{"absent-key-rejected", func(e *env) {
		k := e.key("absent-token")
		now := e.at(0)
		e.wantLeaseLost("Complete of an absent key", e.s.Complete(e.ctx, k, 1, sampleResponse("x"), now, retention))
		e.wantLeaseLost("Extend of an absent key", e.s.Extend(e.ctx, k, 1, now, lease))
		e.wantLeaseLost("Release of an absent key", e.s.Release(e.ctx, k, 1))
		e.wantNotFound(k, now)
	}},
}
