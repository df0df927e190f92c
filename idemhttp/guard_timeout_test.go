package idemhttp

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

// TestGuardTimeoutKeepsClaim: when the Guard's Timeout ends the handler's
// context and the handler answers with a status that is not stored, the
// claim is kept (the handler gave up partway, its work may have taken
// effect): the retry is told the request is in flight and does not run.
// A stored status after the timeout is stored as usual.
func TestGuardTimeoutKeepsClaim(t *testing.T) {
	for _, detach := range []bool{false, true} {
		t.Run(map[bool]string{false: "attached", true: "detached"}[detach], func(t *testing.T) {
			var status int
			f := newFixture(t, &Options{Detach: detach}, &idempotency.Options{Timeout: 50 * time.Millisecond, Lease: time.Minute},
				func(w http.ResponseWriter, r *http.Request) {
					<-r.Context().Done()
					if !errors.Is(r.Context().Err(), context.DeadlineExceeded) {
						t.Errorf("handler's ctx ended with %v", r.Context().Err())
					}
					w.WriteHeader(status)
				})
			status = http.StatusServiceUnavailable
			if r := f.do(t, req{keys: key("cut")}); r.status != http.StatusServiceUnavailable {
				t.Fatalf("first = %d %q", r.status, r.body)
			}
			if e := f.events.waitOutcome(t, Abandoned); !errors.Is(e.Err, errHandlerCut) {
				t.Errorf("Abandoned event's Err = %v", e.Err)
			}
			if r := f.do(t, req{keys: key("cut")}); r.status != http.StatusConflict {
				t.Errorf("retry = %d %q; want 409 in flight (claim kept)", r.status, r.body)
			}
			if n := f.calls.Load(); n != 1 {
				t.Errorf("handler ran %d times; want 1", n)
			}

			status = http.StatusAccepted
			f.do(t, req{keys: key("late")})
			if r := f.do(t, req{keys: key("late")}); r.status != http.StatusAccepted || r.header.Get(ReplayedHeader) != "true" {
				t.Errorf("retry of a stored status after the timeout = %d %v", r.status, r.header)
			}
		})
	}
}
