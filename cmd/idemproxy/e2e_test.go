package main

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/archlab/idempotency/internal/testenv"
)

// TestKill9Restart kills the proxy with SIGKILL in the middle of a storm of
// new keys and restarts it on the same store (a bolt file, a Redis, a
// PostgreSQL schema): every request whose response reached its client must
// replay that response, without the upstream running again.
func TestKill9Restart(t *testing.T) {
	t.Run("bolt", func(t *testing.T) { kill9Restart(t, "bolt:"+filepath.Join(t.TempDir(), "idem.db")) })
	t.Run("redis", func(t *testing.T) { kill9Restart(t, redisTestStore(t)) })
	t.Run("postgres", func(t *testing.T) { kill9Restart(t, postgresTestStore(t)) })
}

func kill9Restart(t *testing.T, db string) {
	bin := binary(t)
	up := newUpstream(t)
	p := startProc(t, bin, "-upstream", up.URL, "-store", db, "-lease", "2s")

	type delivered struct{ key, body string }
	var (
		mu   sync.Mutex
		got  []delivered
		wg   sync.WaitGroup
		stop = make(chan struct{})
	)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &http.Client{Timeout: 5 * time.Second}
			for i := range 500 {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("w%d-%d", w, i)
				r, err := post(t, c, p.proxy, "/orders", key, key)
				if err != nil {
					return // the proxy is gone
				}
				if r.status == http.StatusCreated {
					mu.Lock()
					got = append(got, delivered{key, r.body})
					mu.Unlock()
				}
			}
		}()
	}
	time.Sleep(400 * time.Millisecond)
	p.signal(t, syscall.SIGKILL)
	p.wait(t, 10*time.Second)
	close(stop)
	wg.Wait()
	if len(got) == 0 {
		t.Fatal("no response was delivered before the kill; the storm was too short")
	}

	p2 := startProc(t, bin, "-upstream", up.URL, "-store", db, "-lease", "2s")
	for _, d := range got {
		r := mustPost(t, p2.proxy, "/orders", d.key, d.key)
		if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" || r.body != d.body {
			t.Fatalf("after restart key %s = %d %v %q; want the delivered %q replayed", d.key, r.status, r.header, r.body, d.body)
		}
		if n := up.ran(d.key); n != 1 {
			t.Fatalf("key %s ran %d times upstream; want 1", d.key, n)
		}
	}
	t.Logf("%d delivered responses replayed after SIGKILL and restart", len(got))
}

// TestSIGTERMDrains sends SIGTERM while a request is in flight: it still
// completes (and is stored), and the process exits cleanly.
func TestSIGTERMDrains(t *testing.T) {
	bin := binary(t)
	up := newUpstream(t)
	db := "bolt:" + filepath.Join(t.TempDir(), "idem.db")
	p := startProc(t, bin, "-upstream", up.URL, "-store", db)
	done := make(chan reply, 1)
	go func() {
		r, err := post(t, &http.Client{Timeout: 20 * time.Second}, p.proxy, "/orders?sleep=700ms", "drain", "x")
		if err != nil {
			r.body = err.Error()
		}
		done <- r
	}()
	deadline := time.Now().Add(10 * time.Second)
	for up.ran("drain") == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	p.signal(t, syscall.SIGTERM)
	r := <-done
	if r.status != http.StatusCreated {
		t.Fatalf("in-flight request during SIGTERM = %d %q; want 201", r.status, r.body)
	}
	p.wait(t, 15*time.Second)
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit code %d after SIGTERM; want 0\n%s", code, p.logs.String())
	}
	p2 := startProc(t, bin, "-upstream", up.URL, "-store", db)
	if r := mustPost(t, p2.proxy, "/orders?sleep=700ms", "drain", "x"); r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after restart = %d %v; want the drained response replayed", r.status, r.header)
	}
	if n := up.ran("drain"); n != 1 {
		t.Fatalf("upstream ran %d times; want 1", n)
	}
}

// fleet runs three proxies on one shared store and sends each key to all
// three at once: the upstream must run each key once.
func fleet(t *testing.T, store string) {
	bin := binary(t)
	up := newUpstream(t)
	var procs []*proc
	for range 3 {
		procs = append(procs, startProc(t, bin, "-upstream", up.URL, "-store", store, "-wait", "10s"))
	}
	for k := range 10 {
		key := fmt.Sprintf("fleet-%d", k)
		var wg sync.WaitGroup
		replies := make([]reply, 9)
		errs := make([]error, 9)
		for i := range replies {
			wg.Add(1)
			go func() {
				defer wg.Done()
				replies[i], errs[i] = post(t, &http.Client{Timeout: 20 * time.Second}, procs[i%3].proxy, "/orders?sleep=50ms", key, "body")
			}()
		}
		wg.Wait()
		for i, r := range replies {
			if errs[i] != nil || r.status != http.StatusCreated || r.body != replies[0].body {
				t.Fatalf("key %s reply %d (proxy %d) = %d %q %v; want 201 %q", key, i, i%3, r.status, r.body, errs[i], replies[0].body)
			}
		}
		if n := up.ran(key); n != 1 {
			t.Fatalf("key %s ran %d times across the fleet; want 1", key, n)
		}
	}
}

func TestFleetRedis(t *testing.T) { fleet(t, redisTestStore(t)) }

func TestFleetPostgres(t *testing.T) { fleet(t, postgresTestStore(t)) }

// redisTestStore returns a store URL on the shared test Redis with a key
// prefix of the test's own, whose keys are deleted when the test ends.
func redisTestStore(t *testing.T) string {
	t.Helper()
	base := testenv.RedisURL(t)
	prefix := fmt.Sprintf("idemproxy-test-%d:", time.Now().UnixNano())
	t.Cleanup(func() {
		opt, err := redis.ParseURL(base)
		if err != nil {
			return
		}
		c := redis.NewClient(opt)
		defer c.Close()
		ctx := context.Background()
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
	})
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	return base + sep + "prefix=" + prefix
}

// postgresTestStore returns a store URL on the shared test PostgreSQL with
// a schema of the test's own, dropped when the test ends.
func postgresTestStore(t *testing.T) string {
	t.Helper()
	url, _ := testenv.PostgresStoreURL(t, "idemproxy_test_")
	return url
}
