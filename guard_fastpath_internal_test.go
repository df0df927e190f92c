package idempotency

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"testing/synctest"
	"time"
)

// hidden hides the MemoryStore's type from the Guard, which then takes the
// path every other store takes (Store.Begin and a Record).
type hidden struct{ Store }

// TestMemoryFastPathMatchesBegin: a Guard answers the same through the
// MemoryStore's fast path as through Store.Begin, in every state a key can be
// in. Each step runs on two keys of one store, one per path, so both see the
// same history; tokens differ between the keys and are compared by change.
func TestMemoryFastPathMatchesBegin(t *testing.T) {
	s, err := NewMemoryStoreWith(&MemoryOptions{MaxRecords: 4})
	if err != nil {
		t.Fatal(err)
	}
	clock := time.Date(2026, 12, 3, 1, 0, 0, 0, time.UTC)
	now := func() time.Time { return clock }
	fast := &Guard{Store: s, Lease: 10 * time.Second, Retention: time.Minute, Now: now, RenewEvery: -1}
	slow := &Guard{Store: hidden{s}, Lease: 10 * time.Second, Retention: time.Minute, Now: now, RenewEvery: -1}
	if _, ok := fast.Store.(*MemoryStore); !ok {
		t.Fatal("fast path not taken")
	}
	resp := Response{Status: 201, Body: []byte("charged"), Header: map[string][]string{"Content-Type": {"text/plain"}}}
	ok := func(context.Context) (Response, error) { return resp, nil }
	fail := func(context.Context) (Response, error) { return Response{Status: 500}, errors.New("boom") }
	retry := func(context.Context) (Response, error) { return Response{}, Retryable(errors.New("not yet")) }
	var inner func(string) (Result, error)
	nested := func(ctx context.Context) (Response, error) {
		// While this holds the key, the same key is in flight.
		r, err := inner("fp")
		if r.Outcome != InFlight || !errors.Is(err, ErrInFlight) {
			return Response{}, fmt.Errorf("nested call: %v %v", r.Outcome, err)
		}
		return resp, nil
	}

	type step struct {
		name    string
		advance time.Duration
		fp      string
		fn      func(context.Context) (Response, error)
	}
	steps := []step{
		{"new key", 0, "fp", fail},           // executed, fn error: the claim stays
		{"in flight", time.Second, "fp", ok}, // inside the lease
		{"conflict while processing", 0, "other", ok},
		{"takeover", 10 * time.Second, "fp", nested},
		{"replay", time.Second, "fp", ok},
		{"conflict while done", 0, "other", ok},
		{"expired: new claim", 2 * time.Minute, "fp", retry}, // released at once
		{"after release", 0, "fp", ok},
		{"replay again", time.Second, "fp", ok},
	}
	prevToken := map[string]uint64{}
	for i, st := range steps {
		clock = clock.Add(st.advance)
		var got [2]Result
		var errs [2]error
		for j, g := range []*Guard{fast, slow} {
			key := []string{"fast", "slow"}[j]
			inner = func(fp string) (Result, error) { return g.Run(context.Background(), key, fp, ok) }
			got[j], errs[j] = g.Run(context.Background(), key, st.fp, st.fn)
		}
		if (errs[0] == nil) != (errs[1] == nil) || (errs[0] != nil && errs[0].Error() != errs[1].Error()) {
			t.Fatalf("step %d (%s): errors differ: fast %v, slow %v", i, st.name, errs[0], errs[1])
		}
		tokens := [2]uint64{got[0].Token, got[1].Token}
		for j, key := range []string{"fast", "slow"} {
			if tokens[j] != 0 && tokens[j] <= prevToken[key] {
				t.Fatalf("step %d (%s): %s token %d not above %d", i, st.name, key, tokens[j], prevToken[key])
			}
			if tokens[j] != 0 {
				prevToken[key] = tokens[j]
			}
			got[j].Token = 0
		}
		if (tokens[0] == 0) != (tokens[1] == 0) {
			t.Fatalf("step %d (%s): one path claimed, one did not: tokens %v", i, st.name, tokens)
		}
		if !reflect.DeepEqual(got[0], got[1]) {
			t.Fatalf("step %d (%s): results differ:\nfast %+v\nslow %+v", i, st.name, got[0], got[1])
		}
		t.Logf("step %d (%s): %s %v", i, st.name, got[0].Outcome, errs[0])
	}

	// A full store: both paths fail closed alike.
	for _, k := range []string{"a", "b"} {
		if _, err := fast.Run(context.Background(), k, "fp", ok); err != nil {
			t.Fatal(err)
		}
	}
	rf, ef := fast.Run(context.Background(), "full-fast", "fp", ok)
	rs, es := slow.Run(context.Background(), "full-slow", "fp", ok)
	if rf.Outcome != Unavailable || rs.Outcome != Unavailable || !errors.Is(ef, ErrUnavailable) || !errors.Is(es, ErrUnavailable) {
		t.Fatalf("full store: fast %v %v, slow %v %v", rf.Outcome, ef, rs.Outcome, es)
	}

	// A replayed body and header are the caller's own.
	r, err := fast.Run(context.Background(), "fast", "fp", ok)
	if err != nil || r.Outcome != Replayed {
		t.Fatal(r.Outcome, err)
	}
	r.Response.Body[0] = 'X'
	r.Response.Header["Content-Type"][0] = "changed"
	r, _ = fast.Run(context.Background(), "fast", "fp", ok)
	if string(r.Response.Body) != "charged" || r.Response.Header["Content-Type"][0] != "text/plain" {
		t.Fatalf("a caller's change reached the store: %q %v", r.Response.Body, r.Response.Header)
	}
}

// TestLocalClock: a Guard without Now reads the wall clock through an
// anchor that is renewed, so a stale or wrong anchor is not used for long.
func TestLocalClock(t *testing.T) {
	within := func(t *testing.T, got time.Time, slack time.Duration) {
		t.Helper()
		if d := time.Since(got); d < -slack || d > slack {
			t.Fatalf("local clock %v is %v from time.Now", got, d)
		}
	}
	a, d := localClock()
	within(t, a.t.Add(d), 50*time.Millisecond)
	if got, want := a.unix+int64(d), a.t.Add(d).UnixNano(); got != want {
		t.Fatalf("unix reading %d, want %d", got, want)
	}

	// An anchor older than anchorFor whose Unix reading is 5 s off: it must
	// be replaced, not followed.
	old := time.Now().Add(-2 * anchorFor)
	anchor.Store(&clockAnchor{t: old, unix: old.UnixNano() + 5e9})
	a, d = localClock()
	within(t, time.Unix(0, a.unix+int64(d)), 50*time.Millisecond)
	within(t, (&Guard{}).now(), 50*time.Millisecond)

	// Inside a synctest bubble the reading is the bubble's time exactly,
	// whichever anchor was left by code outside.
	synctest.Test(t, func(t *testing.T) {
		for range 3 {
			a, d := localClock()
			if got, want := a.t.Add(d), time.Now(); !got.Equal(want) || a.unix+int64(d) != want.UnixNano() {
				t.Fatalf("in a bubble: %v, want %v", got, want)
			}
			time.Sleep(300 * time.Millisecond)
		}
	})
	within(t, (&Guard{}).now(), 50*time.Millisecond)
}
