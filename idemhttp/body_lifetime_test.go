package idemhttp

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// A handler may hand its request body to something that reads it after the
// handler has returned: http.Transport copies a proxied request's body from
// its own write loop, which can outlive RoundTrip (the proxy's test of an
// upstream reset caught it under -race). The body must stay the request's
// own after the middleware returns its scratch space to the pool.
func TestBodyOutlivesHandler(t *testing.T) {
	type late struct{ want, got string }
	var (
		mu    sync.Mutex
		reads []late
		wg    sync.WaitGroup
	)
	f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
		want := r.Header.Get("X-Body")
		body := r.Body
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(30 * time.Millisecond) // the handler and other requests are done by now
			b, _ := io.ReadAll(body)
			mu.Lock()
			reads = append(reads, late{want, string(b)})
			mu.Unlock()
		}()
		w.WriteHeader(http.StatusCreated)
	})
	var cwg sync.WaitGroup
	for i := range 16 {
		cwg.Go(func() {
			body := fmt.Sprintf(`{"order":%d,"pad":"%0200d"}`, i, i)
			rq, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/", strings.NewReader(body))
			rq.Header.Set("Idempotency-Key", fmt.Sprintf(`"late-%d"`, i))
			rq.Header.Set("X-Body", body)
			resp, err := http.DefaultClient.Do(rq)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
		})
	}
	cwg.Wait()
	wg.Wait()
	if len(reads) != 16 {
		t.Fatalf("%d late reads, want 16", len(reads))
	}
	for _, r := range reads {
		if r.got != r.want {
			t.Errorf("a body read after its handler returned was %q, want %q", r.got, r.want)
		}
	}
}
