package main

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestReplayCache: with -replay-cache, replays come from memory (the cache
// counts them), a delete through this instance's admin API is seen at
// once, and one through another instance as soon as Redis announces it
// (not when the TTL, an hour, runs out).
func TestReplayCache(t *testing.T) {
	up := newUpstream(t)
	store := redisTestStore(t)
	a := startInproc(t, "-upstream", up.URL, "-store", store, "-replay-cache", "1h")
	b := startInproc(t, "-upstream", up.URL, "-store", store)

	first := mustPost(t, a.proxy, "/orders", "k1", "x")
	for range 3 {
		r := mustPost(t, a.proxy, "/orders", "k1", "x")
		if r.body != first.body || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("replay = %d %q %v; want %q replayed", r.status, r.body, r.header, first.body)
		}
	}
	if got := metricValue(t, a.admin, "idemproxy_replay_cache_hits_total"); got < 2 {
		t.Errorf("replay cache hits = %v, want at least 2 of 3 replays", got)
	}
	if up.ran("k1") != 1 {
		t.Fatalf("k1 ran %d times upstream", up.ran("k1"))
	}

	if r := do(t, http.MethodDelete, "http://"+a.admin+"/keys/k1"); r.status != http.StatusOK {
		t.Fatalf("DELETE through a = %d %q", r.status, r.body)
	}
	r := mustPost(t, a.proxy, "/orders", "k1", "x")
	if r.header.Get("Idempotent-Replayed") != "" || up.ran("k1") != 2 {
		t.Fatalf("after a delete through a: %q (replayed %q), %d runs; want a second run",
			r.body, r.header.Get("Idempotent-Replayed"), up.ran("k1"))
	}
	second := mustPost(t, a.proxy, "/orders", "k1", "x") // cached again
	if !strings.Contains(second.body, "run 2") {
		t.Fatalf("replay after the second run = %q", second.body)
	}

	// Deleted through b: Redis announces it, and a forgets it long before
	// its TTL (an hour) runs out.
	if r := do(t, http.MethodDelete, "http://"+b.admin+"/keys/k1"); r.status != http.StatusOK {
		t.Fatalf("DELETE through b = %d %q", r.status, r.body)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		r := mustPost(t, a.proxy, "/orders", "k1", "x")
		if r.body != second.body {
			if !strings.Contains(r.body, "run 3") {
				t.Fatalf("a after a delete through b = %q; want a third run", r.body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a still replays a key deleted through b 5s later")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if up.ran("k1") != 3 {
		t.Fatalf("k1 ran %d times upstream, want 3", up.ran("k1"))
	}
}

func TestReplayCacheFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-replay-cache", "-1s"},
		{"-replay-cache", "1s", "-replay-cache-size", "1000"},
		{"-replay-cache-size", "1000"}, // auto, the default
		{"-replay-cache", "sometimes"},
	} {
		var out syncBuffer
		_, err := parseConfig(append([]string{"-upstream", "http://127.0.0.1:1"}, args...), noEnv, &out)
		if err == nil || !strings.Contains(err.Error(), "replay-cache") {
			t.Errorf("%q: err = %v, want a usage error naming the flag", args, err)
		}
	}
	// On the memory store the flag is accepted and the cache not used.
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory", "-replay-cache", "1s")
	mustPost(t, p.proxy, "/orders", "k", "x")
	mustPost(t, p.proxy, "/orders", "k", "x")
	if r := get(t, "http://"+p.admin+"/metrics"); strings.Contains(r.body, "idemproxy_replay_cache") {
		t.Error("the memory store got a replay cache")
	}
}

// TestReplayCacheAdminDeleteOfKeyDeletedElsewhere: a key deleted through
// another instance keeps replaying here until the TTL runs out; an operator
// who then deletes it through this instance's admin API gets 404 (the
// store holds nothing) and this instance stops replaying it at once.
func TestReplayCacheAdminDeleteOfKeyDeletedElsewhere(t *testing.T) {
	up := newUpstream(t)
	store := redisTestStore(t)
	a := startInproc(t, "-upstream", up.URL, "-store", store, "-replay-cache", "1h")
	b := startInproc(t, "-upstream", up.URL, "-store", store)

	first := mustPost(t, a.proxy, "/orders", "k1", "x")
	if r := mustPost(t, a.proxy, "/orders", "k1", "x"); r.body != first.body { // cached
		t.Fatalf("replay = %q, want %q", r.body, first.body)
	}
	if r := do(t, http.MethodDelete, "http://"+b.admin+"/keys/k1"); r.status != http.StatusOK {
		t.Fatalf("DELETE through b = %d %q", r.status, r.body)
	}
	if r := do(t, http.MethodDelete, "http://"+a.admin+"/keys/k1"); r.status != http.StatusNotFound {
		t.Fatalf("DELETE through a of a key the store no longer holds = %d %q, want 404", r.status, r.body)
	}
	r := mustPost(t, a.proxy, "/orders", "k1", "x")
	if r.header.Get("Idempotent-Replayed") != "" || up.ran("k1") != 2 {
		t.Fatalf("a after the operator deleted the key through it: %q (replayed %q), %d runs; want a second run",
			r.body, r.header.Get("Idempotent-Replayed"), up.ran("k1"))
	}
}

// TestReplayCacheAuto: by default (-replay-cache auto) the cache is on
// where the store announces deletions (Redis), off elsewhere; 0 turns it
// off everywhere.
func TestReplayCacheAuto(t *testing.T) {
	up := newUpstream(t)
	for _, tc := range []struct {
		name  string
		args  []string
		cache bool
	}{
		{"redis", []string{"-store", redisTestStore(t)}, true},
		{"redis off", []string{"-store", redisTestStore(t), "-replay-cache", "0"}, false},
		{"bolt", []string{"-store", "bolt:" + filepath.Join(t.TempDir(), "a.db")}, false},
		{"bolt on", []string{"-store", "bolt:" + filepath.Join(t.TempDir(), "b.db"), "-replay-cache", "2s"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startInproc(t, append([]string{"-upstream", up.URL}, tc.args...)...)
			mustPost(t, p.proxy, "/orders", "k", "x")
			mustPost(t, p.proxy, "/orders", "k", "x")
			mustPost(t, p.proxy, "/orders", "k", "x")
			metrics := get(t, "http://"+p.admin+"/metrics").body
			if got := strings.Contains(metrics, "idemproxy_replay_cache_hits_total 1"); got != tc.cache {
				t.Errorf("replay cache used = %v, want %v", got, tc.cache)
			}
		})
	}
}
