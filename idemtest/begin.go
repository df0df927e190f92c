package idemtest

import (
	"strings"
	"time"

	"github.com/archlab/idempotency"
)

var beginClauses = []clause{
	{"absent-creates-claim", func(e *env) {
		k := e.key("new")
		now := e.at(0)
		rec := e.claim(k, "fp", now)
		e.wantState("claim", rec, idempotency.Processing, "fp", rec.Token)
		e.wantTime("LeaseUntil of a new claim", rec.LeaseUntil, now.Add(lease))
		e.wantTime("ExpiresAt of a new claim", rec.ExpiresAt, now.Add(retention))
		got := e.get(k, now)
		e.wantState("Get after the claim", got, idempotency.Processing, "fp", rec.Token)
	}},
	{"done-same-fingerprint-replays", func(e *env) {
		k := e.key("replay")
		rec := e.claim(k, "fp", e.at(0))
		want := sampleResponse("replay")
		e.complete(k, rec.Token, want, e.at(lease/2))
		got, ok := e.begin(k, "fp", e.at(lease))
		if ok {
			e.fatalf("Begin on a Done record claimed it (token %d), want a replay", got.Token)
		}
		if got.State != idempotency.Done || got.Fingerprint != "fp" {
			e.fatalf("Begin on a Done record: State %q, Fingerprint %q; want %q, %q", got.State, got.Fingerprint, idempotency.Done, "fp")
		}
		e.wantResponse("replayed record", got.Response, want)
		if !got.LeaseUntil.IsZero() {
			e.errorf("replayed record: LeaseUntil = %v, want zero for Done", got.LeaseUntil)
		}
		e.wantTime("replayed record ExpiresAt", got.ExpiresAt, e.at(lease/2+retention))
	}},
	{"processing-inside-lease-in-flight", func(e *env) {
		k := e.key("inflight")
		rec := e.claim(k, "fp", e.at(0))
		for _, d := range []time.Duration{0, lease / 2, lease - tolerance} {
			got, ok := e.begin(k, "fp", e.at(d))
			if ok {
				e.fatalf("Begin %v into a %v lease claimed the key (token %d), want in flight", d, lease, got.Token)
			}
			e.wantState("in-flight answer", got, idempotency.Processing, "fp", rec.Token)
			e.wantTime("in-flight LeaseUntil", got.LeaseUntil, rec.LeaseUntil)
		}
		e.unchanged(k, e.at(lease/2), rec)
	}},
	{"processing-past-lease-takes-over", func(e *env) {
		k := e.key("takeover")
		first := e.claim(k, "fp", e.at(0))
		now := e.at(lease) // now >= LeaseUntil: the holder is presumed dead
		second := e.claim(k, "fp", now)
		if second.Token <= first.Token {
			e.fatalf("takeover token %d is not larger than the previous %d", second.Token, first.Token)
		}
		e.wantTime("LeaseUntil after takeover", second.LeaseUntil, now.Add(lease))
		e.wantTime("ExpiresAt after takeover (kept)", second.ExpiresAt, first.ExpiresAt)
		got := e.get(k, now)
		e.wantState("Get after takeover", got, idempotency.Processing, "fp", second.Token)
	}},
	{"takeover-extends-window-to-lease", func(e *env) {
		k := e.key("takeover-window")
		short := 2 * lease // retention only twice the lease
		first, ok, err := e.s.Begin(e.ctx, k, "fp", e.at(0), lease, short)
		if err != nil || !ok {
			e.fatalf("Begin = %v, %v; want a claim", ok, err)
		}
		now := e.at(lease + lease/2)
		second, ok, err := e.s.Begin(e.ctx, k, "fp", now, lease, short)
		if err != nil || !ok {
			e.fatalf("Begin past the lease = %+v, %v, %v; want a takeover", second, ok, err)
		}
		if second.Token <= first.Token {
			e.fatalf("takeover token %d is not larger than %d", second.Token, first.Token)
		}
		if second.ExpiresAt.Before(second.LeaseUntil.Add(-tolerance)) {
			e.fatalf("after takeover ExpiresAt %v is before LeaseUntil %v; the window must cover the lease", second.ExpiresAt, second.LeaseUntil)
		}
		// Past the original window but inside the new lease: still in flight.
		later := e.at(2*lease + lease/4)
		got, ok, err := e.s.Begin(e.ctx, k, "fp", later, lease, short)
		if err != nil || ok {
			e.fatalf("Begin inside the taken-over lease but past the first window = %+v, %v, %v; want in flight", got, ok, err)
		}
		e.wantState("in-flight answer", got, idempotency.Processing, "fp", second.Token)
	}},
	{"expired-done-creates-claim", func(e *env) {
		// Once the window ends the key is new again, with any fingerprint,
		// the one of the stored result included: a replay of an expired
		// result is as wrong as a conflict with it.
		for _, fp := range []string{"other-fp", "fp"} {
			k := e.key("window-" + fp)
			first := e.claim(k, "fp", e.at(0))
			e.complete(k, first.Token, sampleResponse("old"), e.at(0))
			end := first.ExpiresAt // Complete at t0: ExpiresAt = t0+retention
			// Just inside the window: replay.
			if rec, ok := e.begin(k, "fp", end.Add(-tolerance)); ok || rec.State != idempotency.Done {
				e.fatalf("Begin just inside the window = %+v, claimed %v; want the Done record", rec, ok)
			}
			// At the end of the window (now >= ExpiresAt) the key is new.
			second := e.claim(k, fp, end)
			e.wantState("claim after the window", second, idempotency.Processing, fp, second.Token)
			if second.Token <= first.Token {
				e.fatalf("token after expiry %d is not larger than %d", second.Token, first.Token)
			}
			e.wantTime("LeaseUntil of the new claim", second.LeaseUntil, end.Add(lease))
			e.wantTime("ExpiresAt of the new claim", second.ExpiresAt, end.Add(retention))
			if got := e.get(k, end); len(got.Response.Body) != 0 || got.Response.Status != 0 {
				e.fatalf("the new claim still carries the old response %+v", got.Response)
			}
		}
	}},
	{"expired-processing-creates-claim", func(e *env) {
		// A claim whose window ended is gone, not a lease to take over:
		// the new claim opens a window of its own.
		for _, fp := range []string{"other-fp", "fp"} {
			k := e.key("window-processing-" + fp)
			first := e.claim(k, "fp", e.at(0))
			for _, now := range []time.Time{first.ExpiresAt, first.ExpiresAt.Add(3 * retention)} {
				second := e.claim(k, fp, now)
				if second.Token <= first.Token {
					e.fatalf("token after expiry %d is not larger than %d", second.Token, first.Token)
				}
				e.wantState("claim after the window", second, idempotency.Processing, fp, second.Token)
				e.wantTime("LeaseUntil of the claim after the window", second.LeaseUntil, now.Add(lease))
				e.wantTime("ExpiresAt of the claim after the window (a new window)", second.ExpiresAt, now.Add(retention))
				first = second
			}
		}
	}},
}

var conflictClauses = []clause{
	{"processing-in-lease", func(e *env) {
		k := e.key("conflict-processing")
		rec := e.claim(k, "fp-a", e.at(0))
		e.wantConflict(k, "fp-b", e.at(lease/2))
		e.unchanged(k, e.at(lease/2), rec)
	}},
	{"processing-past-lease", func(e *env) {
		k := e.key("conflict-expired-lease")
		rec := e.claim(k, "fp-a", e.at(0))
		e.wantConflict(k, "fp-b", e.at(2*lease))
		e.unchanged(k, e.at(2*lease), rec)
		// The same fingerprint may still take it over.
		if got := e.claim(k, "fp-a", e.at(2*lease)); got.Token <= rec.Token {
			e.fatalf("takeover token %d is not larger than %d", got.Token, rec.Token)
		}
	}},
	{"done", func(e *env) {
		k := e.key("conflict-done")
		rec := e.claim(k, "fp-a", e.at(0))
		e.complete(k, rec.Token, sampleResponse("a"), e.at(0))
		before := e.get(k, e.at(1))
		e.wantConflict(k, "fp-b", e.at(lease))
		e.unchanged(k, e.at(lease), before)
	}},
	{"fingerprint-exact", fingerprintExact},
	{"fingerprint-bytes", fingerprintBytes},
}

// longFingerprint is longer than a SHA-256 in hex (64 bytes) and mixes
// case, so that a store comparing a prefix or folding case shows it.
var longFingerprint = "sha256:" + strings.Repeat("aB", 40) + "-end"

// fingerprintExact checks that fingerprints are compared as bytes, whole:
// any other byte string conflicts.
func fingerprintExact(e *env) {
	k := e.key("conflict-exact")
	fp := longFingerprint
	rec := e.claim(k, fp, e.at(0))
	e.wantState("Get of a long fingerprint", e.get(k, e.at(0)), idempotency.Processing, fp, rec.Token)
	others := []string{fp[:64], fp[:len(fp)-1], fp + "\x00", fp + " ", strings.ToLower(fp), strings.ToUpper(fp)}
	for _, other := range others {
		e.wantConflict(k, other, e.at(lease/2))
	}
	e.complete(k, rec.Token, sampleResponse("exact"), e.at(1))
	for _, other := range others {
		e.wantConflict(k, other, e.at(2))
	}
	replay, ok := e.begin(k, fp, e.at(2))
	if ok || replay.State != idempotency.Done {
		e.fatalf("Begin with the same long fingerprint: State %q, claimed %v; want a replay", replay.State, ok)
	}
	e.wantState("replay of a long fingerprint", replay, idempotency.Done, fp, rec.Token)
}

// fingerprintBytes checks that fingerprints are byte strings: NUL bytes
// and invalid UTF-8 are kept, in Get and replays, and compared whole (a
// C string would end at the NUL, a text column replace the invalid bytes).
func fingerprintBytes(e *env) {
	k := e.key("conflict-bytes")
	fp := "fp\x00\xff\xfe-\xc3\x28\x00end"
	rec := e.claim(k, fp, e.at(0))
	if got := e.get(k, e.at(0)); got.Fingerprint != fp {
		e.fatalf("Get: Fingerprint %q, want %q (the bytes given to Begin)", got.Fingerprint, fp)
	}
	others := []string{"fp", "fp\x00", "fp\x00\xff\xfd-\xc3\x28\x00end", "fp\x00\xfe\xff-\xc3\x28\x00end", "fp\x00\xff\xfe-\xc3\x28\x00"}
	for _, other := range others {
		e.wantConflict(k, other, e.at(1))
	}
	e.complete(k, rec.Token, sampleResponse("bytes"), e.at(1))
	for _, other := range others {
		e.wantConflict(k, other, e.at(2))
	}
	replay, ok := e.begin(k, fp, e.at(2))
	if ok || replay.State != idempotency.Done {
		e.fatalf("Begin with the same fingerprint: State %q, claimed %v; want a replay", replay.State, ok)
	}
	e.wantState("replay of a binary fingerprint", replay, idempotency.Done, fp, rec.Token)
}

func (e *env) wantConflict(key, fp string, now time.Time) {
	e.t.Helper()
	rec, ok := e.begin(key, fp, now)
	if ok || rec.State != idempotency.Conflict {
		e.fatalf("Begin(%q) with another fingerprint = %+v, claimed %v; want State %q and false", key, fp, rec, ok, idempotency.Conflict)
	}
}
