package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/redis/go-redis/v9"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/testenv"
)

// TestPipelineFaultsOwnAnswers: many callers with deadlines from a few
// milliseconds up, so that some run out while their batch is on the wire,
// go through TCP faults (replies cut into slices and delayed, connections
// reset or closed after some bytes, black holes). Every answer a caller
// gets must be its own (its key is its fingerprint and its body), every
// failure must be ErrUnavailable (or, before anything was sent, its ctx's
// error), and every write reported done must be found once the faults are
// gone.
func TestPipelineFaultsOwnAnswers(t *testing.T) {
	// Private servers behind toxiproxies, reached as one node, as a
	// Cluster (a fixed slot map over the proxies: no MOVED) and as a Ring.
	servers := func(t *testing.T, n int) proxied {
		var su proxied
		for range n {
			ps := startPrivateServer(t)
			su.direct = append(su.direct, ps.client(t))
			su.proxies = append(su.proxies, testenv.Toxiproxy(t, "redis", ps.addr()))
		}
		return su
	}
	for _, tc := range []struct {
		name string
		make func(t *testing.T) proxied
	}{
		{"single", func(t *testing.T) proxied {
			su := servers(t, 1)
			su.c = newClient(t, &redis.Options{Addr: su.proxies[0].Listen, PoolSize: 8, DialTimeout: 200 * time.Millisecond})
			return su
		}},
		{"cluster", func(t *testing.T) proxied {
			su := servers(t, 2)
			c := redis.NewClusterClient(&redis.ClusterOptions{
				ContextTimeoutEnabled: true, PoolSize: 8, DialTimeout: 200 * time.Millisecond,
				ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
					return []redis.ClusterSlot{
						{Start: 0, End: 8191, Nodes: []redis.ClusterNode{{Addr: su.proxies[0].Listen}}},
						{Start: 8192, End: 16383, Nodes: []redis.ClusterNode{{Addr: su.proxies[1].Listen}}},
					}, nil
				},
			})
			t.Cleanup(func() { c.Close() })
			su.c = c
			return su
		}},
		{"ring", func(t *testing.T) proxied {
			su := servers(t, 2)
			r := redis.NewRing(&redis.RingOptions{
				Addrs:                 map[string]string{"a": su.proxies[0].Listen, "b": su.proxies[1].Listen},
				ContextTimeoutEnabled: true, PoolSize: 8, DialTimeout: 200 * time.Millisecond,
			})
			t.Cleanup(func() { r.Close() })
			su.c = r
			return su
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { pipelineFaults(t, tc.make(t)) })
	}
}

// proxied is a client of private servers through toxiproxies.
type proxied struct {
	c       redis.UniversalClient
	direct  []*redis.Client // the servers, without faults
	proxies []*toxiproxy.Proxy
}

func pipelineFaults(t *testing.T, su proxied) {
	s := newStore(t, su.c, Options{OpTimeout: 400 * time.Millisecond, Logger: discard()})

	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	var (
		mu        sync.Mutex
		completed = map[string]bool{} // Complete returned nil
		claimed   = map[string]bool{} // Begin claimed, Complete not known done
		wrong     atomic.Int32
		failures  atomic.Int32
		oks       atomic.Int32
	)
	bad := func(format string, args ...any) {
		if wrong.Add(1) <= 10 {
			t.Errorf(format, args...)
		}
	}
	// check classifies an error: nil is fine, ErrUnavailable is fine, a
	// ctx error is fine when ctx had ended; anything else is a fault.
	check := func(ctx context.Context, op, key string, err error) bool {
		switch {
		case err == nil:
			oks.Add(1)
			return true
		case errors.Is(err, idempotency.ErrUnavailable):
		case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		default:
			bad("%s(%s) = %v; want nil or ErrUnavailable", op, key, err)
		}
		failures.Add(1)
		return false
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 24 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(w)))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := "w" + strconv.Itoa(w) + "-" + strconv.Itoa(i)
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(2+r.IntN(200))*time.Millisecond)
				rec, ok, err := s.Begin(ctx, key, key, time.Now(), time.Minute, time.Hour)
				if !check(ctx, "Begin", key, err) {
					cancel()
					continue
				}
				if !ok || rec.Fingerprint != key || rec.State != idempotency.Processing {
					bad("Begin(%s) on a fresh key = %v, %+v; want its own claim", key, ok, rec)
					cancel()
					continue
				}
				mu.Lock()
				claimed[key] = true
				mu.Unlock()
				err = s.Complete(ctx, key, rec.Token, idempotency.Response{Status: 200, Body: []byte(key)}, time.Now(), time.Hour)
				if check(ctx, "Complete", key, err) {
					mu.Lock()
					completed[key] = true
					mu.Unlock()
				}
				got, err := s.Get(ctx, key, time.Now())
				if check(ctx, "Get", key, err) && got.Fingerprint != key {
					bad("Get(%s) answered the record of %q", key, got.Fingerprint)
				}
				rep, ok, err := s.Begin(ctx, key, key, time.Now(), time.Minute, time.Hour)
				if check(ctx, "Begin again", key, err) {
					if ok || rep.Fingerprint != key || (rep.State == idempotency.Done && string(rep.Response.Body) != key) {
						bad("second Begin(%s) = %v, %+v; want its own record, not claimed", key, ok, rep)
					}
				}
				cancel()
			}
		})
	}
	toxics := []string{
		`{"name":"t","type":"slicer","stream":"downstream","attributes":{"average_size":7,"size_variation":5,"delay":300}}`,
		`{"name":"t","type":"latency","stream":"downstream","attributes":{"latency":40,"jitter":40}}`,
		`{"name":"t","type":"limit_data","stream":"downstream","attributes":{"bytes":300}}`,
		`{"name":"t","type":"reset_peer","stream":"upstream","attributes":{"timeout":20}}`,
		`{"name":"t","type":"timeout","stream":"downstream","attributes":{"timeout":50}}`,
		`{"name":"t","type":"slicer","stream":"upstream","attributes":{"average_size":5,"size_variation":4,"delay":200}}`,
	}
	rng := rand.New(rand.NewPCG(seed, 99))
	for range 2 {
		for _, i := range rng.Perm(len(toxics)) {
			time.Sleep(50 * time.Millisecond)
			for _, p := range su.proxies {
				testenv.AddToxic(t, p, toxics[i])
			}
			time.Sleep(150 * time.Millisecond)
			for _, p := range su.proxies {
				testenv.RemoveToxic(p, "t")
			}
		}
	}
	close(stop)
	hangGuard(t, 30*time.Second, "workers", wg.Wait)
	idle(t, s)
	t.Logf("%d calls answered, %d failed; %d batches carried %d operations", oks.Load(), failures.Load(), s.batches.Load(), s.batchedOps.Load())
	if s.batches.Load() == 0 || failures.Load() == 0 || len(completed) == 0 {
		t.Fatal("no batch, no failure or no completed key: the test proved nothing")
	}
	// Every write reported done is there.
	ctx := context.Background()
	// The records, read on the servers without the store's routing: each
	// key's is on exactly one.
	var direct []*Store
	for _, c := range su.direct {
		direct = append(direct, newStore(t, c, Options{Prefix: s.prefix, Logger: discard()}))
	}
	get := func(key string) (idempotency.Record, error) {
		var found []idempotency.Record
		for _, d := range direct {
			rec, err := d.Get(ctx, key, time.Now())
			switch {
			case err == nil:
				found = append(found, rec)
			case !errors.Is(err, idempotency.ErrNotFound):
				return rec, err
			}
		}
		if len(found) != 1 {
			return idempotency.Record{}, fmt.Errorf("%d records on %d servers", len(found), len(direct))
		}
		return found[0], nil
	}
	for key := range claimed {
		rec, err := get(key)
		switch {
		case err != nil:
			bad("Get(%s) after the faults: %v; its Begin claimed it", key, err)
		case rec.Fingerprint != key:
			bad("Get(%s) after the faults: fingerprint %q", key, rec.Fingerprint)
		case completed[key] && (rec.State != idempotency.Done || string(rec.Response.Body) != key):
			bad("Get(%s) after the faults = %+v; its Complete returned nil", key, rec)
		}
	}
	if n := wrong.Load(); n > 0 {
		t.Fatalf("%d wrong answers (first ones above)", n)
	}
}

// TestScriptFlushUnderLoad: SCRIPT FLUSH, again and again while callers
// run, makes batched and lone EVALSHAs meet NOSCRIPT; each is followed by
// one EVAL, so every Begin on a fresh key claims it (a script run twice
// would find its own claim and answer "in flight"), and every Complete is
// applied once (twice, the second would answer ErrLeaseLost).
func TestScriptFlushUnderLoad(t *testing.T) {
	ps := startPrivateServer(t)
	admin := ps.client(t)
	c := newClient(t, &redis.Options{Addr: ps.addr(), PoolSize: 8})
	s := newStore(t, c, Options{Logger: discard()})
	var done atomic.Int32
	ctx := context.Background()
	stop := underLoad(t, 16, func(key string) bool {
		rec, ok, err := s.Begin(ctx, key, "fp", time.Now(), time.Minute, time.Hour)
		if err != nil || !ok {
			t.Errorf("Begin(%s) on a fresh key = %v, %+v, %v; want a claim", key, ok, rec, err)
			return false
		}
		if err := s.Complete(ctx, key, rec.Token, idempotency.Response{Status: 200, Body: []byte(key)}, time.Now(), time.Hour); err != nil {
			t.Errorf("Complete(%s) = %v", key, err)
			return false
		}
		if rep, ok, err := s.Begin(ctx, key, "fp", time.Now(), time.Minute, time.Hour); err != nil || ok || string(rep.Response.Body) != key {
			t.Errorf("replay of %s = %v, %+v, %v; want its body", key, ok, rep, err)
			return false
		}
		done.Add(1)
		return true
	})
	before := commandCalls(t, admin)
	for range 40 {
		time.Sleep(5 * time.Millisecond)
		if err := admin.ScriptFlush(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
	}
	stop()
	idle(t, s)
	d := delta(before, commandCalls(t, admin))
	t.Logf("%d keys done; %d batches carried %d operations; server: %v", done.Load(), s.batches.Load(), s.batchedOps.Load(), d)
	if d["eval"] == 0 || s.batches.Load() == 0 {
		t.Fatal("no EVAL after NOSCRIPT or no batch: the test proved nothing")
	}
}

// TestRestartUnderLoad: a server killed and started again (without
// persistence: its records and script cache are gone) under concurrent
// callers. Each call fails with ErrUnavailable or answers for its own key;
// after the restart the store works again (EVALSHA, NOSCRIPT, EVAL) on
// connections made anew.
func TestRestartUnderLoad(t *testing.T) {
	ps := startPrivateServer(t)
	c := newClient(t, &redis.Options{Addr: ps.addr(), PoolSize: 8, DialTimeout: 100 * time.Millisecond})
	s := newStore(t, c, Options{OpTimeout: 300 * time.Millisecond, Logger: discard()})
	var wrong, fails, oks atomic.Int32
	ctx := context.Background()
	stop := underLoad(t, 16, func(key string) bool {
		rec, ok, err := s.Begin(ctx, key, key, time.Now(), time.Minute, time.Hour)
		switch {
		case errors.Is(err, idempotency.ErrUnavailable):
			fails.Add(1)
			time.Sleep(time.Millisecond)
			return true
		case err != nil || !ok || rec.Fingerprint != key:
			if wrong.Add(1) <= 5 {
				t.Errorf("Begin(%s) on a fresh key = %v, %+v, %v", key, ok, rec, err)
			}
			return true
		}
		err = s.Complete(ctx, key, rec.Token, idempotency.Response{Status: 200, Body: []byte(key)}, time.Now(), time.Hour)
		// A Complete whose claim went with the restart is refused:
		// ErrLeaseLost, truthfully (nothing was written).
		if err != nil && !errors.Is(err, idempotency.ErrUnavailable) && !errors.Is(err, idempotency.ErrLeaseLost) {
			if wrong.Add(1) <= 5 {
				t.Errorf("Complete(%s) = %v", key, err)
			}
		}
		oks.Add(1)
		return true
	})
	for range 3 {
		time.Sleep(150 * time.Millisecond)
		ps.kill()
		time.Sleep(100 * time.Millisecond)
		ps.start()
	}
	time.Sleep(300 * time.Millisecond)
	stop()
	idle(t, s)
	t.Logf("%d claims, %d failures; %d batches carried %d operations", oks.Load(), fails.Load(), s.batches.Load(), s.batchedOps.Load())
	if fails.Load() == 0 || oks.Load() == 0 {
		t.Fatal("no failure or no claim: the test proved nothing")
	}
	if _, ok, err := s.Begin(context.Background(), "after", "fp", time.Now(), time.Minute, time.Hour); err != nil || !ok {
		t.Fatalf("Begin after the restarts = %v, %v", ok, err)
	}
}

// underLoad runs body in n goroutines, each with fresh keys ("w<worker>-<i>")
// one after another, until body returns false or stop is called; stop ends
// the loops and waits for them (failing the test if they hang).
func underLoad(t *testing.T, n int, body func(key string) bool) (stop func()) {
	t.Helper()
	quit := make(chan struct{})
	var wg sync.WaitGroup
	for w := range n {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-quit:
					return
				default:
				}
				if !body("w" + strconv.Itoa(w) + "-" + strconv.Itoa(i)) {
					return
				}
			}
		})
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			close(quit)
			hangGuard(t, 20*time.Second, "workers", wg.Wait)
		})
	}
}
