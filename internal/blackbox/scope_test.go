package blackbox

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// crossCaller is what a server does with a request on a key that another
// caller used first.
type crossCaller int

const (
	// runSeparately scopes keys per caller: the request is a new one.
	runSeparately crossCaller = iota
	// refuse422 and refuse409 keep one record per key and refuse another
	// caller's reuse of it: safe, nothing runs and nothing is shared.
	refuse422
	refuse409
	// refuseThenReplay refuses another caller's first request on the key,
	// then replays the first caller's answer to its retries: a leak.
	refuseThenReplay
	// replayFirst keeps one record per key and replays the first caller's
	// answer to anyone who sends the key with the same body: a leak.
	replayFirst
	// inFlightThenReplay keeps one record per key, answers another
	// caller 409 (in flight) on its first requests, then replays the
	// first caller's answer to it: a leak, only later.
	inFlightThenReplay
	// refuseCaller409 answers every request of the second caller 409,
	// whatever the key, fresh ones too: its 409s say nothing of scope.
	refuseCaller409
)

// inFlightAnswers is how many of another caller's requests on a key
// inFlightThenReplay answers 409 before it replays.
const inFlightAnswers = 3

// scopeServer is an idempotent orders server, correct for one caller (keys
// parsed per the draft, claimed and run under one lock, replays marked,
// another body answered 422), whose treatment of a second caller is cross.
type scopeServer struct {
	cross crossCaller

	ops       orders
	strangers atomic.Int64 // requests on a key another caller used first

	mu      sync.Mutex
	records map[string]*scopeRecord
}

type scopeRecord struct {
	owner       string
	fingerprint [32]byte
	body        []byte
	strangers   int
}

func newScopeServer(cross crossCaller) *scopeServer {
	return &scopeServer{cross: cross, records: map[string]*scopeRecord{}}
}

func (s *scopeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, key, fp, body, ok := toyRequest(w, r)
	if !ok {
		return
	}
	caller := r.Header.Get("Authorization")
	if s.cross == refuseCaller409 && caller == twoCallers[1].Get("Authorization") {
		s.strangers.Add(1)
		w.WriteHeader(http.StatusConflict)
		_, _ = io.WriteString(w, `{"error":"a request of yours is in flight"}`)
		return
	}
	if s.cross != runSeparately {
		id = key // one record per key, whoever sent it
	}
	w.Header().Set("Content-Type", "application/json")
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.records[id]
	if !ok {
		rec = &scopeRecord{owner: caller, fingerprint: fp, body: s.ops.create(body)}
		s.records[id] = rec
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(rec.body)
		return
	}
	if rec.owner != caller {
		s.strangers.Add(1)
		rec.strangers++
		refuse := 0
		switch s.cross {
		case refuse422:
			refuse = http.StatusUnprocessableEntity
		case refuse409:
			refuse = http.StatusConflict
		case refuseThenReplay:
			if rec.strangers == 1 {
				refuse = http.StatusUnprocessableEntity
			}
		case inFlightThenReplay:
			if rec.strangers <= inFlightAnswers {
				refuse = http.StatusConflict
			}
		}
		if refuse != 0 {
			w.WriteHeader(refuse)
			_, _ = io.WriteString(w, `{"error":"this key was used by another caller"}`)
			return
		}
	}
	if rec.fingerprint != fp {
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = io.WriteString(w, `{"error":"key reused with another body"}`)
		return
	}
	w.Header().Set(ReplayedHeader, "true")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(rec.body)
}

// A target that refuses another caller's reuse of a key, with 422 or 409,
// instead of running it separately shares nothing and runs nothing twice:
// the scope check holds, and the report says how the target behaved.
func TestScopeRefusedCrossCallerReuse(t *testing.T) {
	for _, tc := range []struct {
		cross  crossCaller
		status int
	}{
		{refuse422, http.StatusUnprocessableEntity},
		{refuse409, http.StatusConflict},
	} {
		t.Run(fmt.Sprint(tc.status), func(t *testing.T) {
			s := newScopeServer(tc.cross)
			rep := run(t, testConfig(serve(t, s)))
			if s.strangers.Load() == 0 {
				t.Fatal("the second caller never reused a key: the scope check did not reach the refusal")
			}
			wantAllHeld(t, rep)
			for _, c := range rep.Checks() {
				if c.Name != CheckScope {
					continue
				}
				note := strings.Join(c.Notes, "\n")
				if !strings.Contains(note, "refused cross-caller reuse") || !strings.Contains(note, fmt.Sprint(tc.status)) {
					t.Errorf("%q notes %q; want the refusal with %d named", CheckScope, c.Notes, tc.status)
				}
			}
		})
	}
}

// A target that scopes keys per caller runs the second caller's request
// separately: everything holds, with no note on the scope check.
func TestScopePerCaller(t *testing.T) {
	s := newScopeServer(runSeparately)
	rep := run(t, testConfig(serve(t, s)))
	wantAllHeld(t, rep)
	for _, c := range rep.Checks() {
		if c.Name == CheckScope && len(c.Notes) > 0 {
			t.Errorf("%q notes %q for a target that ran the second caller separately", CheckScope, c.Notes)
		}
	}
}

// Targets that give the second caller the first caller's answer fail the
// scope check, whether at once or on the retry after a refusal.
func TestScopeLeakFails(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cross crossCaller
		want  string
	}{
		{"replays the first caller's answer", replayFirst, "the second caller got the first caller's result"},
		{"refuses, then replays it to the retry", refuseThenReplay, "the second caller's retry got the first caller's result"},
		{"in flight, then replays it to a later retry", inFlightThenReplay, "the second caller's retry got the first caller's result"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newScopeServer(tc.cross)
			rep := run(t, testConfig(serve(t, s)))
			wantFailed(t, rep, CheckScope)
			if ex := example(rep, CheckScope); !strings.Contains(ex, tc.want) {
				t.Errorf("scope example %q does not say %q", ex, tc.want)
			}
		})
	}
}

// A target that answers the second caller 409 whatever the key, its own
// fresh keys too, has not refused a reuse of the first caller's key: the
// scope check cannot hold on its 409s.
func TestScopeCallerRefusedOnFreshKeysFails(t *testing.T) {
	s := newScopeServer(refuseCaller409)
	rep := run(t, testConfig(serve(t, s)))
	if s.strangers.Load() == 0 {
		t.Fatal("the second caller sent nothing")
	}
	wantFailed(t, rep, CheckScope)
	if ex, want := example(rep, CheckScope), "a fresh key of its own"; !strings.Contains(ex, want) {
		t.Errorf("scope example %q does not say %q", ex, want)
	}
}
