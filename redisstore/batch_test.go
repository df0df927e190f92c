package redisstore

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"slices"
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

// slowStore is a store on a private server whose replies are held back by
// latency (toxiproxy), so that an operation stays on the wire long enough
// for others to queue behind it.
func slowStore(t *testing.T, latency time.Duration, o Options) *Store {
	t.Helper()
	ps := startPrivateServer(t)
	proxy := testenv.Toxiproxy(t, "redis", ps.addr())
	testenv.AddToxic(t, proxy, `{"name":"slow","type":"latency","stream":"downstream","attributes":{"latency":`+
		strconv.FormatInt(latency.Milliseconds(), 10)+`}}`)
	c := newClient(t, &redis.Options{Addr: proxy.Listen, PoolSize: 8})
	if o.OpTimeout == 0 {
		o.OpTimeout = 10 * latency
	}
	if o.Logger == nil {
		o.Logger = discard()
	}
	// Load the scripts now, so that a batch meets no NOSCRIPT.
	for _, sc := range []*script{beginScript, completeScript, extendScript, releaseScript, getScript} {
		if err := sc.Load(context.Background(), c).Err(); err != nil {
			t.Fatal(err)
		}
	}
	s := newStore(t, c, o)
	// Cleanups run last first: the keys are deleted at full speed.
	t.Cleanup(func() { testenv.RemoveToxic(proxy, "slow") })
	return s
}

// queueLen waits until n operations wait in s's queue.
func queueLen(t *testing.T, s *Store, n int, within time.Duration) {
	t.Helper()
	end := time.Now().Add(within)
	for {
		s.batch.mu.Lock()
		got := len(s.batch.queue)
		s.batch.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%d operations queued after %v, want %d", got, within, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestBatchSendsWaitersTogether: operations that arrive while one is on the
// wire go out as one pipeline when it is answered, and each gets its own
// answer: a claim with its own token.
func TestBatchSendsWaitersTogether(t *testing.T) {
	s := slowStore(t, 300*time.Millisecond, Options{})
	ctx := context.Background()
	now := time.Now()
	const waiters = 40
	tokens := make(chan uint64, waiters+1)
	errs := make(chan error, waiters+1)
	begin := func(key string) {
		rec, claimed, err := s.Begin(ctx, key, "fp", now, time.Minute, time.Hour)
		if err == nil && !claimed {
			err = errors.New(key + " not claimed")
		}
		errs <- err
		tokens <- rec.Token
	}
	go begin("first")
	queueLen(t, s, 0, time.Second) // nothing queues behind nothing
	time.Sleep(20 * time.Millisecond)
	var wg sync.WaitGroup
	for i := range waiters {
		wg.Go(func() { begin("k" + strconv.Itoa(i)) })
	}
	queueLen(t, s, waiters, 250*time.Millisecond)
	wg.Wait()
	seen := map[uint64]bool{}
	for range waiters + 1 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		tok := <-tokens
		if tok == 0 || seen[tok] {
			t.Fatalf("token %d given twice or zero", tok)
		}
		seen[tok] = true
	}
	if b, n := s.batches.Load(), s.batchedOps.Load(); b != 1 || n != waiters {
		t.Fatalf("%d pipelines with %d operations, want 1 with %d", b, n, waiters)
	}
	for i := range waiters {
		wg.Go(func() {
			key := "k" + strconv.Itoa(i)
			if rec, err := s.Get(ctx, key, now); err != nil || rec.State != idempotency.Processing {
				t.Errorf("Get(%s) = %+v, %v; want its claim", key, rec, err)
			}
		})
	}
	wg.Wait()
}

// TestBatchQueuedCancelNotSent: an operation whose ctx ends while it waits
// in the queue is taken out and never sent.
func TestBatchQueuedCancelNotSent(t *testing.T) {
	s := slowStore(t, 300*time.Millisecond, Options{})
	ctx := context.Background()
	now := time.Now()
	done := make(chan error, 1)
	go func() {
		_, _, err := s.Begin(ctx, "first", "fp", now, time.Minute, time.Hour)
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, _, err := s.Begin(short, "late", "fp", now, time.Minute, time.Hour)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, idempotency.ErrUnavailable) {
		t.Fatalf("queued Begin past its deadline = %v; want ErrUnavailable with DeadlineExceeded", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "late", now); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("Get(late) = %v; want ErrNotFound: a cancelled queued Begin was sent", err)
	}
	if n := s.batchedOps.Load(); n != 0 {
		t.Fatalf("%d operations went out in pipelines, want none", n)
	}
}

// TestNoBatch: with NoBatch, operations go on their own, also under load.
func TestNoBatch(t *testing.T) {
	s := slowStore(t, 100*time.Millisecond, Options{NoBatch: true})
	ctx := context.Background()
	now := time.Now()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			if _, _, err := s.Begin(ctx, "k"+strconv.Itoa(i), "fp", now, time.Minute, time.Hour); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := s.batches.Load(); n != 0 {
		t.Fatalf("%d pipelines with NoBatch", n)
	}
}

// TestBatchCluster: on Cluster a pipeline holds keys of every master;
// go-redis splits it by node, and each operation still gets its own answer.
func TestBatchCluster(t *testing.T) {
	c := clusterClient(t)
	s := newStore(t, c, Options{Logger: discard()})
	ctx := context.Background()
	now := time.Now()
	const workers = 64
	for round := 0; s.batches.Load() == 0; round++ {
		if round == 20 {
			t.Fatal("no pipeline in 20 rounds of 64 concurrent Begins")
		}
		var wg sync.WaitGroup
		for i := range workers {
			wg.Go(func() {
				key := "r" + strconv.Itoa(round) + "-" + strconv.Itoa(i)
				rec, claimed, err := s.Begin(ctx, key, "fp", now, time.Minute, time.Hour)
				if err != nil || !claimed {
					t.Errorf("Begin(%s) = %v, %v", key, claimed, err)
					return
				}
				if err := s.Complete(ctx, key, rec.Token, idempotency.Response{Status: 201, Body: []byte(key)}, now, time.Hour); err != nil {
					t.Errorf("Complete(%s): %v", key, err)
				}
				got, err := s.Get(ctx, key, now)
				if err != nil || string(got.Response.Body) != key {
					t.Errorf("Get(%s) = %q, %v; want its own result", key, got.Response.Body, err)
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}
	}
	t.Logf("%d pipelines carried %d operations", s.batches.Load(), s.batchedOps.Load())
}

// onWire waits until an operation of s is on the wire (its batcher is
// sending).
func onWire(t *testing.T, s *Store, within time.Duration) {
	t.Helper()
	end := time.Now().Add(within)
	for {
		s.batch.mu.Lock()
		sending := s.batch.sending
		s.batch.mu.Unlock()
		if sending {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("nothing on the wire after %v", within)
		}
		time.Sleep(time.Millisecond)
	}
}

// idle fails the test unless s's batcher is at rest: once every caller
// has returned, nobody sends, so nothing may be left marked as sending.
func idle(t *testing.T, s *Store) {
	t.Helper()
	s.batch.mu.Lock()
	defer s.batch.mu.Unlock()
	if s.batch.sending || len(s.batch.queue) != 0 {
		t.Fatalf("batcher not at rest after every caller returned: sending %v, %d queued", s.batch.sending, len(s.batch.queue))
	}
}

// handOff does by hand what handOn does: the queue becomes one batch led by
// its first caller. cancel runs under the batcher's lock, so the callers
// it cancels find their batch already formed when they look.
func handOff(s *Store, cancel context.CancelFunc) *queued {
	b := &s.batch
	b.mu.Lock()
	defer b.mu.Unlock()
	cancel()
	next := slices.Clone(b.queue)
	b.queue = b.queue[:0]
	next[0].lead, next[0].led = next, true
	return next[0]
}

// TestBatchCancelledNotSent: a caller whose ctx ends after its batch was
// formed but before it was sent returns ctx's error and its operation is
// not sent, whether it was to lead the batch or only to be in it; the
// others in the batch are still sent.
func TestBatchCancelledNotSent(t *testing.T) {
	for _, leader := range []bool{true, false} {
		t.Run(map[bool]string{true: "leader", false: "member"}[leader], func(t *testing.T) {
			s := newStore(t, sharedClient(t), Options{Logger: discard()})
			now := time.Now()
			// Pretend an operation is on the wire, so that the next ones queue.
			s.batch.mu.Lock()
			s.batch.sending = true
			s.batch.mu.Unlock()
			type result struct {
				claimed bool
				err     error
			}
			begin := func(ctx context.Context, key string) chan result {
				ch := make(chan result, 1)
				go func() {
					_, claimed, err := s.Begin(ctx, key, "fp", now, time.Minute, time.Hour)
					ch <- result{claimed, err}
				}()
				return ch
			}
			ctxA, cancelA := context.WithCancel(context.Background())
			defer cancelA()
			ctxB, cancelB := context.WithCancel(context.Background())
			defer cancelB()
			a := begin(ctxA, "a")
			queueLen(t, s, 1, time.Second)
			b := begin(ctxB, "b")
			queueLen(t, s, 2, time.Second)
			gone, stays, goneKey, staysKey := a, b, "a", "b"
			var lead *queued
			if leader {
				lead = handOff(s, cancelA)
			} else {
				gone, stays, goneKey, staysKey = b, a, "b", "a"
				lead = handOff(s, cancelB)
				// The member returns before its leader is woken to send.
				var r result
				hangGuard(t, 5*time.Second, "cancelled member", func() { r = <-gone })
				gone <- r
			}
			close(lead.done)
			var rg, rs result
			hangGuard(t, 5*time.Second, "batch", func() { rg, rs = <-gone, <-stays })
			if !errors.Is(rg.err, context.Canceled) {
				t.Errorf("Begin(%s) cancelled before its batch went out = %v, %v; want context.Canceled", goneKey, rg.claimed, rg.err)
			}
			if rs.err != nil || !rs.claimed {
				t.Errorf("Begin(%s) = %v, %v; want a claim", staysKey, rs.claimed, rs.err)
			}
			idle(t, s)
			if _, err := s.Get(context.Background(), goneKey, now); !errors.Is(err, idempotency.ErrNotFound) {
				t.Errorf("Get(%s) = %v; want ErrNotFound: the cancelled Begin was sent", goneKey, err)
			}
			if _, err := s.Get(context.Background(), staysKey, now); err != nil {
				t.Errorf("Get(%s) = %v; want its claim", staysKey, err)
			}
		})
	}
}

// panicHook panics in the next command or pipeline it sees once armed, as
// a client's hook (tracing, metrics) might.
type panicHook struct{ cmd, pipe *atomic.Bool }

func (panicHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h panicHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.cmd.CompareAndSwap(true, false) {
			panic("test: hook panics")
		}
		return next(ctx, cmd)
	}
}
func (h panicHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.pipe.CompareAndSwap(true, false) {
			panic("test: hook panics")
		}
		return next(ctx, cmds)
	}
}

// TestBatchPanicReleases: a panic while a caller sends (a lone call or a
// batch) goes up that caller's stack, as without batching, but does not
// leave the store marked as sending, which would make every later call
// queue until its timeout; the others in a batch get ErrUnavailable.
func TestBatchPanicReleases(t *testing.T) {
	s := slowStore(t, 100*time.Millisecond, Options{})
	h := panicHook{new(atomic.Bool), new(atomic.Bool)}
	s.c.(*redis.Client).AddHook(h)
	ctx := context.Background()
	now := time.Now()
	begin := func(key string) (panicked bool, err error) {
		defer func() {
			if p := recover(); p != nil {
				panicked = true
			}
		}()
		_, _, err = s.Begin(ctx, key, "fp", now, time.Minute, time.Hour)
		return false, err
	}
	after := func(key string) {
		t.Helper()
		var err error
		hangGuard(t, 10*time.Second, "Begin after a panic", func() { _, err = begin(key) })
		if err != nil {
			t.Fatalf("Begin(%s) after a panic: %v; want a claim", key, err)
		}
	}

	h.cmd.Store(true)
	if panicked, err := begin("lone"); !panicked {
		t.Fatalf("lone Begin with a panicking hook = %v; want the panic", err)
	}
	idle(t, s)
	after("after-lone")

	first := make(chan error, 1)
	go func() { _, err := begin("first"); first <- err }()
	time.Sleep(20 * time.Millisecond)
	h.pipe.Store(true)
	const waiters = 8
	var wg sync.WaitGroup
	var panics atomic.Int32
	errs := make(chan error, waiters)
	for i := range waiters {
		wg.Go(func() {
			panicked, err := begin("k" + strconv.Itoa(i))
			if panicked {
				panics.Add(1)
				return
			}
			errs <- err
		})
	}
	queueLen(t, s, waiters, time.Second)
	hangGuard(t, 10*time.Second, "batch with a panicking hook", wg.Wait)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if n := panics.Load(); n != 1 {
		t.Fatalf("%d callers panicked, want 1 (the batch's sender)", n)
	}
	close(errs)
	for err := range errs {
		if !errors.Is(err, idempotency.ErrUnavailable) {
			t.Errorf("Begin in a batch whose send panicked = %v; want ErrUnavailable", err)
		}
	}
	idle(t, s)
	after("after-batch")
}

// batchLoser wraps a connection so that the reply to the first write that
// holds more than one EVALSHA (a batch) is read from the server, thrown
// away, and the connection closed: every script in the batch ran, and the
// client sees EOF, which go-redis would retry.
type batchLoser struct {
	net.Conn
	lost    *atomic.Int32
	scripts int // EVALSHAs written since the last read
}

func (c *batchLoser) Write(p []byte) (int, error) {
	c.scripts += bytes.Count(bytes.ToLower(p), []byte("evalsha"))
	return c.Conn.Write(p)
}

func (c *batchLoser) Read(p []byte) (int, error) {
	n := c.scripts
	c.scripts = 0
	if n < 2 || !c.lost.CompareAndSwap(0, 1) {
		return c.Conn.Read(p)
	}
	if _, err := c.Conn.Read(make([]byte, 64<<10)); err != nil {
		return 0, err
	}
	_ = c.Conn.Close()
	return 0, io.EOF
}

// TestBatchLostReplyNotResent: when the reply to a batch is lost after its
// scripts ran, every operation in it fails with ErrUnavailable (none gets a
// false answer) and none is sent again, though the client retries.
func TestBatchLostReplyNotResent(t *testing.T) {
	ps := startPrivateServer(t)
	proxy := testenv.Toxiproxy(t, "redis", ps.addr())
	testenv.AddToxic(t, proxy, `{"name":"slow","type":"latency","stream":"downstream","attributes":{"latency":200}}`)
	var lost atomic.Int32
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &batchLoser{Conn: c, lost: &lost}, nil
	}
	c := newClient(t, &redis.Options{Addr: proxy.Listen, Dialer: dial, MaxRetries: 3, PoolSize: 4})
	direct := ps.client(t)
	ctx := context.Background()
	for _, sc := range []*script{beginScript, completeScript, extendScript, releaseScript, getScript} {
		if err := sc.Load(ctx, direct).Err(); err != nil {
			t.Fatal(err)
		}
	}
	s := newStore(t, c, Options{OpTimeout: 3 * time.Second, Logger: discard()})
	now := time.Now()
	before := commandCalls(t, direct)

	first := make(chan error, 1)
	go func() {
		_, claimed, err := s.Begin(ctx, "first", "fp", now, time.Minute, time.Hour)
		if err == nil && !claimed {
			err = errors.New("first not claimed")
		}
		first <- err
	}()
	time.Sleep(20 * time.Millisecond)
	const waiters = 8
	type result struct {
		key     string
		claimed bool
		err     error
	}
	results := make(chan result, waiters)
	var wg sync.WaitGroup
	for i := range waiters {
		wg.Go(func() {
			key := "k" + strconv.Itoa(i)
			_, claimed, err := s.Begin(ctx, key, "fp", now, time.Minute, time.Hour)
			results <- result{key, claimed, err}
		})
	}
	queueLen(t, s, waiters, time.Second)
	hangGuard(t, 10*time.Second, "batch whose reply is lost", wg.Wait)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if lost.Load() != 1 || s.batches.Load() != 1 {
		t.Fatalf("%d batch replies lost in %d batches, want 1 in 1: the test's fault did not happen", lost.Load(), s.batches.Load())
	}
	close(results)
	for r := range results {
		if !errors.Is(r.err, idempotency.ErrUnavailable) {
			t.Errorf("Begin(%s) in a batch whose reply was lost = %v, %v; want ErrUnavailable", r.key, r.claimed, r.err)
		}
	}
	idle(t, s)
	if err := proxy.Toxics.RemoveToxic(ctx, "slow"); err != nil {
		t.Fatal(err)
	}
	d := delta(before, commandCalls(t, direct))
	if d["evalsha"] != waiters+1 || d["eval"] != 0 {
		t.Fatalf("server ran %d EVALSHA and %d EVAL (%v), want %d EVALSHA: a script was sent again", d["evalsha"], d["eval"], d, waiters+1)
	}
	for i := range waiters {
		key := "k" + strconv.Itoa(i)
		if rec, err := s.Get(ctx, key, now); err != nil || rec.State != idempotency.Processing {
			t.Errorf("Get(%s) = %+v, %v; want the claim its lost Begin made", key, rec, err)
		}
	}
}

// TestBatchPausedServer: with a paused server (SIGSTOP) under concurrent
// calls, so that they queue and go out in batches, every call fails with
// ErrUnavailable within its bound, the batcher is left at rest, and the
// store recovers after SIGCONT.
func TestBatchPausedServer(t *testing.T) {
	// The queued callers' deadline (OpTimeout) is long beside the first
	// call's, so that on a loaded machine they are still queued when the
	// first gives up, however late their goroutines start.
	const opTimeout = 2 * time.Second
	ps := startPrivateServer(t)
	s := newStore(t, ps.client(t), Options{OpTimeout: opTimeout, Logger: discard()})
	ctx := context.Background()
	if _, _, err := s.Begin(ctx, "warm", "fp", time.Now(), time.Minute, time.Hour); err != nil {
		t.Fatal(err)
	}
	ps.signal(syscall.SIGSTOP)
	paused := true
	defer func() {
		if paused {
			ps.signal(syscall.SIGCONT)
		}
	}()
	begin := func(ctx context.Context, key string) {
		start := time.Now()
		_, _, err := s.Begin(ctx, key, "fp", time.Now(), time.Minute, time.Hour)
		// Every caller, a batch's sender too, returns by its own
		// deadline (OpTimeout), plus slack.
		if took := time.Since(start); took > opTimeout+2*time.Second {
			t.Errorf("Begin(%s) took %v on a paused server", key, took)
		}
		if !errors.Is(err, idempotency.ErrUnavailable) {
			t.Errorf("Begin(%s) on a paused server = %v; want ErrUnavailable", key, err)
		}
	}
	for round := range 3 {
		batches := s.batches.Load()
		// The first call goes out alone and gives up after 150ms, so that
		// the calls queued behind it are still waiting then and go out as a
		// batch. (Started together, they all ran out a moment after it
		// and, on a loaded machine, had left the queue before it was handed
		// on: no batch was sent.)
		var wg sync.WaitGroup
		wg.Go(func() {
			short, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
			defer cancel()
			begin(short, "r"+strconv.Itoa(round)+"-first")
		})
		onWire(t, s, time.Second)
		for i := range 15 {
			wg.Go(func() { begin(ctx, "r"+strconv.Itoa(round)+"-"+strconv.Itoa(i)) })
		}
		hangGuard(t, 10*time.Second, "Begins on a paused server", wg.Wait)
		idle(t, s)
		if s.batches.Load() == batches {
			t.Fatalf("round %d: no batch was sent: the test proved nothing about batches", round)
		}
	}
	ps.signal(syscall.SIGCONT)
	paused = false
	var err error
	for range 100 {
		if _, _, err = s.Begin(ctx, "after", "fp", time.Now(), time.Minute, time.Hour); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("no recovery after SIGCONT: %v", err)
	}
}

// TestBatchClusterPausedMaster: on Cluster a paused master fails the
// operations on its own keys only; those on the other masters, batched
// too, still succeed (a batch that spanned masters would wait for the
// paused one and fail them all at their deadlines). The cluster is two
// private servers with a fixed slot map (ClusterSlots), so that the shared
// cluster is never paused.
func TestBatchClusterPausedMaster(t *testing.T) {
	paused, healthy := startPrivateServer(t), startPrivateServer(t)
	c := redis.NewClusterClient(&redis.ClusterOptions{
		ContextTimeoutEnabled: true,
		DialTimeout:           time.Second,
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
			return []redis.ClusterSlot{
				{Start: 0, End: 8191, Nodes: []redis.ClusterNode{{Addr: paused.addr()}}},
				{Start: 8192, End: 16383, Nodes: []redis.ClusterNode{{Addr: healthy.addr()}}},
			}, nil
		},
	})
	t.Cleanup(func() { c.Close() })
	s := newStore(t, c, Options{OpTimeout: 300 * time.Millisecond, Logger: discard()})
	ctx := context.Background()
	onPaused := func(key string) bool {
		n, err := c.MasterForKey(ctx, s.Key(key))
		if err != nil {
			t.Fatal(err)
		}
		// The client names a node ":port" when its host is the loopback.
		return strings.HasSuffix(n.Options().Addr, ":"+strconv.Itoa(paused.port))
	}
	// One call on each master first: the scripts are loaded and the client
	// holds a connection to each.
	warm := map[bool]bool{}
	for i := 0; len(warm) < 2; i++ {
		k := "warm" + strconv.Itoa(i)
		if _, _, err := s.Begin(ctx, k, "fp", time.Now(), time.Minute, time.Hour); err != nil {
			t.Fatal(err)
		}
		warm[onPaused(k)] = true
	}
	paused.signal(syscall.SIGSTOP)
	defer paused.signal(syscall.SIGCONT)
	var okHealthy, failHealthy, okPaused atomic.Int32
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := range 5 {
				key := "k" + strconv.Itoa(w) + "-" + strconv.Itoa(i)
				_, _, err := s.Begin(ctx, key, "fp", time.Now(), time.Minute, time.Hour)
				switch {
				case onPaused(key):
					if err == nil {
						okPaused.Add(1)
					}
				case err == nil:
					okHealthy.Add(1)
				default:
					failHealthy.Add(1)
					t.Logf("Begin(%s) on the healthy master: %v", key, err)
				}
			}
		})
	}
	hangGuard(t, 20*time.Second, "Begins with a paused master", wg.Wait)
	if okPaused.Load() != 0 {
		t.Fatalf("%d Begins on the paused master succeeded", okPaused.Load())
	}
	if okHealthy.Load() == 0 || s.batches.Load() == 0 {
		t.Fatalf("%d Begins on the healthy master, %d batches: the test proved nothing", okHealthy.Load(), s.batches.Load())
	}
	if n := failHealthy.Load(); n != 0 {
		t.Fatalf("%d of %d Begins on the healthy master failed while the other was paused", n, n+okHealthy.Load())
	}
}
