package idemhttp

import (
	"errors"
	"io"
	"net/http"
	"runtime"
	"sync/atomic"
	"testing"
)

// TestGoexitAfterStoredStatusKeepsClaim: a handler that sent a status
// that is stored (201 and part of its body), or called KeepClaim, and then
// calls runtime.Goexit (t.FailNow in a test handler, a library that
// gives up so) is the panic's case (TestPanicAfterStoredStatusKeepsClaim):
// the work may be done and the client, whose response is cut short,
// retries. The claim is kept until its lease ends, instead of released for
// the retry to run the work a second time at once.
func TestGoexitAfterStoredStatusKeepsClaim(t *testing.T) {
	for name, before := range map[string]func(w http.ResponseWriter){
		"201 sent": func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, "charged")
			http.NewResponseController(w).Flush()
		},
		"KeepClaim": func(w http.ResponseWriter) {
			if !KeepClaim(w) {
				panic("KeepClaim refused")
			}
		},
		"KeepClaim, then 500 sent": func(w http.ResponseWriter) {
			KeepClaim(w)
			w.WriteHeader(http.StatusInternalServerError)
		},
	} {
		t.Run(name, func(t *testing.T) {
			var clock manualClock
			var calls atomic.Int64
			f := newFixture(t, nil, clock.guard(), func(w http.ResponseWriter, r *http.Request) {
				if calls.Add(1) == 1 {
					before(w)
					runtime.Goexit()
				}
				created(w, r)
			})
			_, _ = f.try(req{keys: key("k"), body: "b"}) // cut short
			ev := f.events.waitOutcome(t, Abandoned)
			if !errors.Is(ev.Err, errGoexitKept) {
				t.Fatalf("event = %+v; want Abandoned with errGoexitKept", ev)
			}
			wantClaimKept(t, f, &clock, &calls)
		})
	}
}

// TestGoexitWithoutStoredStatusReleases: Goexit before any status was
// sent, or after one that is not stored, releases the key as a panic does
// then: the handler announced nothing done, and the retry runs at once.
func TestGoexitWithoutStoredStatusReleases(t *testing.T) {
	for name, before := range map[string]func(w http.ResponseWriter){
		"nothing sent": func(http.ResponseWriter) {},
		"500 sent": func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusInternalServerError)
			http.NewResponseController(w).Flush()
		},
	} {
		t.Run(name, func(t *testing.T) {
			var calls atomic.Int64
			f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
				if calls.Add(1) == 1 {
					before(w)
					runtime.Goexit()
				}
				created(w, r)
			})
			_, _ = f.try(req{keys: key("k"), body: "b"})
			if ev := f.events.waitOutcome(t, Released); !errors.Is(ev.Err, errPanic) {
				t.Fatalf("event = %+v; want Released", ev)
			}
			if r := f.do(t, req{keys: key("k"), body: "b"}); r.status != http.StatusCreated || r.header.Get(ReplayedHeader) != "" {
				t.Fatalf("retry after Goexit = %d %v; want a new execution", r.status, r.header)
			}
		})
	}
}
