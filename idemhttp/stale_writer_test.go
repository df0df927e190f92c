package idemhttp

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

// staleUse is what a goroutine did with the writer its handler leaked to
// it, after the handler returned.
type staleUse struct {
	kept bool
	errs []error // of Write, ReadFrom and Flush
}

// TestLeakedWriterCannotReachLaterRequest: the middleware pools what it
// wraps the ResponseWriter with. A handler that leaks its writer to a
// goroutine, which uses it after the handler returned (KeepClaim, headers,
// writes, Flush), must not reach the request that the pooled writer serves
// by then: that request's response is sent and stored as its handler wrote
// it. The requests run one after another on this goroutine, so that the
// pool hands the writer on; several rounds, since the race detector makes
// sync.Pool drop some of what it is given.
func TestLeakedWriterCannotReachLaterRequest(t *testing.T) {
	g, err := idempotency.NewGuard(idempotency.NewMemoryStore(), nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(g, nil)
	if err != nil {
		t.Fatal(err)
	}
	var (
		late = make(chan struct{})
		used = make(chan staleUse, 1)
	)
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("X-Role") {
		case "leak":
			go func() {
				<-late
				var u staleUse
				u.kept = KeepClaim(w)
				w.Header().Set("X-Stale", "1")
				w.WriteHeader(http.StatusAccepted)
				_, err := io.WriteString(w, "stale")
				u.errs = append(u.errs, err)
				_, err = io.Copy(w, strings.NewReader("stale"))
				u.errs = append(u.errs, err)
				u.errs = append(u.errs, http.NewResponseController(w).Flush())
				used <- u
			}()
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, "leaker")
		case "victim":
			late <- struct{}{} // the leaked goroutine acts while this request runs
			select {
			case u := <-used:
				if u.kept {
					t.Error("KeepClaim on a writer whose handler returned reported true")
				}
				for _, err := range u.errs {
					if err == nil {
						t.Error("a write through a writer whose handler returned reported success")
					}
				}
			case <-time.After(5 * time.Second):
				t.Error("the leaked goroutine did not report")
			}
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, "victim")
		default:
			w.WriteHeader(http.StatusInternalServerError) // the victim's response was not stored
		}
	}))
	serve := func(role, key string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("b"))
		r.Header.Set("Idempotency-Key", key)
		r.Header.Set("X-Role", role)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	for i := range 16 {
		serve("leak", fmt.Sprintf("leak-%d", i))
		victim := fmt.Sprintf("victim-%d", i)
		w := serve("victim", victim)
		if w.Code != http.StatusCreated || w.Body.String() != "victim" || w.Header().Get("X-Stale") != "" {
			t.Fatalf("round %d: the victim sent %d %q %v; want 201 \"victim\" without X-Stale", i, w.Code, w.Body, w.Header())
		}
		w = serve("retry", victim)
		if w.Code != http.StatusCreated || w.Body.String() != "victim" || w.Header().Get(ReplayedHeader) != "true" ||
			w.Header().Get("X-Stale") != "" {
			t.Fatalf("round %d: the victim's retry got %d %q %v; want its stored 201 \"victim\" replayed", i, w.Code, w.Body, w.Header())
		}
		if t.Failed() {
			t.FailNow()
		}
	}
}
