package idemtest

import (
	"strings"
	"unicode/utf8"

	"github.com/archlab/idempotency"
)

var completeClauses = []clause{
	{"stores-result", func(e *env) {
		k := e.key("complete")
		rec := e.claim(k, "fp", e.at(0))
		now := e.at(lease / 2)
		e.complete(k, rec.Token, sampleResponse("stored"), now)
		got := e.get(k, now)
		e.wantState("Get after Complete", got, idempotency.Done, "fp", rec.Token)
		e.wantResponse("Get after Complete", got.Response, sampleResponse("stored"))
		if !got.LeaseUntil.IsZero() {
			e.errorf("Get after Complete: LeaseUntil = %v, want zero for Done", got.LeaseUntil)
		}
		e.wantTime("ExpiresAt after Complete (now+retention)", got.ExpiresAt, now.Add(retention))
	}},
	{"after-lease-without-takeover", func(e *env) {
		// The token decides, not the clock.
		k := e.key("complete-late")
		rec := e.claim(k, "fp", e.at(0))
		now := e.at(3 * lease)
		e.complete(k, rec.Token, sampleResponse("late"), now)
		got := e.get(k, now)
		e.wantState("Get after a late Complete", got, idempotency.Done, "fp", rec.Token)
		e.wantResponse("Get after a late Complete", got.Response, sampleResponse("late"))
		e.wantTime("ExpiresAt after a late Complete", got.ExpiresAt, now.Add(retention))
	}},
	{"uses-its-retention", func(e *env) {
		// ExpiresAt becomes now + the retention Complete is given, longer
		// or shorter than the window Begin opened.
		now := e.at(lease)
		long := e.key("complete-longer")
		rec := e.claim(long, "fp", e.at(0))
		if err := e.s.Complete(e.ctx, long, rec.Token, sampleResponse("long"), now, 2*retention); err != nil {
			e.fatalf("Complete with retention %v: unexpected error: %v", 2*retention, err)
		}
		e.wantTime("ExpiresAt after Complete with twice the retention", e.get(long, now).ExpiresAt, now.Add(2*retention))
		past := rec.ExpiresAt.Add(lease) // past the window Begin opened
		if got, ok := e.begin(long, "fp", past); ok || got.State != idempotency.Done {
			e.fatalf("Begin past Begin's window, inside Complete's = %+v, claimed %v; want the Done record", got, ok)
		}
		if next := e.claim(long, "other", now.Add(2*retention)); next.Token <= rec.Token {
			e.fatalf("token after Complete's window %d is not larger than %d", next.Token, rec.Token)
		}

		short := e.key("complete-shorter")
		rec = e.claim(short, "fp", e.at(0))
		if err := e.s.Complete(e.ctx, short, rec.Token, sampleResponse("short"), now, 2*lease); err != nil {
			e.fatalf("Complete with retention %v: unexpected error: %v", 2*lease, err)
		}
		e.wantTime("ExpiresAt after Complete with a short retention", e.get(short, now).ExpiresAt, now.Add(2*lease))
		e.wantNotFound(short, now.Add(2*lease))
		if next := e.claim(short, "other", now.Add(2*lease)); next.Token <= rec.Token {
			e.fatalf("token after Complete's window %d is not larger than %d", next.Token, rec.Token)
		}
	}},
}

var extendClauses = []clause{
	{"moves-lease", func(e *env) {
		k := e.key("extend")
		rec := e.claim(k, "fp", e.at(0))
		now := e.at(lease / 2)
		if err := e.s.Extend(e.ctx, k, rec.Token, now, lease); err != nil {
			e.fatalf("Extend: unexpected error: %v", err)
		}
		got := e.get(k, now)
		e.wantState("Get after Extend", got, idempotency.Processing, "fp", rec.Token)
		e.wantTime("LeaseUntil after Extend (now+lease)", got.LeaseUntil, now.Add(lease))
		// Between the old and the new end of the lease: still in flight.
		between := e.at(lease + lease/4)
		ans, ok := e.begin(k, "fp", between)
		if ok {
			e.fatalf("Begin between the old and the extended end of the lease claimed the key (token %d), want in flight", ans.Token)
		}
		e.wantState("in-flight answer", ans, idempotency.Processing, "fp", rec.Token)
		// After the new end: taken over.
		if next := e.claim(k, "fp", now.Add(lease)); next.Token <= rec.Token {
			e.fatalf("takeover token %d is not larger than %d", next.Token, rec.Token)
		}
	}},
	{"extends-window-to-lease", func(e *env) {
		k := e.key("extend-window")
		rec, ok, err := e.s.Begin(e.ctx, k, "fp", e.at(0), lease, lease)
		if err != nil || !ok {
			e.fatalf("Begin with retention = lease: %v, %v; want a claim", ok, err)
		}
		now := e.at(lease / 2)
		if err := e.s.Extend(e.ctx, k, rec.Token, now, lease); err != nil {
			e.fatalf("Extend: unexpected error: %v", err)
		}
		// Past the first window, inside the renewed lease: the record lives.
		past := e.at(lease + lease/4)
		got := e.get(k, past)
		if got.ExpiresAt.Before(got.LeaseUntil.Add(-tolerance)) {
			e.fatalf("after Extend ExpiresAt %v is before LeaseUntil %v; the window must cover the lease", got.ExpiresAt, got.LeaseUntil)
		}
		ans, ok := e.begin(k, "fp", past)
		if ok {
			e.fatalf("Begin inside the renewed lease, past the first window, claimed the key; want in flight")
		}
		e.wantState("in-flight answer", ans, idempotency.Processing, "fp", rec.Token)
	}},
	{"keeps-window", func(e *env) {
		// ExpiresAt only grows to cover the lease; a renewal never shortens
		// the dedup window Begin opened.
		k := e.key("extend-keeps-window")
		rec := e.claim(k, "fp", e.at(0))
		now := e.at(lease / 2)
		if err := e.s.Extend(e.ctx, k, rec.Token, now, lease); err != nil {
			e.fatalf("Extend: unexpected error: %v", err)
		}
		e.wantTime("ExpiresAt after Extend (kept)", e.get(k, now).ExpiresAt, rec.ExpiresAt)
		// Past the renewed lease, inside the window: the record is still
		// there, so another fingerprint conflicts.
		e.wantConflict(k, "other", now.Add(2*lease))
	}},
	{"uses-its-lease", func(e *env) {
		// LeaseUntil becomes now + the lease Extend is given, not the one
		// Begin was given.
		k := e.key("extend-longer")
		rec := e.claim(k, "fp", e.at(0))
		now := e.at(lease / 2)
		if err := e.s.Extend(e.ctx, k, rec.Token, now, 3*lease); err != nil {
			e.fatalf("Extend by %v: unexpected error: %v", 3*lease, err)
		}
		e.wantTime("LeaseUntil after Extend by three leases", e.get(k, now).LeaseUntil, now.Add(3*lease))
		if ans, ok := e.begin(k, "fp", now.Add(2*lease)); ok {
			e.fatalf("Begin inside the longer renewed lease claimed the key (token %d); want in flight", ans.Token)
		}
		if next := e.claim(k, "fp", now.Add(3*lease)); next.Token <= rec.Token {
			e.fatalf("takeover token %d is not larger than %d", next.Token, rec.Token)
		}
	}},
	{"after-lease-without-takeover", func(e *env) {
		k := e.key("extend-late")
		rec := e.claim(k, "fp", e.at(0))
		now := e.at(2 * lease)
		if err := e.s.Extend(e.ctx, k, rec.Token, now, lease); err != nil {
			e.fatalf("Extend after the lease ran out, nobody took over: %v; want success (the token decides)", err)
		}
		e.wantTime("LeaseUntil after a late Extend", e.get(k, now).LeaseUntil, now.Add(lease))
		if ans, ok := e.begin(k, "fp", now.Add(lease/2)); ok {
			e.fatalf("Begin inside the renewed lease claimed the key (token %d); want in flight", ans.Token)
		}
	}},
}

var releaseClauses = []clause{
	{"removes-claim", func(e *env) {
		k := e.key("release")
		rec := e.claim(k, "fp-a", e.at(0))
		if err := e.s.Release(e.ctx, k, rec.Token); err != nil {
			e.fatalf("Release: unexpected error: %v", err)
		}
		e.wantNotFound(k, e.at(0))
		// At once, with any fingerprint.
		next := e.claim(k, "fp-b", e.at(0))
		e.wantState("claim after Release", next, idempotency.Processing, "fp-b", next.Token)
		if next.Token <= rec.Token {
			e.fatalf("token after Release %d is not larger than %d", next.Token, rec.Token)
		}
		e.wantLeaseLost("a second Release with the old token", e.s.Release(e.ctx, k, rec.Token))
	}},
	{"after-lease-without-takeover", func(e *env) {
		// The token decides, not a clock: a claim whose lease ran out (by
		// the suite's times and by the wall clock) and that nobody took
		// over can still be released.
		k := e.key("release-late")
		rec := e.claim(k, "fp-a", e.at(-3*lease))
		if err := e.s.Release(e.ctx, k, rec.Token); err != nil {
			e.fatalf("Release after the lease ran out, nobody took over: %v; want success (the token decides)", err)
		}
		e.wantNotFound(k, e.at(0))
		if next := e.claim(k, "fp-b", e.at(0)); next.Token <= rec.Token {
			e.fatalf("token after Release %d is not larger than %d", next.Token, rec.Token)
		}
	}},
	{"fences-holder", func(e *env) {
		// A released claim is gone: its token names nothing from then on,
		// neither while the key is absent (a tombstone that keeps the
		// token must not take a result for it) nor once it is claimed
		// again.
		k := e.key("release-fences")
		rec := e.claim(k, "fp", e.at(0))
		if err := e.s.Release(e.ctx, k, rec.Token); err != nil {
			e.fatalf("Release: unexpected error: %v", err)
		}
		now := e.at(1)
		e.wantLeaseLost("Complete by the released holder", e.s.Complete(e.ctx, k, rec.Token, sampleResponse("released"), now, retention))
		e.wantLeaseLost("Extend by the released holder", e.s.Extend(e.ctx, k, rec.Token, now, lease))
		e.wantNotFound(k, now)
		next := e.claim(k, "fp", now)
		if next.Token <= rec.Token {
			e.fatalf("token after Release %d is not larger than %d", next.Token, rec.Token)
		}
		e.wantLeaseLost("Complete by the released holder after a new claim", e.s.Complete(e.ctx, k, rec.Token, sampleResponse("released"), now, retention))
		e.wantLeaseLost("Extend by the released holder after a new claim", e.s.Extend(e.ctx, k, rec.Token, now, lease))
		e.unchanged(k, now, next)
	}},
}

var getClauses = []clause{
	{"absent-not-found", func(e *env) {
		e.wantNotFound(e.key("absent"), e.at(0))
	}},
	{"expired-not-found", func(e *env) {
		done := e.key("get-expired-done")
		rec := e.claim(done, "fp", e.at(0))
		e.complete(done, rec.Token, sampleResponse("x"), e.at(0))
		e.get(done, e.at(retention-tolerance))
		e.wantNotFound(done, e.at(retention))

		proc := e.key("get-expired-processing")
		e.claim(proc, "fp", e.at(0))
		e.get(proc, e.at(retention-tolerance))
		e.wantNotFound(proc, e.at(retention))
	}},
	{"processing", func(e *env) {
		k := e.key("get-processing")
		rec := e.claim(k, "fp", e.at(0))
		got := e.get(k, e.at(lease/2))
		e.wantState("Get", got, idempotency.Processing, "fp", rec.Token)
		e.wantTime("Get LeaseUntil", got.LeaseUntil, rec.LeaseUntil)
		e.wantTime("Get ExpiresAt", got.ExpiresAt, rec.ExpiresAt)
		// Get judges nothing but liveness: past the lease it still answers.
		e.wantState("Get past the lease", e.get(k, e.at(2*lease)), idempotency.Processing, "fp", rec.Token)
	}},
	{"done", func(e *env) {
		k := e.key("get-done")
		rec := e.claim(k, "fp", e.at(0))
		e.complete(k, rec.Token, sampleResponse("done"), e.at(1))
		got := e.get(k, e.at(2))
		e.wantState("Get", got, idempotency.Done, "fp", rec.Token)
		e.wantResponse("Get", got.Response, sampleResponse("done"))
	}},
}

var deleteClauses = []clause{
	{"absent-ok", func(e *env) {
		if err := e.s.Delete(e.ctx, e.key("delete-absent")); err != nil {
			e.fatalf("Delete of an absent key = %v, want nil", err)
		}
	}},
	{"processing-fences-holder", func(e *env) {
		k := e.key("delete-processing")
		rec := e.claim(k, "fp", e.at(0))
		if err := e.s.Delete(e.ctx, k); err != nil {
			e.fatalf("Delete: unexpected error: %v", err)
		}
		now := e.at(1)
		e.wantNotFound(k, now)
		e.wantLeaseLost("Extend by the deleted holder", e.s.Extend(e.ctx, k, rec.Token, now, lease))
		e.wantLeaseLost("Complete by the deleted holder", e.s.Complete(e.ctx, k, rec.Token, sampleResponse("x"), now, retention))
		e.wantLeaseLost("Release by the deleted holder", e.s.Release(e.ctx, k, rec.Token))
		e.wantNotFound(k, now)
		// A new claim after the deletion fences the old holder too.
		next := e.claim(k, "other", now)
		e.wantLeaseLost("Complete by the deleted holder after a new claim", e.s.Complete(e.ctx, k, rec.Token, sampleResponse("x"), now, retention))
		e.wantState("record of the new claim", e.get(k, now), idempotency.Processing, "other", next.Token)
	}},
	{"done-forgets-result", func(e *env) {
		k := e.key("delete-done")
		rec := e.claim(k, "fp", e.at(0))
		e.complete(k, rec.Token, sampleResponse("x"), e.at(0))
		if err := e.s.Delete(e.ctx, k); err != nil {
			e.fatalf("Delete: unexpected error: %v", err)
		}
		e.wantNotFound(k, e.at(1))
		next := e.claim(k, "fp", e.at(1))
		if next.Token <= rec.Token {
			e.fatalf("token after Delete %d is not larger than %d", next.Token, rec.Token)
		}
		if got := e.get(k, e.at(1)); got.State != idempotency.Processing || len(got.Response.Body) != 0 || got.Response.Status != 0 || len(got.Response.Header) != 0 {
			e.fatalf("the claim after Delete: State %q, Response %+v; want %q with no response (the deleted result is forgotten)",
				got.State, got.Response, idempotency.Processing)
		}
		if err := e.s.Delete(e.ctx, k); err != nil {
			e.fatalf("Delete again: unexpected error: %v", err)
		}
		if err := e.s.Delete(e.ctx, k); err != nil {
			e.fatalf("Delete of a deleted key = %v, want nil", err)
		}
	}},
}

var copyClauses = []clause{
	{"returned-records", func(e *env) {
		k := e.key("copies-returned")
		rec := e.claim(k, "fp", e.at(0))
		e.complete(k, rec.Token, sampleResponse("orig"), e.at(0))
		scribble := func(r idempotency.Record) {
			r.Response.Body[0] = 'X'
			r.Response.Header["Content-Type"][0] = "text/evil"
			r.Response.Header["X-Added"] = []string{"1"}
		}
		got := e.get(k, e.at(1))
		scribble(got)
		e.wantResponse("Get after mutating a record Get returned", e.get(k, e.at(1)).Response, sampleResponse("orig"))
		replay, _ := e.begin(k, "fp", e.at(1))
		if replay.State != idempotency.Done {
			e.fatalf("Begin: State %q, want %q", replay.State, idempotency.Done)
		}
		scribble(replay)
		replay2, _ := e.begin(k, "fp", e.at(1))
		e.wantResponse("Begin after mutating a record Begin returned", replay2.Response, sampleResponse("orig"))
	}},
	{"conflict-answer", func(e *env) {
		// A Conflict answer is the caller's too, whatever it carries.
		k := e.key("copies-conflict")
		rec := e.claim(k, "fp", e.at(0))
		e.complete(k, rec.Token, sampleResponse("orig"), e.at(0))
		ans, ok := e.begin(k, "other", e.at(1))
		if ok || ans.State != idempotency.Conflict {
			e.fatalf("Begin with another fingerprint = %+v, claimed %v; want State %q", ans, ok, idempotency.Conflict)
		}
		if len(ans.Response.Body) > 0 {
			ans.Response.Body[0] = 'X'
		}
		for _, v := range ans.Response.Header {
			if len(v) > 0 {
				v[0] = "text/evil"
			}
		}
		if ans.Response.Header != nil {
			ans.Response.Header["X-Added"] = []string{"1"}
		}
		replay, _ := e.begin(k, "fp", e.at(1))
		e.wantResponse("replay after mutating a Conflict answer", replay.Response, sampleResponse("orig"))
	}},
	{"complete-argument", func(e *env) {
		k := e.key("copies-argument")
		rec := e.claim(k, "fp", e.at(0))
		resp := sampleResponse("orig")
		e.complete(k, rec.Token, resp, e.at(0))
		resp.Body[0] = 'X'
		resp.Header["Content-Type"][0] = "text/evil"
		resp.Header["X-Added"] = []string{"1"}
		e.wantResponse("Get after mutating the Response given to Complete", e.get(k, e.at(1)).Response, sampleResponse("orig"))
	}},
}

var bodyClauses = []clause{
	{"large-1MiB", func(e *env) {
		body := make([]byte, 1<<20)
		for i := range body {
			body[i] = byte(i*7 + i>>8)
		}
		e.roundTrip(e.key("large"), idempotency.Response{Status: 200, Body: body})
	}},
	{"binary", func(e *env) {
		body := make([]byte, 0, 512)
		for i := range 512 {
			body = append(body, byte(i))
		}
		e.roundTrip(e.key("binary"), idempotency.Response{Status: 200, Body: body,
			Header: map[string][]string{"X-Bin": {"\x00\xff", ""}, "Empty": {}}})
	}},
	{"empty", func(e *env) {
		e.roundTrip(e.key("empty"), idempotency.Response{Status: 204})
	}},
	{"zero-response", func(e *env) {
		// A result with nothing in it (Status 0, no header, no body) is a
		// result all the same: the record is Done and replays it, though
		// an engine may see nothing to write.
		k := e.key("zero")
		e.roundTrip(k, idempotency.Response{})
		e.wantState("Get after completing with a zero Response", e.get(k, e.at(1)), idempotency.Done, "fp", e.get(k, e.at(1)).Token)
	}},
	{"many-headers", func(e *env) {
		h := map[string][]string{}
		for i := range 50 {
			h["X-H"+string(rune('A'+i%26))+string(rune('a'+i/26))] = []string{"v1", "v2", "v3"}
		}
		e.roundTrip(e.key("headers"), idempotency.Response{Status: 500, Header: h, Body: []byte("x")})
	}},
}

// roundTrip completes a claim of key with resp and checks Get and a replay.
func (e *env) roundTrip(key string, resp idempotency.Response) {
	e.t.Helper()
	rec := e.claim(key, "fp", e.at(0))
	e.complete(key, rec.Token, resp, e.at(0))
	e.wantResponse("Get", e.get(key, e.at(1)).Response, resp)
	replay, ok := e.begin(key, "fp", e.at(1))
	if ok || replay.State != idempotency.Done {
		e.fatalf("Begin after Complete: State %q, claimed %v; want a replay", replay.State, ok)
	}
	e.wantResponse("replay", replay.Response, resp)
}

var keyClauses = []clause{
	{"unicode", func(e *env) { e.oddKey(e.key("ключ-鍵-🔑")) }},
	{"spaces", func(e *env) { e.oddKey(e.key(" a key with\tspaces\n ")) }},
	{"punctuation", func(e *env) { e.oddKey(e.key(`a:b{c}[d]*?%_\'"/`)) }},
	{"255-bytes", func(e *env) {
		k := e.key("")
		for len(k) < 255 {
			k += "k"
		}
		e.oddKey(k)
	}},
	{"invalid-utf8", func(e *env) {
		// Keys are bytes, not text: invalid UTF-8 is neither replaced nor
		// refused (a text column would do either). The key ends in two
		// invalid bytes, so the prefix oddKey tries differs from it only
		// in them.
		e.oddKey(e.key("bytes-\xff\xc3\x28-\xfe\xff"))
	}},
	{"case", func(e *env) {
		// Keys are bytes: no case-insensitive collation, no padding.
		e.oddKey(e.key("Mixed-Case-Key"))
	}},
	{"nul-byte", func(e *env) {
		// Adapters build keys as scope + "\x00" + key.
		e.oddKey(e.key("scope\x00key"))
	}},
	{"scoped-320-bytes", func(e *env) {
		// The longest key adapters store: a scope (64 bytes, a SHA-256 in
		// hex; idemhttp's DefaultScope is 37), NUL, and an Idempotency-Key
		// of 255 bytes, the most idemhttp and idemgrpc accept.
		scope := e.key("scope")
		for len(scope) < 64 {
			scope += "s"
		}
		e.oddKey(scope + "\x00" + strings.Repeat("k", 255))
	}},
}

// oddKey checks that key is a key of its own: it round-trips, and neither a
// prefix, an extension (by a letter or a space), nor a change of case of it
// names the same record.
func (e *env) oddKey(key string) {
	e.t.Helper()
	rec := e.claim(key, "fp", e.at(0))
	others := []string{key[:len(key)-1], key + "x", key + " "}
	for _, other := range []string{strings.ToUpper(key), strings.ToLower(key)} {
		if other != key && utf8.ValidString(key) {
			others = append(others, other)
		}
	}
	for _, other := range others {
		// key is claimed with "fp": if other named the same record, its
		// Begin would answer Conflict. (Tokens cannot tell keys apart:
		// they need only increase per key.)
		if o, ok := e.begin(other, "other", e.at(0)); !ok {
			e.fatalf("Begin(%q) = %+v, claimed false; want a claim: keys %q and %q must name records of their own",
				shorten(other), o, shorten(key), shorten(other))
		}
	}
	e.complete(key, rec.Token, sampleResponse("odd"), e.at(0))
	replay, ok := e.begin(key, "fp", e.at(1))
	if ok || replay.State != idempotency.Done {
		e.fatalf("Begin of %q after Complete: State %q, claimed %v; want a replay", shorten(key), replay.State, ok)
	}
	e.wantResponse("replay of an odd key", replay.Response, sampleResponse("odd"))
	if err := e.s.Delete(e.ctx, key); err != nil {
		e.fatalf("Delete(%q): %v", shorten(key), err)
	}
	e.wantNotFound(key, e.at(1))
	e.wantState("the longer key after deleting the odd one", e.get(key+"x", e.at(1)), idempotency.Processing, "other", e.get(key+"x", e.at(1)).Token)
}
