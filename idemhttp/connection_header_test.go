package idemhttp

import (
	"context"
	"crypto/sha256"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/archlab/idempotency"
)

// TestConnectionNamedFieldsNotStored: a field that the response's
// Connection field names is hop-by-hop (RFC 9110, 7.6.1): it is meant for
// the one connection it went out on, and is neither stored nor replayed,
// whatever the case of either name and whatever the StoreHeader policy
// (which sees one name at a time and cannot tell). Connection itself is
// never stored either. The live response is left to net/http, which sends
// the fields as the handler set them.
func TestConnectionNamedFieldsNotStored(t *testing.T) {
	storeAll := func(string) bool { return true }
	for _, tc := range []struct {
		name  string
		opts  *Options
		set   func(h http.Header)
		hop   []string // canonical names of the fields that must not be replayed
		keep  []string // canonical names of the fields that must be
		first []string // fields the first response must carry (HTTP/1)
	}{{
		name: "canonical",
		set: func(h http.Header) {
			h.Set("Connection", "X-Trace-Hop")
			h.Set("X-Trace-Hop", "1")
		},
		hop: []string{"X-Trace-Hop", "Connection"}, first: []string{"X-Trace-Hop"},
	}, {
		name: "names in any case, several fields and values",
		set: func(h http.Header) {
			h["connection"] = []string{"x-trace-hop ,  keep-alive", "X-OTHER-HOP"}
			h["x-trace-hop"] = []string{"1"}
			h.Set("X-Other-Hop", "2")
		},
		hop: []string{"X-Trace-Hop", "X-Other-Hop", "Connection"}, first: []string{"X-Other-Hop"},
	}, {
		name: "a StoreHeader policy that stores everything",
		opts: &Options{StoreHeader: storeAll},
		set: func(h http.Header) {
			h.Set("Connection", "X-Trace-Hop")
			h.Set("X-Trace-Hop", "1")
		},
		hop: []string{"X-Trace-Hop", "Connection"}, first: []string{"X-Trace-Hop"},
	}, {
		name: "an empty Connection field names nothing",
		set: func(h http.Header) {
			h["Connection"] = []string{"", " , "}
		},
		hop: []string{"Connection"},
	}} {
		for _, h2 := range []bool{false, true} {
			t.Run(tc.name+map[bool]string{false: "/http1", true: "/http2"}[h2], func(t *testing.T) {
				f := newFixture(t, tc.opts, nil, func(w http.ResponseWriter, r *http.Request) {
					tc.set(w.Header())
					w.Header().Set("X-Order", "42")
					w.WriteHeader(http.StatusCreated)
					_, _ = w.Write([]byte("done"))
				})
				if h2 {
					f.serveHTTP2(t)
				}
				first, second := replayed(t, f, req{body: "b"})
				if !h2 {
					for _, name := range tc.first {
						if first.header.Get(name) == "" {
							t.Errorf("the first response lacks %s: %v", name, first.header)
						}
					}
				}
				for _, name := range tc.hop {
					if v := second.header.Values(name); len(v) != 0 {
						t.Errorf("the replay carries the hop-by-hop %s: %q", name, v)
					}
				}
				if second.header.Get("X-Order") != "42" {
					t.Errorf("the replay lost X-Order: %v", second.header)
				}
			})
		}
	}
}

// TestReplayDropsStoredConnectionFields: a record stored before
// Connection was always left out (by a StoreHeader policy that kept it)
// holds Connection and the fields it names; they are not replayed.
func TestReplayDropsStoredConnectionFields(t *testing.T) {
	f := newFixture(t, nil, nil, created)
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("b"))
	fp := (&fingerprinter{h: sha256.New()}).fingerprint(r, []string{"Content-Type"}, []byte("b"))
	ctx := context.Background()
	_, _, err := f.guard.Do(ctx, StoreKey("", "k"), fp, func(context.Context) (idempotency.Response, error) {
		return idempotency.Response{Status: http.StatusCreated, Header: map[string][]string{
			"Connection":  {"x-trace-hop, Keep-Alive"},
			"X-Trace-Hop": {"1"},
			"Keep-Alive":  {"timeout=5"},
			"X-Order":     {"42"},
		}, Body: []byte("old")}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got := f.do(t, req{keys: key("k"), body: "b"})
	if got.header.Get(ReplayedHeader) != "true" || got.body != "old" {
		t.Fatalf("not the stored response: %d %v %q", got.status, got.header, got.body)
	}
	for _, name := range []string{"Connection", "X-Trace-Hop", "Keep-Alive"} {
		if v := got.header.Values(name); len(v) != 0 {
			t.Errorf("the replay carries the hop-by-hop %s: %q", name, v)
		}
	}
	if got.header.Get("X-Order") != "42" {
		t.Errorf("the replay lost X-Order: %v", got.header)
	}
	if n := f.calls.Load(); n != 0 {
		t.Errorf("the handler ran %d times; want a replay", n)
	}
}
