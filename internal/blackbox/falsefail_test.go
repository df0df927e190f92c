package blackbox

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency/idemhttp"
	"github.com/archlab/idempotency/internal/verdict"
)

// Correct targets that answer in ways a strict checker takes for faults,
// each of which must pass; and targets against which a run must still end
// in good time.

// A target that stores a result only after its answer went out answers
// 409 (in flight) to a retry sent at once: the retry must wait that out,
// as a client would, and then get the replay.
func TestStoredAfterAnswering(t *testing.T) {
	s := newLenient(&lenient{storeLate: 50 * time.Millisecond})
	wantAllHeld(t, run(t, testConfig(serve(t, s))))
	if s.runs.Load() == 0 || s.replays.Load() == 0 {
		t.Fatalf("the target ran %d times and replayed %d times", s.runs.Load(), s.replays.Load())
	}
}

// A target that refuses a request whose client has gone before it starts
// (499, nothing run, nothing kept) runs the retry as a first request:
// that is no second execution.
func TestClientGoneRefused(t *testing.T) {
	s := newLenient(&lenient{goneRefused: true})
	rep := run(t, testConfig(serve(t, s)))
	wantFailed(t, rep)
}

// perKey records when a handler got its first and last request for each
// Idempotency-Key value.
type perKey struct {
	h           http.Handler
	mu          sync.Mutex
	first, last map[string]time.Time
}

func (p *perKey) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key, now := r.Header.Get("Idempotency-Key"), time.Now()
	p.mu.Lock()
	if p.first == nil {
		p.first, p.last = map[string]time.Time{}, map[string]time.Time{}
	}
	if _, ok := p.first[key]; !ok {
		p.first[key] = now
	}
	p.last[key] = now
	p.mu.Unlock()
	p.h.ServeHTTP(w, r)
}

// A target that answers 409 for ever once a key is answered holds a
// retry for the whole timeout once; after that the run has failed, and
// no later key is waited out: the run does not last a timeout per key.
func TestInFlightForeverWaitedOutOnce(t *testing.T) {
	h := &perKey{h: newLenient(&lenient{busyForever: true})}
	cfg := testConfig(serve(t, h))
	cfg.Timeout = time.Second
	rep := run(t, cfg)
	if !containsName(failed(rep), CheckRetry) {
		t.Errorf("%q held for a target that answers every retry 409", CheckRetry)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var waited []string
	for key, first := range h.first {
		if d := h.last[key].Sub(first); d >= cfg.Timeout {
			waited = append(waited, fmt.Sprintf("%s for %v", key, d.Round(time.Millisecond)))
		}
	}
	if len(waited) > 1 {
		t.Errorf("%d keys were waited out, want at most 1: %v", len(waited), waited)
	}
}

// stalls answers its first n requests, then holds every request until
// the client gives up: the target has stopped answering.
type stalls struct {
	n    int64
	seen atomic.Int64
	orders
}

func (s *stalls) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.seen.Add(1) > s.n {
		// Read the body, so that the server watches the connection and
		// ends the request when the client closes it.
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
		return
	}
	s.orders.ServeHTTP(w, r)
}

// A target that stops answering after the first requests ends the run
// with an error once nothing has come back for a few timeouts, instead
// of holding every remaining request for a timeout each.
func TestTargetStopsAnswering(t *testing.T) {
	s := &stalls{n: 2}
	cfg := testConfig(serve(t, s))
	cfg.Timeout = 200 * time.Millisecond
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	start := time.Now()
	err := Run(ctx, cfg, verdict.New(), logWriter{t})
	t.Logf("Run returned after %v, %d requests: %v", time.Since(start).Round(time.Millisecond), s.seen.Load(), err)
	if err == nil || !strings.Contains(err.Error(), "stopped answering") {
		t.Fatalf("Run = %v; want an error saying the target stopped answering", err)
	}
}

// A target that never answers a request whose key does not parse, but
// answers every other, has not stopped answering: the run goes on, and
// only the malformed-key check fails.
func TestUnansweredMalformedKeys(t *testing.T) {
	h := newToy(flaws{})
	cfg := testConfig(serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := idemhttp.ParseKey(r.Header["Idempotency-Key"]); err != nil {
			_, _ = io.Copy(io.Discard, r.Body)
			<-r.Context().Done()
			return
		}
		h.ServeHTTP(w, r)
	})))
	cfg.Timeout = 200 * time.Millisecond
	rep := run(t, cfg)
	wantFailed(t, rep, CheckMalformed)
}
