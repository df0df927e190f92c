package blackbox

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency/internal/verdict"
)

// crossWired is an idempotent orders server (keys parsed per the draft,
// scoped by Authorization, claimed under a lock, 409 in flight, replays
// marked, 422 for another body) that keeps each result through one
// buffer shared by every request, as a middleware that reuses its capture
// buffer too early does: one request at a time it is correct, but a
// request that runs while another key's does may store that key's
// answer as its own, and then replay it.
type crossWired struct {
	ops  orders
	runs atomic.Int64

	mu      sync.Mutex
	records map[string]*crossRecord

	bufMu sync.Mutex
	buf   []byte // the shared capture buffer
}

type crossRecord struct {
	fp   [32]byte
	done bool
	body []byte
}

func (s *crossWired) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, _, fp, body, ok := toyRequest(w, r)
	if !ok {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	s.mu.Lock()
	if s.records == nil {
		s.records = map[string]*crossRecord{}
	}
	rec, ok := s.records[id]
	switch {
	case ok && rec.fp != fp:
		s.mu.Unlock()
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = io.WriteString(w, `{"error":"key reused with another body"}`)
		return
	case ok && !rec.done:
		s.mu.Unlock()
		w.WriteHeader(http.StatusConflict)
		_, _ = io.WriteString(w, `{"error":"in flight"}`)
		return
	case ok:
		out := rec.body
		s.mu.Unlock()
		w.Header().Set(ReplayedHeader, "true")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(out)
		return
	}
	rec = &crossRecord{fp: fp}
	s.records[id] = rec
	s.mu.Unlock()

	s.runs.Add(1)
	out := s.ops.create(body)
	s.bufMu.Lock()
	s.buf = out
	s.bufMu.Unlock()
	time.Sleep(10 * time.Millisecond) // the operation's tail: other requests run meanwhile
	s.bufMu.Lock()
	captured := s.buf
	s.bufMu.Unlock()
	s.mu.Lock()
	rec.body, rec.done = captured, true
	s.mu.Unlock()
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(out)
}

// A target that stores, for requests on different keys running at once,
// one key's answer as another's replays the wrong answer to the retry:
// the run must send different keys at once, and fail the check that does.
func TestConcurrentKeysCrossWired(t *testing.T) {
	s := &crossWired{}
	rep := run(t, testConfig(serve(t, s)))
	wantFailed(t, rep, CheckApart)
	if ex := example(rep, CheckApart); !strings.Contains(ex, "another key's") {
		t.Errorf("%q example does not say a key got another key's answer: %q", CheckApart, ex)
	}
}

// One request at a time is no duplicate: a run with Concurrency 1 could
// not see concurrent duplicates run twice, so it is refused rather than
// reported as "concurrent duplicates execute once" held.
func TestOneDuplicateRefused(t *testing.T) {
	cfg := testConfig(serve(t, newToy(flaws{checkThenAct: true})))
	cfg.Concurrency = 1
	rep := verdict.New()
	err := Run(t.Context(), cfg, rep, logWriter{t})
	for _, c := range rep.Checks() {
		if c.Name == CheckConcurrent && c.OK() {
			t.Errorf("%q held (%d) with one request per key at a time, on a check-then-act target", c.Name, c.Passed)
		}
	}
	if err == nil || !strings.Contains(err.Error(), "concurrency 1") {
		t.Errorf("Run with Concurrency 1 = %v, want an error refusing it", err)
	}
}
