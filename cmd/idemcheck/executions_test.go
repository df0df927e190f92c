package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sync/atomic"
	"testing"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemhttp"
	"github.com/archlab/idempotency/internal/blackbox"
)

// -executions reads the target's execution counter. A service whose side
// effect sits in front of its idempotency middleware (a charge made by an
// outer handler) runs it for every retry, yet answers exactly as a
// correct one: every other check holds, and only the counter fails it.
// The same service with the side effect behind the middleware passes.
func TestTargetExecutionsCounter(t *testing.T) {
	for _, tc := range []struct {
		name    string
		outside bool
		code    int
		result  string
	}{
		{"side effect behind the middleware", false, exitOK, "ok"},
		{"side effect in front of the middleware", true, exitFail, "FAILED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			guard, err := idempotency.NewGuard(idempotency.NewMemoryStore(), nil)
			if err != nil {
				t.Fatal(err)
			}
			mw, err := idemhttp.New(guard, nil)
			if err != nil {
				t.Fatal(err)
			}
			var charges, ids atomic.Int64
			orders := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if !tc.outside {
					charges.Add(1)
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, `{"id":%d}`, ids.Add(1))
			})
			guarded := mw.Handler(orders)
			mux := http.NewServeMux()
			mux.Handle("/orders", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.outside {
					charges.Add(1)
				}
				guarded.ServeHTTP(w, r)
			}))
			mux.HandleFunc("GET /charges", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, charges.Load()) })
			srv := httptest.NewServer(mux)
			defer srv.Close()

			code, out, errOut := runCmd(t, "-target", srv.URL+"/orders", "-executions", srv.URL+"/charges",
				"-requests", "3", "-window", "100ms", "-seed", "1")
			if code != tc.code {
				t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.code, out, errOut)
			}
			re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(blackbox.CheckExecutions) + `\s+` + tc.result + `\s`)
			if !re.MatchString(out) {
				t.Errorf("%q is not reported %s:\n%s", blackbox.CheckExecutions, tc.result, out)
			}
		})
	}
}
