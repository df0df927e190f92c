package blackbox

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency/internal/verdict"
)

// withCounter serves h at /orders and the count of its executions at
// /executions, and returns a Config for it with Executions set.
func withCounter(t *testing.T, h http.Handler, count func() int64) Config {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/orders", h)
	mux.HandleFunc("GET /executions", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != twoCallers[0].Get("Authorization") {
			http.Error(w, "who are you?", http.StatusUnauthorized)
			return
		}
		fmt.Fprintln(w, count())
	})
	target := serve(t, mux)
	cfg := testConfig(target)
	cfg.Executions = strings.TrimSuffix(target, "/orders") + "/executions"
	return cfg
}

// Targets that run an operation twice and answer as a correct one does:
// only their execution counter shows it.
func TestExecutionsCounted(t *testing.T) {
	t.Run("every replay runs again", func(t *testing.T) {
		s := newToy(flaws{rerun: true})
		rep := run(t, withCounter(t, s, s.ops.n.Load))
		wantFailed(t, rep, CheckExecutions)
		if ex := example(rep, CheckExecutions); !strings.Contains(ex, "had run already") {
			t.Errorf("%q example does not say operations ran twice: %q", CheckExecutions, ex)
		}
	})
	t.Run("run again after the client left", func(t *testing.T) {
		// The operation ran, its client had gone, so the key was released
		// and the connection dropped: the retry runs it again, and its
		// answer is a first answer like any other.
		s := newLenient(&lenient{goneDiscard: true})
		cfg := withCounter(t, s, s.runs.Load)
		cfg.Requests = 2 // every execution takes 300ms
		rep := run(t, cfg)
		wantFailed(t, rep, CheckExecutions)
	})
}

// Correct targets with a counter: the check runs and holds.
func TestExecutionsCorrect(t *testing.T) {
	t.Run("toy", func(t *testing.T) {
		s := newToy(flaws{})
		wantAllHeldWith(t, run(t, withCounter(t, s, s.ops.n.Load)), CheckExecutions)
	})
	t.Run("middleware", func(t *testing.T) {
		ops := &orders{}
		h, err := guardedOps(ops)
		if err != nil {
			t.Fatal(err)
		}
		wantAllHeldWith(t, run(t, withCounter(t, h, ops.n.Load)), CheckExecutions)
	})
	t.Run("client gone refused", func(t *testing.T) {
		// A request whose client has gone is answered 499 and not run.
		s := newLenient(&lenient{goneRefused: true})
		rep := run(t, withCounter(t, s, s.runs.Load))
		wantFailed(t, rep)
	})
}

// wantAllHeldWith is wantAllHeld for a run that declared extra checks too.
func wantAllHeldWith(t *testing.T, rep *verdict.Report, extra ...string) {
	t.Helper()
	wantFailed(t, rep)
	if s := skipped(rep); len(s) > 0 {
		t.Errorf("checks skipped: %v", s)
	}
	if passed, failed := rep.Counts(); passed != len(Checks())+len(extra) || failed != 0 {
		t.Errorf("Counts() = %d passed, %d failed; want %d, 0", passed, failed, len(Checks())+len(extra))
	}
}

// A counter that cannot be read at the start makes checking impossible;
// one that goes down counts something else.
func TestExecutionsCounterBroken(t *testing.T) {
	s := newToy(flaws{})
	cfg := withCounter(t, s, s.ops.n.Load)
	cfg.Executions += "-missing"
	if err := Run(t.Context(), cfg, verdict.New(), nil); err == nil || !strings.Contains(err.Error(), "execution counter") {
		t.Errorf("Run with a counter answering 404 = %v, want an error naming the counter", err)
	}
	cfg.Executions = "ftp://127.0.0.1/x"
	if err := Run(t.Context(), cfg, verdict.New(), nil); err == nil {
		t.Error("Run accepted an ftp:// counter")
	}
	start := time.Now()
	down := func() int64 { return 1000 - int64(time.Since(start)/time.Millisecond) }
	rep := run(t, withCounter(t, s, down))
	if ex := example(rep, CheckExecutions); !strings.Contains(ex, "count up") {
		t.Errorf("%q example does not say the counter went down: %q", CheckExecutions, ex)
	}
}

// auditing is a correct idempotent target whose operation may refuse a
// request by a business rule after it has begun: it writes an audit row
// (counted as an execution), then answers 409, and keeps that answer as
// the key's result, replayed like any other. Requests whose body's "seq"
// is a multiple of refuseEvery are refused so.
type auditing struct {
	refuseEvery int
	runs        atomic.Int64
	refused     atomic.Int64
	mu          sync.Mutex
	records     map[string]auditRecord
}

type auditRecord struct {
	fp     [32]byte
	status int
	body   []byte
}

func (s *auditing) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, _, fp, body, ok := toyRequest(w, r)
	if !ok {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.records == nil {
		s.records = map[string]auditRecord{}
	}
	if rec, ok := s.records[id]; ok {
		if rec.fp != fp {
			w.WriteHeader(http.StatusUnprocessableEntity)
			_, _ = io.WriteString(w, `{"error":"key reused with another body"}`)
			return
		}
		w.Header().Set(ReplayedHeader, "true")
		w.WriteHeader(rec.status)
		_, _ = w.Write(rec.body)
		return
	}
	n := s.runs.Add(1) // the audit row
	var in struct{ Seq int }
	_ = json.Unmarshal(body, &in)
	rec := auditRecord{fp: fp, status: http.StatusCreated, body: fmt.Appendf(nil, `{"order":"ord_%d","request":%s}`, n, body)}
	if in.Seq%s.refuseEvery == 0 {
		s.refused.Add(1)
		rec.status, rec.body = http.StatusConflict, fmt.Appendf(nil, `{"error":"order limit reached","audit":"aud_%d"}`, n)
	}
	s.records[id] = rec
	w.WriteHeader(rec.status)
	_, _ = w.Write(rec.body)
}

// A target that runs a request and then refuses it (409 by a business
// rule, after an audit row its counter counts) ran it once: an operation
// answered only 4xx, other than the refusals the run asked for, may have
// run, and the bound must allow it. (Fresh requests refused fail
// CheckFresh; the counter must not add a double execution that was not.)
func TestExecutionsRunThenRefused(t *testing.T) {
	s := &auditing{refuseEvery: 3}
	cfg := withCounter(t, s, s.runs.Load)
	cfg.BodyTemplate = `{"id":"{{unique}}","seq":{{seq}}}`
	rep := run(t, cfg)
	if s.refused.Load() == 0 {
		t.Fatalf("the target refused nothing after running it (%d executions)", s.runs.Load())
	}
	if containsName(failed(rep), CheckExecutions) {
		t.Errorf("%q failed for a target that ran each operation once and refused %d of them after running them: %s",
			CheckExecutions, s.refused.Load(), example(rep, CheckExecutions))
	}
	for _, c := range rep.Checks() {
		if c.Name == CheckExecutions && c.Passed == 0 {
			t.Errorf("%q did not run: %+v", CheckExecutions, c)
		}
	}
}

// runsRefused runs the operation for the requests it refuses as the draft
// says (400 for a malformed key, 422 for another body on a used key) as
// well: its side effect comes before the checks that refuse them.
type runsRefused struct {
	toy     *toy
	refused atomic.Int64
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	w.status = status
	w.ResponseWriter.WriteHeader(status)
}

func (s *runsRefused) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sw := &statusWriter{ResponseWriter: w}
	s.toy.ServeHTTP(sw, r)
	if sw.status == http.StatusBadRequest || sw.status == http.StatusUnprocessableEntity {
		s.refused.Add(1)
	}
}

func (s *runsRefused) count() int64 { return s.toy.ops.n.Load() + s.refused.Load() }

// The refusals the run asks for are no executions: a target that runs
// them all the same has run operations the draft says it must not, and
// every answer it gives is a correct one's.
func TestExecutionsOfRefusedRequests(t *testing.T) {
	s := &runsRefused{toy: newToy(flaws{})}
	rep := run(t, withCounter(t, s, s.count))
	wantFailed(t, rep, CheckExecutions)
}
