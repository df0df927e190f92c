package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

func TestUnguardedMethodsPassThrough(t *testing.T) {
	f := newFixture(t, nil, nil, created)
	for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
		for range 2 {
			r := f.do(t, req{method: m, keys: key("k1"), body: "x"})
			if r.header.Get(ReplayedHeader) != "" {
				t.Fatalf("%s was replayed", m)
			}
		}
	}
	if got := f.calls.Load(); got != 6 {
		t.Fatalf("handler ran %d times, want 6", got)
	}
	if n := f.store.Len(); n != 0 {
		t.Fatalf("store holds %d records for unguarded methods", n)
	}
	// PATCH is guarded by default.
	f.do(t, req{method: http.MethodPatch, keys: key("k2")})
	if r := f.do(t, req{method: http.MethodPatch, keys: key("k2")}); r.header.Get(ReplayedHeader) != "true" {
		t.Fatalf("PATCH not replayed: %d %v", r.status, r.header)
	}
}

func TestQuotedAndBareKeyAreOneKey(t *testing.T) {
	f := newFixture(t, nil, nil, created)
	first := f.do(t, req{keys: key(`"order-1"`), body: "a"})
	second := f.do(t, req{keys: key("order-1"), body: "a"})
	if first.status != http.StatusCreated || second.status != http.StatusCreated {
		t.Fatalf("statuses %d, %d", first.status, second.status)
	}
	if second.header.Get(ReplayedHeader) != "true" || second.body != first.body {
		t.Fatalf("bare key did not replay the quoted one: %v %q", second.header, second.body)
	}
	if f.calls.Load() != 1 {
		t.Fatalf("handler ran %d times", f.calls.Load())
	}
}

func TestInvalidKeyIs400AndNothingRuns(t *testing.T) {
	f := newFixture(t, nil, nil, created)
	cases := map[string][]string{
		"two fields":   {"a", "b"},
		"list":         {`"a", "b"`},
		"bare list":    {"a,b"},
		"parameters":   {`"a";x=1`},
		"empty":        {""},
		"empty string": {`""`},
		"unterminated": {`"abc`},
		"bad escape":   {`"a\n"`},
		"too long":     {strings.Repeat("k", 256)},
		"space inside": {`"a b"`},
		"trailing":     {`"a"b`},
	}
	for name, v := range cases {
		t.Run(name, func(t *testing.T) {
			r := f.do(t, req{keys: v, body: "x"})
			if r.status != http.StatusBadRequest {
				t.Fatalf("status %d, want 400", r.status)
			}
			if p := r.problem(t); p.Type != ProblemBase+"invalid-key" || p.Detail == "" {
				t.Fatalf("problem %+v", p)
			}
		})
	}
	if f.calls.Load() != 0 || f.store.Len() != 0 {
		t.Fatalf("handler ran %d times, store holds %d", f.calls.Load(), f.store.Len())
	}
	if r := f.do(t, req{keys: key(strings.Repeat("k", 255))}); r.status != http.StatusCreated {
		t.Fatalf("a 255-character key got %d", r.status)
	}
}

func TestMissingKey(t *testing.T) {
	t.Run("optional", func(t *testing.T) {
		f := newFixture(t, nil, nil, created)
		f.do(t, req{body: "x"})
		f.do(t, req{body: "x"})
		if f.calls.Load() != 2 || f.store.Len() != 0 {
			t.Fatalf("calls %d, records %d", f.calls.Load(), f.store.Len())
		}
	})
	t.Run("required", func(t *testing.T) {
		f := newFixture(t, &Options{Required: true}, nil, created)
		r := f.do(t, req{body: "x"})
		if r.status != http.StatusBadRequest || r.problem(t).Type != ProblemBase+"missing-key" {
			t.Fatalf("%d %q", r.status, r.body)
		}
		if f.calls.Load() != 0 {
			t.Fatal("handler ran")
		}
		if got := f.events.outcomes(); len(got) != 1 || got[0] != BadRequest {
			t.Fatalf("outcomes %v", got)
		}
	})
}

func TestScopeSeparatesCallers(t *testing.T) {
	f := newFixture(t, nil, nil, created)
	alice := http.Header{"Authorization": {"Bearer alice"}}
	bob := http.Header{"Authorization": {"Bearer bob"}}
	a := f.do(t, req{keys: key("k"), body: "same", header: alice})
	b := f.do(t, req{keys: key("k"), body: "same", header: bob})
	if b.header.Get(ReplayedHeader) != "" || f.calls.Load() != 2 {
		t.Fatalf("bob got alice's response: %v, calls %d", b.header, f.calls.Load())
	}
	if r := f.do(t, req{keys: key("k"), body: "same", header: alice}); r.header.Get(ReplayedHeader) != "true" || r.body != a.body {
		t.Fatalf("alice's retry not replayed: %v", r.header)
	}
	for _, k := range f.store.Keys(time.Now()) {
		if strings.Contains(k, "alice") || strings.Contains(k, "bob") {
			t.Fatalf("credential in stored key %q", k)
		}
	}

	t.Run("custom", func(t *testing.T) {
		f := newFixture(t, &Options{Scope: func(r *http.Request) string { return r.Header.Get("X-Tenant") }}, nil, created)
		f.do(t, req{keys: key("k"), header: http.Header{"X-Tenant": {"t1"}}})
		f.do(t, req{keys: key("k"), header: http.Header{"X-Tenant": {"t2"}}})
		if f.calls.Load() != 2 {
			t.Fatalf("tenants shared a key: calls %d", f.calls.Load())
		}
		keys := f.store.Keys(time.Now())
		if len(keys) != 2 || keys[0] != "t1\x00k" || keys[1] != "t2\x00k" {
			t.Fatalf("stored keys %q, want scope+NUL+key", keys)
		}
	})
}

func TestFingerprintMismatchIsConflict(t *testing.T) {
	f := newFixture(t, nil, nil, created)
	f.do(t, req{path: "/orders?b=2&a=1", keys: key("k"), body: "one", header: http.Header{"Content-Type": {"text/plain"}}})
	cases := []struct {
		name string
		q    req
	}{
		{"body", req{path: "/orders?b=2&a=1", body: "two", header: http.Header{"Content-Type": {"text/plain"}}}},
		{"path", req{path: "/refunds?b=2&a=1", body: "one", header: http.Header{"Content-Type": {"text/plain"}}}},
		{"query", req{path: "/orders?b=3&a=1", body: "one", header: http.Header{"Content-Type": {"text/plain"}}}},
		{"content type", req{path: "/orders?b=2&a=1", body: "one", header: http.Header{"Content-Type": {"application/json"}}}},
		{"method", req{method: http.MethodPatch, path: "/orders?b=2&a=1", body: "one", header: http.Header{"Content-Type": {"text/plain"}}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.q.keys = key("k")
			r := f.do(t, c.q)
			if r.status != http.StatusUnprocessableEntity || r.problem(t).Type != ProblemBase+"key-reused" {
				t.Fatalf("%d %q", r.status, r.body)
			}
		})
	}
	// Reordered query pairs are the same request.
	r := f.do(t, req{path: "/orders?a=1&b=2", keys: key("k"), body: "one", header: http.Header{"Content-Type": {"text/plain"}}})
	if r.header.Get(ReplayedHeader) != "true" {
		t.Fatalf("reordered query not replayed: %d %q", r.status, r.body)
	}
	if f.calls.Load() != 1 {
		t.Fatalf("handler ran %d times", f.calls.Load())
	}

	t.Run("409 option", func(t *testing.T) {
		f := newFixture(t, &Options{ConflictStatus: http.StatusConflict}, nil, created)
		f.do(t, req{keys: key("k"), body: "one"})
		if r := f.do(t, req{keys: key("k"), body: "two"}); r.status != http.StatusConflict || r.problem(t).Type != ProblemBase+"key-reused" {
			t.Fatalf("%d %q", r.status, r.body)
		}
	})
}

func TestBodyIsReadAndRestored(t *testing.T) {
	f := newFixture(t, &Options{MaxBody: 1000}, nil, created)
	body := strings.Repeat("0123456789", 100) // exactly MaxBody
	r := f.do(t, req{keys: key("k"), body: body})
	if r.status != http.StatusCreated || r.body != `{"echo":"`+body+`"}` {
		t.Fatalf("handler did not get the body: %d %q", r.status, r.body)
	}
	r = f.do(t, req{keys: key("big"), body: body + "!"})
	if r.status != http.StatusRequestEntityTooLarge || r.problem(t).Type != ProblemBase+"request-too-large" {
		t.Fatalf("%d %q", r.status, r.body)
	}
	if f.calls.Load() != 1 || f.store.Len() != 1 {
		t.Fatalf("calls %d, records %d", f.calls.Load(), f.store.Len())
	}
	f.events.waitOutcome(t, TooLarge)
}

func TestReplayIsExact(t *testing.T) {
	f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Add("X-Multi", "1")
		h.Add("X-Multi", "2")
		h.Set("Location", "/orders/7")
		h.Set("Set-Cookie", "session=secret")
		h.Set("Connection", "keep-alive")
		w.WriteHeader(http.StatusAccepted)
		_, _ = io.WriteString(w, `{"id":7}`)
	})
	first := f.do(t, req{keys: key("k")})
	second := f.do(t, req{keys: key("k")})
	if second.status != first.status || second.body != first.body {
		t.Fatalf("replay %d %q, first %d %q", second.status, second.body, first.status, first.body)
	}
	for _, name := range []string{"Content-Type", "X-Multi", "Location"} {
		if got, want := second.header.Values(name), first.header.Values(name); strings.Join(got, "|") != strings.Join(want, "|") {
			t.Fatalf("%s: replay %q, first %q", name, got, want)
		}
	}
	if second.header.Get(ReplayedHeader) != "true" || first.header.Get(ReplayedHeader) != "" {
		t.Fatalf("Idempotent-Replayed: first %q, replay %q", first.header.Get(ReplayedHeader), second.header.Get(ReplayedHeader))
	}
	if second.header.Get("Set-Cookie") != "" {
		t.Fatal("Set-Cookie was replayed")
	}
	if second.header.Get("Date") == "" {
		t.Fatal("replay has no Date")
	}
}

func TestWindowHeader(t *testing.T) {
	start := time.Now().Truncate(time.Second)
	f := newFixture(t, nil, &idempotency.Options{Retention: 2 * time.Hour}, created)
	first := f.do(t, req{keys: key("k")})
	second := f.do(t, req{keys: key("k")})
	for _, r := range []reply{first, second} {
		exp, err := http.ParseTime(r.header.Get(DefaultWindowHeader))
		if err != nil {
			t.Fatalf("window header %q: %v", r.header.Get(DefaultWindowHeader), err)
		}
		if exp.Before(start.Add(2*time.Hour)) || exp.After(time.Now().Add(2*time.Hour+time.Second)) {
			t.Fatalf("window ends %v, want about %v", exp, start.Add(2*time.Hour))
		}
	}
	// A released status does not advertise a window.
	f5 := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusBadGateway) })
	if r := f5.do(t, req{keys: key("k")}); r.header.Get(DefaultWindowHeader) != "" {
		t.Fatalf("502 advertised a window: %v", r.header)
	}
	off := newFixture(t, &Options{WindowHeader: "-"}, nil, created)
	if r := off.do(t, req{keys: key("k")}); r.header.Get(DefaultWindowHeader) != "" {
		t.Fatal("WindowHeader \"-\" still sent the header")
	}
}

// blocker is a handler that signals when it starts and waits for release.
type blocker struct {
	started chan struct{}
	release chan struct{}
	once    sync.Once
}

func newBlocker() *blocker {
	return &blocker{started: make(chan struct{}), release: make(chan struct{})}
}

func (b *blocker) handler(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		b.once.Do(func() { close(b.started) })
		select {
		case <-b.release:
		case <-time.After(10 * time.Second):
		}
		next(w, r)
	}
}

func waitClosed(t *testing.T, c chan struct{}) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(5 * time.Second):
		t.Fatal("timed out")
	}
}

func TestInFlightIs409WithRetryAfter(t *testing.T) {
	b := newBlocker()
	f := newFixture(t, nil, &idempotency.Options{Lease: 10 * time.Second}, b.handler(created))
	done := make(chan reply, 1)
	go func() { r, _ := f.try(req{keys: key("k")}); done <- r }()
	waitClosed(t, b.started)
	r := f.do(t, req{keys: key("k")})
	if r.status != http.StatusConflict || r.problem(t).Type != ProblemBase+"in-flight" {
		t.Fatalf("%d %q", r.status, r.body)
	}
	ra, err := strconv.Atoi(r.header.Get("Retry-After"))
	if err != nil || ra < 1 || ra > 10 {
		t.Fatalf("Retry-After %q", r.header.Get("Retry-After"))
	}
	close(b.release)
	if first := <-done; first.status != http.StatusCreated {
		t.Fatalf("first got %d", first.status)
	}
	if f.calls.Load() != 1 {
		t.Fatalf("handler ran %d times", f.calls.Load())
	}
}

func TestWaitReplaysWhenTheFirstFinishes(t *testing.T) {
	b := newBlocker()
	f := newFixture(t, &Options{Wait: 5 * time.Second}, nil, b.handler(created))
	done := make(chan reply, 1)
	go func() { r, _ := f.try(req{keys: key("k"), body: "b"}); done <- r }()
	waitClosed(t, b.started)
	go func() { time.Sleep(50 * time.Millisecond); close(b.release) }()
	r := f.do(t, req{keys: key("k"), body: "b"})
	first := <-done
	if r.status != http.StatusCreated || r.header.Get(ReplayedHeader) != "true" || r.body != first.body {
		t.Fatalf("waiting duplicate got %d %v %q", r.status, r.header, r.body)
	}
	if f.calls.Load() != 1 {
		t.Fatalf("handler ran %d times", f.calls.Load())
	}

	t.Run("bounded", func(t *testing.T) {
		b := newBlocker()
		f := newFixture(t, &Options{Wait: 100 * time.Millisecond}, nil, b.handler(created))
		done := make(chan reply, 1)
		go func() { r, _ := f.try(req{keys: key("k")}); done <- r }()
		waitClosed(t, b.started)
		r := f.do(t, req{keys: key("k")})
		close(b.release)
		<-done
		if r.status != http.StatusConflict {
			t.Fatalf("got %d after the wait ran out, want 409", r.status)
		}
	})
}

func TestStoreUnavailableIs503(t *testing.T) {
	f := newFixture(t, &Options{UnavailableRetryAfter: 1500 * time.Millisecond}, nil, created)
	f.store.Fault = func(op string) error { return errors.New("disk on fire") }
	r := f.do(t, req{keys: key("k")})
	if r.status != http.StatusServiceUnavailable || r.problem(t).Type != ProblemBase+"store-unavailable" {
		t.Fatalf("%d %q", r.status, r.body)
	}
	if r.header.Get("Retry-After") != "2" {
		t.Fatalf("Retry-After %q, want 2", r.header.Get("Retry-After"))
	}
	if f.calls.Load() != 0 {
		t.Fatal("handler ran while the store was down")
	}
	e := f.events.waitOutcome(t, Unavailable)
	if !errors.Is(e.Err, idempotency.ErrUnavailable) {
		t.Fatalf("event error %v", e.Err)
	}
}

func TestLeaseLostResponseSentNotStored(t *testing.T) {
	var f *fixture
	deleted := make(chan struct{})
	f = newFixture(t, nil, &idempotency.Options{Lease: 300 * time.Millisecond, RenewEvery: 20 * time.Millisecond},
		func(w http.ResponseWriter, r *http.Request) {
			// An operator deletes the key while the handler runs: the next
			// renewal is rejected and the handler's context cancelled.
			_ = f.store.Delete(context.Background(), "\x00k")
			close(deleted)
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, "done")
		})
	r := f.do(t, req{keys: key("k")})
	if r.status != http.StatusCreated || r.body != "done" {
		t.Fatalf("response not sent: %d %q", r.status, r.body)
	}
	e := f.events.waitOutcome(t, LeaseLost)
	if !errors.Is(e.Err, idempotency.ErrLeaseLost) || e.Status != http.StatusCreated {
		t.Fatalf("event %+v", e)
	}
	if f.store.Len() != 0 {
		t.Fatalf("the response was stored: %d records", f.store.Len())
	}
}

func TestStoragePolicy(t *testing.T) {
	for _, c := range []struct {
		status int
		stored bool
	}{
		{200, true}, {201, true}, {204, true}, {302, true}, {400, true}, {404, true}, {409, true},
		{408, false}, {425, false}, {429, false}, {500, false}, {503, false},
	} {
		t.Run(strconv.Itoa(c.status), func(t *testing.T) {
			f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(c.status)
				_, _ = io.WriteString(w, "x")
			})
			f.do(t, req{keys: key("k")})
			r := f.do(t, req{keys: key("k")})
			if r.status != c.status {
				t.Fatalf("retry got %d", r.status)
			}
			want := int64(1)
			if !c.stored {
				want = 2
			}
			if f.calls.Load() != want {
				t.Fatalf("handler ran %d times, want %d", f.calls.Load(), want)
			}
			if c.stored != (r.header.Get(ReplayedHeader) == "true") {
				t.Fatalf("replayed %q, stored %v", r.header.Get(ReplayedHeader), c.stored)
			}
			if !c.stored {
				f.events.waitOutcome(t, Released)
			}
		})
	}
	t.Run("policy function", func(t *testing.T) {
		f := newFixture(t, &Options{StoreStatus: func(int) bool { return true }}, nil, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusInternalServerError)
		})
		f.do(t, req{keys: key("k")})
		if r := f.do(t, req{keys: key("k")}); r.status != 500 || r.header.Get(ReplayedHeader) != "true" || f.calls.Load() != 1 {
			t.Fatalf("500 not replayed under a store-everything policy: %d, calls %d", r.status, f.calls.Load())
		}
	})
}

// TestPanicReleasesKey: a handler that panics (with anything but
// http.ErrAbortHandler, see TestAbortHandlerKeepsClaim) gets its key
// released, and the panic goes on to net/http (which logs it).
func TestPanicReleasesKey(t *testing.T) {
	var panicked atomic.Bool
	f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
		if !panicked.Swap(true) {
			panic("idemhttp test: a deliberate panic")
		}
		created(w, r)
	})
	if _, err := f.try(req{keys: key("k")}); err == nil {
		t.Fatal("the aborted request got a response")
	}
	if r := f.do(t, req{keys: key("k")}); r.status != http.StatusCreated || r.header.Get(ReplayedHeader) != "" {
		t.Fatalf("retry after panic: %d %v", r.status, r.header)
	}
	f.events.waitOutcome(t, Released)
}

func TestHandlerSeesFencingToken(t *testing.T) {
	var token atomic.Uint64
	f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
		tok, _ := idempotency.TokenFrom(r.Context())
		token.Store(tok)
		w.WriteHeader(http.StatusNoContent)
	})
	f.do(t, req{keys: key("k")})
	if token.Load() == 0 {
		t.Fatal("no fencing token in the handler's context")
	}
}

func TestObserverSeesOutcomesWithLatency(t *testing.T) {
	b := newBlocker()
	close(b.release)
	f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(2 * time.Millisecond)
		created(w, r)
	})
	f.do(t, req{keys: key("a"), body: "1"})
	f.do(t, req{keys: key("a"), body: "1"})
	f.do(t, req{keys: key("a"), body: "2"})
	f.do(t, req{keys: key("")})
	want := []Outcome{Executed, Replayed, Conflict, BadRequest}
	deadline := time.Now().Add(5 * time.Second)
	for len(f.events.outcomes()) < len(want) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	got := f.events.outcomes()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("outcomes %v, want %v", got, want)
	}
	f.events.mu.Lock()
	defer f.events.mu.Unlock()
	if e := f.events.ev[0]; e.Latency < 2*time.Millisecond || e.Status != http.StatusCreated || e.Request == nil {
		t.Fatalf("executed event %+v", e)
	}
}

func TestNewValidatesOptions(t *testing.T) {
	g, err := idempotency.NewGuard(idempotency.NewMemoryStore(), nil)
	if err != nil {
		t.Fatal(err)
	}
	bad := map[string]*Options{
		"negative MaxBody":     {MaxBody: -1},
		"negative MaxStored":   {MaxStoredResponse: -1},
		"conflict status 400":  {ConflictStatus: 400},
		"negative wait":        {Wait: -time.Second},
		"negative retry-after": {UnavailableRetryAfter: -time.Second},
		"bad method":           {Methods: []string{"PO ST"}},
		"empty method":         {Methods: []string{""}},
		"bad header":           {FingerprintHeaders: []string{"Content:Type"}},
		"bad window header":    {WindowHeader: "Expires At"},
	}
	for name, o := range bad {
		if _, err := New(g, o); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("%s: err %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := New(nil, nil); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("nil guard: %v", err)
	}
	if _, err := New(&idempotency.Guard{}, nil); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("guard without store: %v", err)
	}
	if _, err := New(g, nil); err != nil {
		t.Errorf("defaults: %v", err)
	}
}

func TestCustomMethodsAndFingerprintHeaders(t *testing.T) {
	f := newFixture(t, &Options{Methods: []string{http.MethodPut}, FingerprintHeaders: []string{"x-account"}}, nil, created)
	acct := func(v string) http.Header { return http.Header{"X-Account": {v}, "Content-Type": {v}} }
	f.do(t, req{method: http.MethodPut, keys: key("k"), header: acct("a")})
	if r := f.do(t, req{method: http.MethodPut, keys: key("k"), header: acct("b")}); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("another X-Account with the same key: %d", r.status)
	}
	r := f.do(t, req{method: http.MethodPut, keys: key("k"), header: http.Header{"X-Account": {"a"}, "Content-Type": {"other"}}})
	if r.header.Get(ReplayedHeader) != "true" {
		t.Fatalf("Content-Type is no longer fingerprinted, yet the retry was not replayed: %d", r.status)
	}
	f.do(t, req{method: http.MethodPost, keys: key("k")})
	f.do(t, req{method: http.MethodPost, keys: key("k")})
	if f.calls.Load() != 3 {
		t.Fatalf("handler ran %d times, want 3 (POST unguarded)", f.calls.Load())
	}
}

func TestStoreFailsAfterTheHandlerRan(t *testing.T) {
	f := newFixture(t, nil, nil, created)
	f.store.Fault = func(op string) error {
		if op == "complete" {
			return errors.New("connection reset")
		}
		return nil
	}
	r := f.do(t, req{keys: key("k"), body: "b"})
	if r.status != http.StatusCreated || r.body != `{"echo":"b"}` {
		t.Fatalf("the handler's response was not delivered: %d %q", r.status, r.body)
	}
	e := f.events.waitOutcome(t, NotStored)
	if !errors.Is(e.Err, idempotency.ErrUnavailable) {
		t.Fatalf("event error %v", e.Err)
	}
	// The claim stays until its lease ends: a retry does not run again.
	if r := f.do(t, req{keys: key("k"), body: "b"}); r.status != http.StatusConflict {
		t.Fatalf("retry got %d, want 409", r.status)
	}
	if f.calls.Load() != 1 {
		t.Fatalf("handler ran %d times", f.calls.Load())
	}
}

// A status that is not stored releases the key; when the store refuses the
// release, the claim stays until its lease ends, and the Observer is told
// NotStored with the store's error, never Released.
func TestReleaseFailsAfterUnstoredStatus(t *testing.T) {
	f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	failReleases(f, -1)
	if r := f.do(t, req{keys: key("k"), body: "b"}); r.status != http.StatusServiceUnavailable {
		t.Fatalf("the handler's response was not delivered: %d %q", r.status, r.body)
	}
	e := f.events.waitOutcome(t, NotStored)
	if !errors.Is(e.Err, idempotency.ErrUnavailable) || !errors.Is(e.Err, errStatusRelease) || idempotency.IsRetryable(e.Err) {
		t.Fatalf("event error %v; want the status's and the store's, not Retryable", e.Err)
	}
	if r := f.do(t, req{keys: key("k"), body: "b"}); r.status != http.StatusConflict {
		t.Fatalf("retry got %d, want 409 (the claim was not released)", r.status)
	}
	if f.calls.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", f.calls.Load())
	}
}

// addOnWriteHeader is an outer wrapper that appends to the replay marker
// when the status is sent, as a logging or tagging middleware might.
type addOnWriteHeader struct{ http.ResponseWriter }

func (a addOnWriteHeader) WriteHeader(code int) {
	a.Header().Add(ReplayedHeader, "tagged")
	a.ResponseWriter.WriteHeader(code)
}

// The replay's marker and window fields share one backing array; an append
// to one must not write over the other.
func TestReplayAddedFieldsAreIndependent(t *testing.T) {
	g, err := idempotency.NewGuard(idempotency.NewMemoryStore(), nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(g, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(created))
	send := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader("{}"))
		r.Header.Set("Idempotency-Key", `"k"`)
		w := httptest.NewRecorder()
		h.ServeHTTP(addOnWriteHeader{w}, r)
		return w
	}
	first := send()
	window := first.Header().Get(DefaultWindowHeader)
	if _, err := http.ParseTime(window); err != nil {
		t.Fatalf("first window %q: %v", window, err)
	}
	second := send()
	if got := second.Header()[ReplayedHeader]; len(got) != 2 || got[0] != "true" || got[1] != "tagged" {
		t.Fatalf("replay marker %q, want [true tagged]", got)
	}
	if got := second.Header()[DefaultWindowHeader]; len(got) != 1 {
		t.Fatalf("window field %q after an append to the marker", got)
	} else if _, err := http.ParseTime(got[0]); err != nil {
		t.Fatalf("window field %q after an append to the marker: %v", got[0], err)
	}
}

// TestReplayContentLength: a replay is framed like the original: with
// Content-Length, also for a body larger than net/http's buffer (which
// would otherwise send it chunked), and without one where the status has
// no body.
func TestReplayContentLength(t *testing.T) {
	big := strings.Repeat("x", 5000)
	for _, tc := range []struct {
		status int
		body   string
		want   string
	}{
		{http.StatusCreated, big, "5000"},
		{http.StatusOK, "small", "5"},
		{http.StatusNoContent, "", ""},
	} {
		t.Run(strconv.Itoa(tc.status), func(t *testing.T) {
			f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
				if tc.body != "" {
					w.Header().Set("Content-Length", strconv.Itoa(len(tc.body)))
				}
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, tc.body)
			})
			first, second := replayed(t, f, req{})
			if cl := first.header.Get("Content-Length"); cl != tc.want {
				t.Fatalf("first Content-Length %q; want %q", cl, tc.want)
			}
			if cl := second.header.Get("Content-Length"); cl != tc.want {
				t.Fatalf("replayed Content-Length %q; want %q (first %q)", cl, tc.want, first.header.Get("Content-Length"))
			}
		})
	}
}
