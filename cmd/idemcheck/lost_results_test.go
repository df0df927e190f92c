package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/faultstore"
	"github.com/archlab/idempotency/idemhttp"
	"github.com/archlab/idempotency/internal/blackbox"
)

// TestTargetLosingResults: idemhttp on a store whose every Complete fails
// before it is applied answers each first request 2xx but keeps nothing,
// so that a retry runs the request again once the claim's lease is over.
// That is an acknowledged result lost, and -target must fail it. The same
// target on a store that applies every Complete and only loses its
// acknowledgement (faultstore's LostAck) keeps every result, and passes.
func TestTargetLosingResults(t *testing.T) {
	for _, tc := range []struct {
		spec string
		code int
	}{
		{"complete:error", exitFail},
		{"complete:lostack", exitOK},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			spec, err := faultstore.Parse(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			store := faultstore.New(idempotency.NewMemoryStore(), spec.Injector(1))
			guard, err := idempotency.NewGuard(store, &idempotency.Options{Lease: 300 * time.Millisecond, Retention: time.Hour})
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

			code, out, errOut := runCmd(t, "-target", srv.URL+"/orders", "-requests", "3", "-window", "500ms", "-timeout", "2s", "-seed", "1")
			if code != tc.code {
				t.Fatalf("store %q: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", tc.spec, code, tc.code, out, errOut)
			}
			if store.Injected(faultstore.OpComplete) == 0 {
				t.Fatalf("store %q: no fault was injected into Complete", tc.spec)
			}
			if tc.code == exitFail && !regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(blackbox.CheckRetry)+`\s+FAILED`).MatchString(out) {
				t.Errorf("store %q: %q did not fail:\n%s", tc.spec, blackbox.CheckRetry, out)
			}
		})
	}
}
