package idemhttp

import (
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/archlab/idempotency"
)

// TestReplayContentTypeAsSniffedOnFirstChunk: net/http sniffs a missing
// Content-Type from the first chunk it sends. A handler that flushes before
// 512 bytes were written got a type sniffed from that prefix (or none at
// all, when it flushed before writing); the replay writes the whole body at
// once and must not be sniffed again into another type.
func TestReplayContentTypeAsSniffedOnFirstChunk(t *testing.T) {
	cases := []struct {
		name  string
		parts []string // a Flush follows each part but the last
	}{
		{"flush-before-write", []string{"", "late"}},
		{"flush-after-prefix", []string{"<html", "><body>hi</body></html>"}},
		{"no-flush", []string{"<html><body>hi</body></html>"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
				for i, p := range tc.parts {
					_, _ = io.WriteString(w, p)
					if i < len(tc.parts)-1 {
						w.(http.Flusher).Flush()
					}
				}
			})
			first, second := replayed(t, f, req{})
			got, ok := second.header["Content-Type"]
			want, wantOK := first.header["Content-Type"]
			if ok != wantOK || len(got) != len(want) || (ok && got[0] != want[0]) {
				t.Fatalf("replay Content-Type %q (present %v), first %q (present %v)", got, ok, want, wantOK)
			}
		})
	}
}

// TestReplayHasNoTrailerDeclaredAfterWriteHeader: a Trailer field declared
// after the status was written is ignored by net/http, so the client got no
// trailer; the replay must not add one.
func TestReplayHasNoTrailerDeclaredAfterWriteHeader(t *testing.T) {
	f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		w.Header().Set("Trailer", "X-Late")
		_, _ = io.WriteString(w, "body")
		w.Header().Set("X-Late", "v")
	})
	first, second := replayed(t, f, req{})
	if len(first.trail) != 0 {
		t.Fatalf("first response has trailers %v; the test assumes net/http ignores a late declaration", first.trail)
	}
	if len(second.trail) != 0 || second.header.Get("Trailer") != "" {
		t.Fatalf("replay has trailers %v (Trailer %q), the first had none", second.trail, second.header.Get("Trailer"))
	}
}

// TestReplayUndeclaredTrailerOnlyWhenSent: a trailer set with
// http.TrailerPrefix alone reaches the client only if the response went out
// chunked; a small body that net/http sent with a Content-Length carries
// none, and neither may its replay.
func TestReplayUndeclaredTrailerOnlyWhenSent(t *testing.T) {
	f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "small")
		w.Header().Set(http.TrailerPrefix+"X-Sum", "v")
	})
	first, second := replayed(t, f, req{})
	if got, want := second.trail.Get("X-Sum"), first.trail.Get("X-Sum"); got != want {
		t.Fatalf("replay trailer X-Sum %q, first %q", got, want)
	}
}

// A trailer set with http.TrailerPrefix before the status makes net/http
// send even a small body chunked, with the trailer: the replay carries it.
func TestReplayPrefixTrailerSetBeforeStatus(t *testing.T) {
	f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(http.TrailerPrefix+"X-Sum", "abc")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "small")
	})
	first, second := replayed(t, f, req{})
	if got := first.trail.Get("X-Sum"); got != "abc" {
		t.Fatalf("first response trailer X-Sum %q, want abc (net/http behaviour changed?)", got)
	}
	if got := second.trail.Get("X-Sum"); got != "abc" {
		t.Errorf("replay trailer X-Sum %q, want abc as first sent", got)
	}
}

// TestOuterBodyLimitIs413: a body cut off by an outer http.MaxBytesReader
// is too large, not unreadable: 413 request-too-large, and nothing runs.
func TestOuterBodyLimitIs413(t *testing.T) {
	f := newFixture(t, nil, nil, created)
	inner := f.srv.Config.Handler
	f.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 10)
		inner.ServeHTTP(w, r)
	})
	got := f.do(t, req{keys: key("k"), body: strings.Repeat("x", 100)})
	p := got.problem(t)
	if got.status != http.StatusRequestEntityTooLarge || p.Type != ProblemBodyTooLarge.Type {
		t.Fatalf("%d %+v, want 413 %s", got.status, p, ProblemBodyTooLarge.Type)
	}
	if f.calls.Load() != 0 {
		t.Fatalf("handler ran %d times", f.calls.Load())
	}
	if o := f.events.outcomes(); len(o) != 1 || o[0] != TooLarge {
		t.Fatalf("outcomes %v, want [%s]", o, TooLarge)
	}
}

// A response that is not stored releases the key; when that release fails
// the key stays claimed until its lease ends, and the observer must not be
// told it was released.
func TestFailedReleaseNotObservedAsReleased(t *testing.T) {
	f := newFixture(t, nil, nil, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable) // not stored: release
	})
	f.store.Fault = func(op string) error {
		if op == "release" {
			return errors.New("release refused")
		}
		return nil
	}
	if r := f.do(t, req{keys: key(`"k"`)}); r.status != http.StatusServiceUnavailable {
		t.Fatalf("status %d", r.status)
	}
	e := f.events.waitOutcome(t, NotStored)
	if !errors.Is(e.Err, idempotency.ErrUnavailable) {
		t.Errorf("event error %v, want the release's ErrUnavailable", e.Err)
	}
	if got := f.events.outcomes(); slices.Contains(got, Released) {
		t.Errorf("outcomes %v: a failed release was observed as released", got)
	}
	// The key is indeed still held.
	if r := f.do(t, req{keys: key(`"k"`)}); r.status != http.StatusConflict {
		t.Errorf("retry after the failed release: %d, want 409 in flight", r.status)
	}
}
