package main

import (
	"errors"
	"testing"

	"github.com/archlab/idempotency/internal/blackbox"
	"github.com/archlab/idempotency/internal/verdict"
)

// A report in which every check was skipped says "0 passed, 0 failed": run
// must not take that for success. No target reaches it today (the
// preflight always judges the fresh-requests check), so the decision run
// makes is checked on such a report directly.
func TestNothingJudgedFails(t *testing.T) {
	rep := verdict.New()
	rep.Declare(blackbox.Checks()...)
	for _, name := range blackbox.Checks() {
		rep.Skip(name, "not run")
	}
	if err := judged(rep); !errors.Is(err, errNothingJudged) {
		t.Errorf("judged(every check skipped) = %v, want %v", err, errNothingJudged)
	}
	if err := judged(verdict.New()); !errors.Is(err, errNothingJudged) {
		t.Errorf("judged(no checks) = %v, want %v", err, errNothingJudged)
	}
	if rep.OK() {
		t.Error("a report with every check skipped is OK()")
	}
	held := verdict.New()
	held.Skip(blackbox.CheckScope, "only one credential set")
	held.Pass(blackbox.CheckFresh)
	if err := judged(held); err != nil {
		t.Errorf("judged(one check held, one skipped) = %v, want nil", err)
	}
}
