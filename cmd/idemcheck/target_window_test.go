package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemhttp"
	"github.com/archlab/idempotency/internal/blackbox"
)

// A target whose window is a second replays every retry sent at once, and
// runs again the ones sent later: -window says how late the last retries
// go, and the default catches this one.
func TestTargetWindow(t *testing.T) {
	guard, err := idempotency.NewGuard(idempotency.NewMemoryStore(), &idempotency.Options{Lease: 500 * time.Millisecond, Retention: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.New(guard, nil)
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, n.Add(1))
	})))
	defer srv.Close()
	args := []string{"-target", srv.URL + "/orders", "-requests", "3", "-seed", "1"}

	code, out, errOut := runCmd(t, args...)
	if code != exitFail {
		t.Fatalf("a 1s window, the default -window: exit %d, want 1\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if !regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(blackbox.CheckRetry)+`\s+FAILED`).MatchString(out) ||
		!strings.Contains(out, "forgotten within") {
		t.Errorf("the forgotten keys are not named:\n%s", out)
	}
	code, out, errOut = runCmd(t, append(args, "-window", "300ms")...)
	if code != exitOK {
		t.Errorf("a 1s window, -window 300ms: exit %d, want 0\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if code, _, errOut := runCmd(t, "-window", "1s"); code != exitUsage || !strings.Contains(errOut, "-window needs -target") {
		t.Errorf("-window without -target: exit %d, stderr:\n%s", code, errOut)
	}
}
