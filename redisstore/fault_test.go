package redisstore

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/testenv"
)

// hangGuard bounds a call that must not hang: it fails the test if f does
// not return within limit. It is a guard against hangs, not a timing goal.
func hangGuard(t *testing.T, limit time.Duration, what string, f func()) time.Duration {
	t.Helper()
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
		return time.Since(start)
	case <-time.After(limit):
		t.Fatalf("%s still blocked after %v", what, limit)
		return 0
	}
}

// TestPausedServer: a server stopped with SIGSTOP accepts connections but
// never answers. Begin must fail with ErrUnavailable within OpTimeout (plus
// slack for scheduling), with a client that honours context deadlines and
// with one that does not, and the store recovers after SIGCONT.
func TestPausedServer(t *testing.T) {
	const opTimeout = 300 * time.Millisecond
	const slack = 2 * time.Second
	ps := startPrivateServer(t)
	clients := map[string]*redis.Client{
		"context-deadlines": ps.client(t),
		// ReadTimeout far beyond OpTimeout: only the store's own bound helps.
		"no-context-deadlines": func() *redis.Client {
			c := redis.NewClient(&redis.Options{Addr: ps.addr(), ReadTimeout: 20 * time.Second, WriteTimeout: 20 * time.Second, MaxRetries: 1})
			t.Cleanup(func() { c.Close() })
			return c
		}(),
	}
	ctx := context.Background()
	stores := map[string]*Store{}
	for name, c := range clients {
		stores[name] = newStore(t, c, Options{OpTimeout: opTimeout})
		// One call while the server runs, so each client holds a pooled
		// connection to the paused process as well as dialling new ones.
		if _, _, err := stores[name].Begin(ctx, "warm", "fp", time.Now(), time.Minute, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if stores["no-context-deadlines"].ctxHonored || !stores["context-deadlines"].ctxHonored {
		t.Fatal("honorsContext misreads the clients' options")
	}
	ps.signal(syscall.SIGSTOP)
	paused := true
	defer func() {
		if paused {
			ps.signal(syscall.SIGCONT)
		}
	}()
	for name, s := range stores {
		t.Run(name, func(t *testing.T) {
			for i := range 3 {
				var err error
				took := hangGuard(t, 10*time.Second, "Begin on a paused server", func() {
					_, _, err = s.Begin(ctx, "k"+strconv.Itoa(i), "fp", time.Now(), time.Minute, time.Hour)
				})
				if !errors.Is(err, idempotency.ErrUnavailable) {
					t.Fatalf("Begin on a paused server: %v, want ErrUnavailable", err)
				}
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Begin on a paused server: %v, want the native deadline error wrapped too", err)
				}
				if took > opTimeout+slack {
					t.Fatalf("Begin took %v on a paused server, want at most OpTimeout %v (+%v slack)", took, opTimeout, slack)
				}
			}
			// A Guard fails closed: fn does not run.
			g, _ := idempotency.NewGuard(s, nil)
			ran := false
			_, out, err := g.Do(ctx, "guarded", "fp", func(context.Context) (idempotency.Response, error) {
				ran = true
				return idempotency.Response{}, nil
			})
			if ran || out != idempotency.Unavailable || !errors.Is(err, idempotency.ErrUnavailable) {
				t.Fatalf("Guard.Do on a paused server: ran %v, %v, %v; want Unavailable without running", ran, out, err)
			}
		})
	}
	ps.signal(syscall.SIGCONT)
	paused = false
	// Recovery: bounded retries until Begin succeeds on each store.
	for name, s := range stores {
		var err error
		for range 100 {
			var ok bool
			_, ok, err = s.Begin(ctx, "after", "fp", time.Now(), time.Minute, time.Hour)
			if err == nil && !ok {
				err = errors.New("not claimed")
			}
			if err == nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("%s: no recovery after SIGCONT: %v", name, err)
		}
	}
}

// TestKillRestartAOF: with appendfsync always every Complete that returned
// survives a SIGKILL of the server, and replays after the restart.
func TestKillRestartAOF(t *testing.T) {
	ps := startPrivateServer(t, "--appendonly", "yes", "--appendfsync", "always")
	c := ps.client(t)
	s := newStore(t, c, Options{OpTimeout: time.Second})
	g, err := idempotency.NewGuard(s, &idempotency.Options{Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		acked = map[string]string{} // key -> body of every acknowledged result
		seq   atomic.Int64
		wg    sync.WaitGroup
	)
	stop := make(chan struct{})
	const workers = 8
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := "k" + strconv.FormatInt(seq.Add(1), 10)
				body := "result of " + key
				_, out, err := g.Do(context.Background(), key, "fp", func(context.Context) (idempotency.Response, error) {
					return idempotency.Response{Status: 200, Body: []byte(body)}, nil
				})
				if err == nil && out == idempotency.Executed {
					mu.Lock()
					acked[key] = body
					mu.Unlock()
				}
			}
		}()
	}
	// Let the storm write for a while, then kill the server under it.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		n := len(acked)
		mu.Unlock()
		if n >= 300 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	ps.kill()
	close(stop)
	wg.Wait()
	idle(t, s)
	t.Logf("%d batches carried %d operations", s.batches.Load(), s.batchedOps.Load())
	mu.Lock()
	defer mu.Unlock()
	if len(acked) == 0 {
		t.Fatal("no Complete was acknowledged before the kill; the test proved nothing")
	}
	ps.start()
	ctx := context.Background()
	lost := 0
	for key, body := range acked {
		resp, out, err := g.Do(ctx, key, "fp", func(context.Context) (idempotency.Response, error) {
			return idempotency.Response{}, errors.New("ran again")
		})
		if err != nil || out != idempotency.Replayed || string(resp.Body) != body {
			lost++
			if lost <= 5 {
				t.Errorf("acknowledged %s after restart: %v, %v, body %q; want Replayed %q", key, out, err, resp.Body, body)
			}
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d acknowledged results lost across SIGKILL with appendfsync always", lost, len(acked))
	}
	t.Logf("%d acknowledged results (of %d attempted) all replayed after SIGKILL and restart", len(acked), seq.Load())
}

// TestToxiproxy puts TCP faults (connection resets, black holes, latency)
// between the store and a private server while workers run Guard.Do on a
// handful of keys. The lease (a minute) outlasts the test, so every key
// may execute at most once whatever the faults: a Begin whose reply was
// lost left a claim the retry finds in flight, a Complete whose reply was
// lost left a result or a claim.
func TestToxiproxy(t *testing.T) {
	ps := startPrivateServer(t)
	proxy := testenv.Toxiproxy(t, "redis", ps.addr())

	c := newClient(t, &redis.Options{Addr: proxy.Listen, PoolSize: 16, DialTimeout: 200 * time.Millisecond})
	s := newStore(t, c, Options{OpTimeout: 150 * time.Millisecond})
	g, err := idempotency.NewGuard(s, &idempotency.Options{Lease: time.Minute, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}

	seed := rand.Uint64()
	t.Logf("seed %d (toxic order and key choice)", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	const keys = 6
	var (
		execs    [keys * 5]atomic.Int32 // five rounds of fresh keys
		outcomes sync.Map               // outcome or error class -> *atomic.Int64
		round    atomic.Int32
	)
	count := func(name string) {
		v, _ := outcomes.LoadOrStore(name, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(w)+1))
			for range 5000 {
				select {
				case <-stop:
					return
				default:
				}
				i := int(round.Load())*keys + r.IntN(keys)
				key := "key-" + strconv.Itoa(i)
				_, out, err := g.Do(context.Background(), key, "fp", func(ctx context.Context) (idempotency.Response, error) {
					execs[i].Add(1)
					time.Sleep(time.Duration(r.IntN(5)) * time.Millisecond)
					return idempotency.Response{Status: 200, Body: []byte(key)}, nil
				})
				name := string(out)
				if err != nil && out == idempotency.Executed {
					name += "+store-error"
				}
				count(name)
				time.Sleep(time.Millisecond)
			}
		}()
	}

	toxics := []string{
		`{"name":"t","type":"reset_peer","stream":"downstream","attributes":{"timeout":0}}`,
		`{"name":"t","type":"reset_peer","stream":"upstream","attributes":{"timeout":0}}`,
		`{"name":"t","type":"timeout","stream":"downstream","attributes":{"timeout":0}}`,
		`{"name":"t","type":"timeout","stream":"upstream","attributes":{"timeout":100}}`,
		`{"name":"t","type":"latency","stream":"downstream","attributes":{"latency":120,"jitter":80}}`,
		`{"name":"t","type":"latency","stream":"upstream","attributes":{"latency":100,"jitter":100}}`,
	}
	ctx := context.Background()
	for r := range 5 {
		round.Store(int32(r))
		for _, i := range rng.Perm(len(toxics))[:3] {
			time.Sleep(60 * time.Millisecond) // healthy: let claims and results through
			if _, err := proxy.Toxics.AddToxicJson(strings.NewReader(toxics[i])); err != nil {
				t.Fatalf("add toxic %s: %v", toxics[i], err)
			}
			time.Sleep(120 * time.Millisecond)
			if err := proxy.Toxics.RemoveToxic(ctx, "t"); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(60 * time.Millisecond)
	}
	close(stop)
	hangGuard(t, 30*time.Second, "workers", wg.Wait)
	idle(t, s)
	t.Logf("%d batches carried %d operations", s.batches.Load(), s.batchedOps.Load())

	summary := map[string]int64{}
	outcomes.Range(func(k, v any) bool { summary[k.(string)] = v.(*atomic.Int64).Load(); return true })
	t.Logf("outcomes: %v", summary)
	executed := 0
	for i := range execs {
		switch n := execs[i].Load(); {
		case n > 1:
			t.Errorf("key-%d executed %d times within its lease", i, n)
		case n == 1:
			executed++
		}
	}
	if executed == 0 || summary[string(idempotency.Replayed)] == 0 {
		t.Fatalf("no key executed or replayed (%v): the test proved nothing", summary)
	}
	if summary[string(idempotency.Unavailable)]+summary[string(idempotency.Executed)+"+store-error"] == 0 {
		t.Fatalf("no fault reached the store (%v): the test proved nothing", summary)
	}
	// With the faults gone every executed key answers: replay, or in flight
	// when its Complete was lost (the claim then holds until its lease).
	for i := range execs {
		key := "key-" + strconv.Itoa(i)
		var out idempotency.Outcome
		for range 20 {
			_, out, err = g.Do(ctx, key, "fp", func(context.Context) (idempotency.Response, error) {
				execs[i].Add(1)
				return idempotency.Response{Status: 200, Body: []byte(key)}, nil
			})
			if out != idempotency.Unavailable {
				break
			}
			time.Sleep(50 * time.Millisecond) // the pool redials after the faults
		}
		if n := execs[i].Load(); n > 1 {
			t.Errorf("%s: executed %d times (last outcome %v, %v)", key, n, out, err)
		}
	}
}
