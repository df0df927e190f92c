package redisstore

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/archlab/idempotency"
)

// TestClusterFailoverUnderLoad: a private cluster of one master (all
// slots) and its replica; while callers claim and complete fresh keys,
// the replica takes over (CLUSTER FAILOVER, which waits until it has every
// write the master acknowledged). Every call fails with ErrUnavailable or
// answers for its own key, and afterwards every acknowledged claim and
// result is found on the new master: none runs a second time.
func TestClusterFailoverUnderLoad(t *testing.T) {
	args := []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "1000"}
	m, r := startPrivateServer(t, args...), startPrivateServer(t, args...)
	cm, cr := m.client(t), r.client(t)
	ctx := context.Background()
	mid, err := cm.Do(ctx, "cluster", "myid").Text()
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		c    *redis.Client
		args []any
	}{
		{cm, []any{"cluster", "addslotsrange", 0, 16383}},
		{cm, []any{"cluster", "meet", "127.0.0.1", r.port}},
	} {
		if err := step.c.Do(ctx, step.args...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the replica to know the master", func() bool {
		return cr.Do(ctx, "cluster", "replicate", mid).Err() == nil
	})
	waitFor(t, "the replica to sync", func() bool {
		info, _ := cr.Info(ctx, "replication").Result()
		ci, _ := cr.ClusterInfo(ctx).Result()
		return strings.Contains(info, "master_link_status:up") && strings.Contains(ci, "cluster_state:ok")
	})
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{m.addr()}, ContextTimeoutEnabled: true, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { c.Close() })
	s := newStore(t, c, Options{OpTimeout: time.Second, Logger: discard()})

	var (
		mu        sync.Mutex
		claimed   = map[string]uint64{} // key -> token of its acknowledged claim
		completed = map[string]bool{}
		wrong     atomic.Int32
		fails     atomic.Int32
	)
	bad := func(format string, args ...any) {
		if wrong.Add(1) <= 5 {
			t.Errorf(format, args...)
		}
	}
	stop := underLoad(t, 16, func(key string) bool {
		rec, ok, err := s.Begin(ctx, key, key, time.Now(), time.Minute, time.Hour)
		if errors.Is(err, idempotency.ErrUnavailable) {
			fails.Add(1)
			return true
		}
		if err != nil || !ok || rec.Fingerprint != key {
			bad("Begin(%s) on a fresh key = %v, %+v, %v", key, ok, rec, err)
			return true
		}
		mu.Lock()
		claimed[key] = rec.Token
		mu.Unlock()
		err = s.Complete(ctx, key, rec.Token, idempotency.Response{Status: 200, Body: []byte(key)}, time.Now(), time.Hour)
		switch {
		case err == nil:
			mu.Lock()
			completed[key] = true
			mu.Unlock()
		case errors.Is(err, idempotency.ErrUnavailable):
			fails.Add(1)
		default:
			bad("Complete(%s) = %v", key, err)
		}
		return true
	})
	time.Sleep(200 * time.Millisecond)
	if err := cr.Do(ctx, "cluster", "failover").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the replica to take over", func() bool {
		info, _ := cr.Info(ctx, "replication").Result()
		return strings.Contains(info, "role:master")
	})
	time.Sleep(300 * time.Millisecond)
	stop()
	t.Logf("%d claims, %d completed, %d failures; %d batches carried %d operations",
		len(claimed), len(completed), fails.Load(), s.batches.Load(), s.batchedOps.Load())
	if len(claimed) == 0 {
		t.Fatal("nothing claimed: the test proved nothing")
	}
	direct := newStore(t, cr, Options{Prefix: s.prefix, Logger: discard()})
	for key, tok := range claimed {
		rec, ok, err := direct.Begin(ctx, key, key, time.Now(), time.Minute, time.Hour)
		switch {
		case err != nil || ok:
			bad("Begin(%s) on the new master = %v, %v: its acknowledged claim (token %d) is gone", key, ok, err, tok)
		case completed[key] && (rec.State != idempotency.Done || string(rec.Response.Body) != key):
			bad("Begin(%s) on the new master = %+v; want its acknowledged result", key, rec)
		}
	}
	if n := wrong.Load(); n > 0 {
		t.Fatalf("%d wrong answers", n)
	}
}

// waitFor polls cond (bounded) until it holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
