package idemhttp

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// TestProblemDetails: the problems a client can act on say what to do in
// their detail, a reused key names the parts of the request compared (the
// fingerprint's headers as configured), and every problem body ends with a
// newline. (Key-reused, in-flight, missing-key and unavailable had no
// detail: a client could not tell which part of its request differed.)
func TestProblemDetails(t *testing.T) {
	f := newFixture(t, &Options{Required: true, FingerprintHeaders: []string{"content-type", "x-tenant"}}, nil, created)
	if r := f.do(t, req{keys: key("a"), body: "one"}); r.status != http.StatusCreated {
		t.Fatalf("first request: %d %s", r.status, r.body)
	}
	r := f.do(t, req{keys: key("a"), body: "two"})
	p := r.problem(t)
	if p.Type != ProblemKeyReused.Type || !strings.Contains(p.Detail, "method, path, query, Content-Type, X-Tenant or body differ") {
		t.Errorf("reused key: %+v; want a detail naming method, path, query, Content-Type, X-Tenant and body", p)
	}
	if !strings.HasSuffix(r.body, "}\n") || r.header.Get("Content-Length") != "" && r.header.Get("Content-Length") != strconv.Itoa(len(r.body)) {
		t.Errorf("problem body %q (Content-Length %s): want it to end with a newline, counted", r.body, r.header.Get("Content-Length"))
	}
	if p := f.do(t, req{body: "x"}).problem(t); p.Type != ProblemMissingKey.Type || !strings.Contains(p.Detail, "Idempotency-Key header field") {
		t.Errorf("missing key: %+v; want a detail saying to send the field", p)
	}
	for _, p := range []Problem{ProblemInFlight, ProblemUnavailable} {
		if !strings.Contains(p.Detail, "Retry-After") {
			t.Errorf("%s: detail %q; want it to point at Retry-After", p.Type, p.Detail)
		}
	}
}
