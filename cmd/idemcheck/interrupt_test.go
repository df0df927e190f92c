package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemhttp"
)

// TestInterruptedRunFails: a run cut short (SIGINT, SIGTERM: main's ctx
// ends) has not judged what it did not reach, so it exits 1 with the
// repro line, never 0, even against a correct target whose checks held so
// far. The ctx ends when the target has seen its 30th request, well before
// the run's end.
func TestInterruptedRunFails(t *testing.T) {
	guard, err := idempotency.NewGuard(idempotency.NewMemoryStore(), nil)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.New(guard, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var ids, seen atomic.Int64
	orders := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, ids.Add(1))
	}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if seen.Add(1) == 30 {
			cancel()
		}
		orders.ServeHTTP(w, r)
	}))
	defer srv.Close()

	var out, errb strings.Builder
	code := run(ctx, []string{"-target", srv.URL + "/orders", "-requests", "5", "-seed", "1"}, &out, &errb)
	if code != exitFail {
		t.Fatalf("interrupted run: exit %d, want 1\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "FAILED with seed 1") || !strings.Contains(errb.String(), "context canceled") {
		t.Errorf("interrupted run: no repro line, or stderr does not say why:\nstdout:\n%s\nstderr:\n%s", out.String(), errb.String())
	}
}
