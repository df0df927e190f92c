package idemhttp

import (
	"fmt"
	"net/http"
	"testing"
)

// echoURL answers 201 with the path and query the handler sees.
func echoURL(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "path=%q query=%v", r.URL.Path, r.URL.Query())
}

// TestFingerprintTellsRequestTargetsApart sends one key and body to two
// request targets over a real server. Targets the handler sees alike
// (r.URL.Path and r.URL.Query) are one request and replay; targets it sees
// differently must conflict, never replay the other's response.
func TestFingerprintTellsRequestTargetsApart(t *testing.T) {
	for _, tc := range []struct {
		name, first, second string
		same                bool
	}{
		// Path "/a/b" and path "/a%2Fb": the first sends its slash escaped
		// (RawPath), the second its percent sign.
		{"escaped slash vs escaped percent", "/a%2Fb", "/a%252Fb", false},
		{"escaped letter vs escaped percent", "/%41", "/%2541", false},
		{"trailing slash", "/a", "/a/", false},
		{"double slash", "/a", "//a", false},
		// URL.Query drops a pair holding a semicolon, and keeps one with
		// the semicolon escaped.
		{"semicolon vs escaped semicolon in value", "/?a=1;b=2", "/?a=1%3Bb=2", false},
		{"semicolon vs escaped semicolon in name", "/?a;b=1", "/?a%3Bb=1", false},
		{"repeated name order", "/?a=1&a=2", "/?a=2&a=1", false},
		{"reordered names", "/?a=1&b=2", "/?b=2&a=1", true},
		{"plus vs %20", "/?a=x+y", "/?a=x%20y", true},
		{"escaped letter in query", "/?a=%41", "/?a=A", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, nil, nil, echoURL)
			first := f.do(t, req{path: tc.first, keys: key("k"), body: "same"})
			second := f.do(t, req{path: tc.second, keys: key("k"), body: "same"})
			replayed := second.header.Get(ReplayedHeader) == "true"
			switch {
			case tc.same && !replayed:
				t.Fatalf("%s then %s: second got %d %q, want a replay", tc.first, tc.second, second.status, second.body)
			case !tc.same && replayed:
				t.Fatalf("%s then %s: second replayed the first's response %q; want 422", tc.first, tc.second, first.body)
			case !tc.same && second.status != http.StatusUnprocessableEntity:
				t.Fatalf("%s then %s: second got %d %q, want 422", tc.first, tc.second, second.status, second.body)
			}
		})
	}
}
