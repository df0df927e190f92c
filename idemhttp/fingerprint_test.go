package idemhttp

import (
	"crypto/sha256"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
)

func newFingerprinter() *fingerprinter { return &fingerprinter{h: sha256.New()} }

func fpOf(f *fingerprinter, method, path, query, ct string, body []byte) string {
	r := &http.Request{Method: method, URL: &url.URL{Path: path, RawQuery: query}, Header: http.Header{}}
	if ct != "" {
		r.Header["Content-Type"] = []string{ct}
	}
	return f.fingerprint(r, []string{"Content-Type"}, body)
}

func TestFingerprintCanonicalization(t *testing.T) {
	f := newFingerprinter()
	base := fpOf(f, "POST", "/p", "a=1&b=2", "text/plain", []byte("x"))
	same := map[string]string{
		"reordered pairs": fpOf(f, "POST", "/p", "b=2&a=1", "text/plain", []byte("x")),
		"escaped name":    fpOf(f, "POST", "/p", "%61=1&b=2", "text/plain", []byte("x")),
		"empty pairs":     fpOf(f, "POST", "/p", "&a=1&&b=2&", "text/plain", []byte("x")),
	}
	for name, fp := range same {
		if fp != base {
			t.Errorf("%s changed the fingerprint", name)
		}
	}
	differ := map[string]string{
		"method":        fpOf(f, "PATCH", "/p", "a=1&b=2", "text/plain", []byte("x")),
		"path":          fpOf(f, "POST", "/q", "a=1&b=2", "text/plain", []byte("x")),
		"query value":   fpOf(f, "POST", "/p", "a=1&b=3", "text/plain", []byte("x")),
		"extra pair":    fpOf(f, "POST", "/p", "a=1&b=2&c", "text/plain", []byte("x")),
		"content type":  fpOf(f, "POST", "/p", "a=1&b=2", "application/json", []byte("x")),
		"no type":       fpOf(f, "POST", "/p", "a=1&b=2", "", []byte("x")),
		"body":          fpOf(f, "POST", "/p", "a=1&b=2", "text/plain", []byte("y")),
		"no body":       fpOf(f, "POST", "/p", "a=1&b=2", "text/plain", nil),
		"shifted field": fpOf(f, "POS", "T/p", "a=1&b=2", "text/plain", []byte("x")),
		"value order":   fpOf(f, "POST", "/p", "a=1&b=2&a=0", "text/plain", []byte("x")),
	}
	// A pair that does not decode is kept as sent, and is not the pair that
	// decodes to the same text: net/http's URL.Query drops the first and
	// keeps the second, so a handler would see two different requests.
	if fpOf(f, "POST", "/p", "a=%zz", "", nil) == fpOf(f, "POST", "/p", "a=%25zz", "", nil) {
		t.Error("an undecodable pair and its escaped twin share a fingerprint")
	}
	for name, fp := range differ {
		if fp == base {
			t.Errorf("%s did not change the fingerprint", name)
		}
	}
	if fpOf(f, "POST", "/p", "a=1&a=2", "", nil) == fpOf(f, "POST", "/p", "a=2&a=1", "", nil) {
		t.Error("the order of one name's values was lost")
	}
	if len(base) != 64 || strings.Trim(base, "0123456789abcdef") != "" {
		t.Errorf("fingerprint %q is not hex SHA-256", base)
	}
}

func FuzzFingerprint(f *testing.F) {
	f.Add("POST", "/orders", "b=2&a=1", "application/json", []byte(`{"amount":1}`))
	f.Add("PATCH", "/a%2Fb", "x=%zz&y", "", []byte{})
	f.Add("POST", "", "a=1&a=2;b", "text/plain", []byte("\x00\xff"))
	fp1, fp2 := newFingerprinter(), newFingerprinter()
	f.Fuzz(func(t *testing.T, method, path, query, ct string, body []byte) {
		a := fpOf(fp1, method, path, query, ct, body)
		if b := fpOf(fp2, method, path, query, ct, body); a != b || len(a) != 64 {
			t.Fatalf("fingerprint not deterministic: %q, %q", a, b)
		}
		pairs := canonicalQuery(nil, query)
		if !slices.IsSortedFunc(pairs, func(x, y queryPair) int { return strings.Compare(x.name, y.name) }) {
			t.Fatalf("pairs of %q not sorted: %+v", query, pairs)
		}
		// Reversing the pairs keeps the fingerprint when every name is
		// distinct (with a repeated name, value order is meaningful).
		parts := strings.Split(query, "&")
		slices.Reverse(parts)
		names := map[string]bool{}
		distinct := true
		for _, p := range pairs {
			distinct = distinct && !names[p.name]
			names[p.name] = true
		}
		if distinct {
			if r := fpOf(fp1, method, path, strings.Join(parts, "&"), ct, body); r != a {
				t.Fatalf("reversed query %q changed the fingerprint", query)
			}
		}
		if fpOf(fp1, method, path, query, ct, append(slices.Clip(body), 0)) == a {
			t.Fatal("a longer body kept the fingerprint")
		}
		if path != "" && fpOf(fp1, method+path[:1], path[1:], query, ct, body) == a {
			t.Fatal("moving a byte from path to method kept the fingerprint")
		}
		// A request target and its twin with '%' (path) or ';' (query)
		// escaped: whenever the handler sees them differently (URL.Path,
		// URL.Query), their fingerprints differ.
		target := "/" + path + "?" + query
		twin := "/" + strings.ReplaceAll(path, "%", "%25") + "?" + strings.ReplaceAll(query, ";", "%3B")
		u1, err1 := url.ParseRequestURI(target)
		u2, err2 := url.ParseRequestURI(twin)
		if err1 != nil || err2 != nil {
			return
		}
		if u1.Path == u2.Path && maps.EqualFunc(u1.Query(), u2.Query(), slices.Equal) {
			return
		}
		if fpOfURL(fp1, method, u1, ct, body) == fpOfURL(fp2, method, u2, ct, body) {
			t.Fatalf("%q and %q share a fingerprint; the handler sees paths %q, %q and queries %v, %v",
				target, twin, u1.Path, u2.Path, u1.Query(), u2.Query())
		}
	})
}

// fpOfURL is fpOf for a parsed request target.
func fpOfURL(f *fingerprinter, method string, u *url.URL, ct string, body []byte) string {
	r := &http.Request{Method: method, URL: u, Header: http.Header{}}
	if ct != "" {
		r.Header["Content-Type"] = []string{ct}
	}
	return f.fingerprint(r, []string{"Content-Type"}, body)
}
