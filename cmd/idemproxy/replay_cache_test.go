package main

import (
	"context"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/archlab/idempotency/internal/testenv"
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
// where the store announces deletions (Redis, PostgreSQL), off elsewhere;
// 0 turns it off everywhere.
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

// TestReplayCachePostgres: on PostgreSQL, proxies with the default flags
// (-replay-cache auto) replay from memory, and a key deleted through one is
// forgotten by the others as PostgreSQL announces it (NOTIFY), not when
// their TTL runs out: a third instance whose TTL is an hour sees it
// within seconds too.
func TestReplayCachePostgres(t *testing.T) {
	up := newUpstream(t)
	store := postgresTestStore(t)
	a := startInproc(t, "-upstream", up.URL, "-store", store)
	b := startInproc(t, "-upstream", up.URL, "-store", store)
	c := startInproc(t, "-upstream", up.URL, "-store", store, "-replay-cache", "1h")

	first := mustPost(t, a.proxy, "/orders", "k1", "x")
	for _, p := range []*inproc{a, b, c} {
		for range 3 {
			if r := mustPost(t, p.proxy, "/orders", "k1", "x"); r.body != first.body {
				t.Fatalf("replay = %d %q, want %q", r.status, r.body, first.body)
			}
		}
		if got := metricValue(t, p.admin, "idemproxy_replay_cache_hits_total"); got < 1 {
			t.Errorf("replay cache hits = %v, want at least 1 of 3 replays", got)
		}
	}

	if r := do(t, http.MethodDelete, "http://"+b.admin+"/keys/k1"); r.status != http.StatusOK {
		t.Fatalf("DELETE through b = %d %q", r.status, r.body)
	}
	// a runs the key again (it forgot it, at the latest when its second
	// ran out); c, whose TTL is an hour, then replays that second run.
	for _, p := range []struct {
		name string
		p    *inproc
	}{{"a", a}, {"c", c}} {
		deadline := time.Now().Add(5 * time.Second)
		for {
			r := mustPost(t, p.p.proxy, "/orders", "k1", "x")
			if r.body != first.body {
				if !strings.Contains(r.body, "run 2") {
					t.Fatalf("%s after a delete through b = %q; want the second run", p.name, r.body)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s still replays a key deleted through b 5s later", p.name)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if up.ran("k1") != 2 {
		t.Fatalf("k1 ran %d times upstream, want 2", up.ran("k1"))
	}
}

// waitLog waits (bounded) until the proxy's log holds want.
func waitLog(t *testing.T, p *inproc, want string) string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		logs := p.logs.String()
		if strings.Contains(logs, want) {
			return logs
		}
		if time.Now().After(deadline) {
			t.Fatalf("the log does not say %q within 5s:\n%s", want, logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestReplayCacheFeedRefused: on Redis with an ACL user that may not use
// the deletion channel (Redis 7 users start without channels), the proxy
// still serves and deletes, with the cache bounded by its TTL, and says
// once, not at every retry, that the feed is down and why.
func TestReplayCacheFeedRefused(t *testing.T) {
	rs := startRedisServer(t)
	admin := redis.NewClient(&redis.Options{Addr: rs.addr})
	defer admin.Close()
	if err := admin.Do(context.Background(), "acl", "setuser", "nochan", "on", ">pw", "~*", "+@all", "resetchannels").Err(); err != nil {
		t.Fatal(err)
	}
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", "redis://nochan:pw@"+rs.addr+"/0")
	logs := waitLog(t, p, "deletion feed is down")
	if !strings.Contains(logs, "NOPERM") {
		t.Errorf("the warning does not say why:\n%s", logs)
	}
	first := mustPost(t, p.proxy, "/orders", "k", "x")
	if r := do(t, http.MethodDelete, "http://"+p.admin+"/keys/k"); r.status != http.StatusOK {
		t.Fatalf("DELETE = %d %q", r.status, r.body)
	}
	if r := mustPost(t, p.proxy, "/orders", "k", "x"); r.body == first.body || up.ran("k") != 2 {
		t.Fatalf("after the delete: %q, %d runs; want a second run", r.body, up.ran("k"))
	}
	// The watcher retries every second; the log says it once.
	time.Sleep(2500 * time.Millisecond)
	if n := strings.Count(p.logs.String(), "deletion feed is down"); n != 1 {
		t.Errorf("the feed's failure was logged %d times, want once:\n%s", n, p.logs.String())
	}
}

// TestReplayCacheFeedBack: with Redis down when the proxy starts, the feed
// is said to be down; once Redis is there the subscription is made and
// the log says so.
func TestReplayCacheFeedBack(t *testing.T) {
	addr := freeAddr(t) // nothing listens there yet
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", "redis://"+addr+"/0")
	waitLog(t, p, "deletion feed is down")
	startRedisAt(t, addr)
	waitLog(t, p, "deletion feed is subscribed again")
}

// startRedisAt starts a redis-server of the test's own on addr, killed
// when the test ends, and waits (bounded) until it answers.
func startRedisAt(t *testing.T, addr string) {
	t.Helper()
	_, port, _ := net.SplitHostPort(addr)
	dir := t.TempDir()
	cmd := exec.Command(testenv.Binary(t, "redis-server"), "--bind", "127.0.0.1", "--port", port, "--dir", dir,
		"--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction", "--logfile", dir+"/redis.log")
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 200 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not answer within 10s", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
