package redisstore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/archlab/idempotency"
)

// slowStore is a store on a private server whose replies are held back by
// latency (toxiproxy), so that an operation stays on the wire long enough
// for others to queue behind it.
func slowStore(t *testing.T, latency time.Duration, o Options) *Store {
	t.Helper()
	ps := startPrivateServer(t)
	api := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	proxy := toxiproxy.NewProxy(api, "redis", "127.0.0.1:0", ps.addr())
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Stop)
	toxic := `{"name":"slow","type":"latency","stream":"downstream","attributes":{"latency":` +
		strconv.FormatInt(latency.Milliseconds(), 10) + `}}`
	if _, err := proxy.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
		t.Fatal(err)
	}
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
	t.Cleanup(func() { _ = proxy.Toxics.RemoveToxic(context.Background(), "slow") })
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
