package idemhttp

import (
	"net/http"
	"testing"
)

// TestStoreHeaderIgnoresNameCase: a handler that sets a field under a name
// that is not canonical (w.Header()["set-cookie"]) still sends that field;
// field names are case-insensitive. The storage policy must apply to it all
// the same: a session cookie is not stored nor handed out again, whatever
// the case of its name, over HTTP/1.1 and HTTP/2.
func TestStoreHeaderIgnoresNameCase(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(map[bool]string{false: "http1", true: "http2"}[h2], func(t *testing.T) {
			f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
				w.Header()["set-cookie"] = []string{"session=s3cret"}
				w.Header()["x-order"] = []string{"42"}
				w.WriteHeader(http.StatusCreated)
			})
			if h2 {
				f.serveHTTP2(t)
			}
			first, second := replayed(t, f, req{})
			if want := map[bool]int{false: 1, true: 2}[h2]; first.proto != want {
				t.Fatalf("served over HTTP/%d, want HTTP/%d", first.proto, want)
			}
			if first.header.Get("Set-Cookie") != "session=s3cret" {
				t.Fatalf("first response lacks the cookie: %v", first.header)
			}
			if c := second.header.Values("Set-Cookie"); len(c) != 0 {
				t.Fatalf("replay hands the session cookie out again: %q", c)
			}
			if second.header.Get("X-Order") != "42" {
				t.Fatalf("replay lost a field named in lower case: %v", second.header)
			}
		})
	}
}
