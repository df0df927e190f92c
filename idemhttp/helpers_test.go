package idemhttp

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

// fixture is a guarded handler served on loopback.
type fixture struct {
	srv    *httptest.Server
	store  *idempotency.MemoryStore
	guard  *idempotency.Guard
	mw     *Middleware
	calls  atomic.Int64
	events eventLog
}

type eventLog struct {
	mu sync.Mutex
	ev []Event
}

func (l *eventLog) Observe(e Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ev = append(l.ev, e)
}

func (l *eventLog) outcomes() []Outcome {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Outcome
	for _, e := range l.ev {
		out = append(out, e.Outcome)
	}
	return out
}

// waitOutcome waits (bounded) until an event with outcome o was observed.
func (l *eventLog) waitOutcome(t *testing.T, o Outcome) Event {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		l.mu.Lock()
		for _, e := range l.ev {
			if e.Outcome == o {
				l.mu.Unlock()
				return e
			}
		}
		l.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no %q event; got %v", o, l.outcomes())
	return Event{}
}

// newFixture serves h (counted) behind a middleware built with opts on a
// fresh MemoryStore. gopts configures the Guard (nil: defaults).
func newFixture(t *testing.T, opts *Options, gopts *idempotency.Options, h http.HandlerFunc) *fixture {
	t.Helper()
	f := &fixture{store: idempotency.NewMemoryStore()}
	g, err := idempotency.NewGuard(f.store, gopts)
	if err != nil {
		t.Fatal(err)
	}
	f.guard = g
	o := Options{}
	if opts != nil {
		o = *opts
	}
	if o.Observer == nil {
		o.Observer = &f.events
	}
	f.mw, err = New(g, &o)
	if err != nil {
		t.Fatal(err)
	}
	f.srv = httptest.NewServer(f.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.calls.Add(1)
		h(w, r)
	})))
	t.Cleanup(f.srv.Close)
	return f
}

// serveHTTP2 moves the fixture's handler to a TLS server that speaks
// HTTP/2; f.do then reaches it over HTTP/2.
func (f *fixture) serveHTTP2(t *testing.T) {
	t.Helper()
	h := f.srv.Config.Handler
	f.srv.Close()
	f.srv = httptest.NewUnstartedServer(h)
	f.srv.EnableHTTP2 = true
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
}

type reply struct {
	status int
	header http.Header
	body   string
	trail  http.Header
	proto  int // the response's HTTP major version
}

func (r reply) problem(t *testing.T) Problem {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json (status %d, body %q)", ct, r.status, r.body)
	}
	var p Problem
	if err := json.Unmarshal([]byte(r.body), &p); err != nil {
		t.Fatalf("problem body %q: %v", r.body, err)
	}
	if p.Status != r.status {
		t.Fatalf("problem status %d, response status %d", p.Status, r.status)
	}
	return p
}

type req struct {
	method string // POST if empty
	path   string // / if empty
	keys   []string
	body   string
	header http.Header
	ctx    context.Context
}

// key is the common case: one Idempotency-Key field.
func key(k string) []string { return []string{k} }

func (f *fixture) do(t *testing.T, q req) reply {
	t.Helper()
	r, err := f.try(q)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (f *fixture) try(q req) (reply, error) {
	if q.method == "" {
		q.method = http.MethodPost
	}
	if q.path == "" {
		q.path = "/"
	}
	ctx := q.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	r, err := http.NewRequestWithContext(ctx, q.method, f.srv.URL+q.path, strings.NewReader(q.body))
	if err != nil {
		return reply{}, err
	}
	for k, v := range q.header {
		r.Header[k] = v
	}
	if q.keys != nil {
		r.Header["Idempotency-Key"] = q.keys
	}
	resp, err := f.srv.Client().Do(r)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: string(b), trail: resp.Trailer, proto: resp.ProtoMajor}, nil
}

// created is a handler answering 201 with a JSON body naming the call.
func created(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Order", "42")
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, `{"echo":`+string(mustJSON(string(b)))+`}`)
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
