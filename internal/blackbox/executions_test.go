package blackbox

import (
	"fmt"
	"net/http"
	"strings"
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
