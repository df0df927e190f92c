package redisstore

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestWatchNodesResetsOnResubscribe: on Cluster and Ring, deletions are
// heard on one subscription per node. While one listed node never answers
// (down, no failover yet), another node's subscription breaks, and what it
// announced meanwhile is missed: when it subscribes again, reset is called
// at once, not only once every node has subscribed.
func TestWatchNodesResetsOnResubscribe(t *testing.T) {
	setWatchTimes(t, 200*time.Millisecond, 50*time.Millisecond)
	ps := startPrivateServer(t)
	a := ps.client(t)
	dead := newClient(t, &redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(freePort(t))})
	s := newStore(t, a, Options{Logger: discard(), OpTimeout: 200 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	var resets atomic.Int64
	done := make(chan error, 1)
	go func() {
		done <- s.watchNodes(ctx, []*redis.Client{a, dead}, time.Hour, func() bool { return false },
			func(string) {}, func() { resets.Add(1) }, func(error) {})
	}()
	defer func() { cancel(); <-done }()
	waitSubscribers := func() {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if n, _ := a.PubSubNumSub(ctx, s.deletesChannel()).Result(); n[s.deletesChannel()] > 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("no subscription on the live node")
			}
		}
	}
	waitSubscribers()
	if n := resets.Load(); n != 0 {
		t.Fatalf("reset called %d times while a node had never subscribed; want none yet", n)
	}
	// Break the live node's subscription; it comes back on its own.
	if err := a.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); resets.Load() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the live node subscribed again, but reset was never called: what it announced in between stays cached")
		}
	}
}
