package main

import (
	"regexp"
	"testing"

	"github.com/archlab/idempotency/internal/demo"
)

// A store that keeps nothing across a restart of the server (the memory
// store, here) passes the store certification, which never restarts
// anything, and must fail the demo that -store runs after it: the server
// killed and restarted on it runs answered keys again instead of
// replaying them.
func TestStoreLosingResultsOnRestart(t *testing.T) {
	code, out, errOut := runCmd(t, "-store", "memory", "-duration", "3s", "-seed", "5")
	if code != exitFail {
		t.Fatalf("exit %d for a store that forgets every result on a restart, want 1\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(demo.CheckReplay) + `\s+FAILED`).MatchString(out) {
		t.Errorf("%q did not fail:\n%s", demo.CheckReplay, out)
	}
	// What the README says of this run: the ledger's fence keeps the
	// charge single all the same.
	if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(demo.CheckCharged) + `\s+ok\s`).MatchString(out) {
		t.Errorf("%q did not hold:\n%s", demo.CheckCharged, out)
	}
}
