package redisstore

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/archlab/idempotency"
)

// nodeBatchers counts the store's per-node batchers.
func nodeBatchers(s *Store) int {
	n := 0
	s.nodes.Range(func(_, _ any) bool { n++; return true })
	return n
}

// TestBatchersOfReplacedNodesDropped: go-redis replaces a node's client
// whenever the topology changes (here a Ring's SetAddrs moving its shard
// between two servers, 60 times; on Cluster a reload that drops a node,
// a failover to a new address). The store keeps a batcher per node
// client; those of clients go-redis no longer hands out must be dropped,
// or they pile up, each keeping its closed client alive. Calls under
// load during the churn each claim their own fresh key or fail with
// ErrUnavailable (a client closed under them), never anything else, and
// none is stranded; after the churn every call works.
func TestBatchersOfReplacedNodesDropped(t *testing.T) {
	a, b := startPrivateServer(t), startPrivateServer(t)
	addrs := []string{a.addr(), b.addr()}
	r := redis.NewRing(&redis.RingOptions{
		Addrs:                 map[string]string{"s": addrs[0]},
		ContextTimeoutEnabled: true,
		DialTimeout:           200 * time.Millisecond,
	})
	t.Cleanup(func() { r.Close() })
	s := newStore(t, r, Options{OpTimeout: time.Second, Logger: discard()})
	ctx := context.Background()

	var claims, fails, wrong atomic.Int32
	stop := underLoad(t, 8, func(key string) bool {
		_, ok, err := s.Begin(ctx, key, "fp", time.Now(), time.Minute, time.Hour)
		switch {
		case err == nil && ok:
			claims.Add(1)
		case errors.Is(err, idempotency.ErrUnavailable):
			fails.Add(1)
		default:
			if wrong.Add(1) <= 5 {
				t.Errorf("Begin(%s) on a fresh key during the churn = %v, %v", key, ok, err)
			}
		}
		return true
	})
	const changes = 60
	most := 0
	for i := 1; i <= changes; i++ {
		r.SetAddrs(map[string]string{"s": addrs[i%2]})
		// A call on the new shard client, whatever the load does.
		if _, _, err := s.Begin(ctx, "churn-"+strconv.Itoa(i), "fp", time.Now(), time.Minute, time.Hour); err != nil {
			t.Fatalf("Begin after SetAddrs #%d: %v", i, err)
		}
		most = max(most, nodeBatchers(s))
	}
	stop()
	t.Logf("%d claims and %d failures under load; %d batches carried %d operations; at most %d node batchers",
		claims.Load(), fails.Load(), s.batches.Load(), s.batchedOps.Load(), most)
	if claims.Load() == 0 {
		t.Fatal("nothing claimed under load: the test proved nothing")
	}
	// One live shard: its batcher, and those of clients replaced while
	// they were in use, until the next replacement finds them idle.
	if n := nodeBatchers(s); n > 4 || most > 8 {
		t.Errorf("%d node batchers after %d shard replacements (at most %d on the way), want a few: batchers of replaced clients are kept",
			n, changes, most)
	}

	// Correct after the churn: a fresh key is claimed, completed and
	// replayed, on the shard the ring now uses.
	rec, ok, err := s.Begin(ctx, "after", "fp", time.Now(), time.Minute, time.Hour)
	if err != nil || !ok {
		t.Fatalf("Begin after the churn = %v, %v", ok, err)
	}
	if err := s.Complete(ctx, "after", rec.Token, idempotency.Response{Status: 201}, time.Now(), time.Hour); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, "after", time.Now()); err != nil || got.State != idempotency.Done || got.Response.Status != 201 {
		t.Fatalf("Get after the churn = %+v, %v", got, err)
	}
}
