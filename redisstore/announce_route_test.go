package redisstore

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/testenv"
)

// publishes returns the PUBLISH calls each of cs has answered (INFO
// commandstats).
func publishes(t testing.TB, cs []*redis.Client) []int64 {
	t.Helper()
	n := make([]int64, len(cs))
	for i, c := range cs {
		n[i] = commandCalls(t, c)["publish"]
	}
	return n
}

// keysWhere returns n keys of s whose Redis key satisfies on.
func keysWhere(s *Store, n int, on func(redisKey string) bool) []string {
	var keys []string
	for i := 0; len(keys) < n; i++ {
		if k := "k" + strconv.Itoa(i); on(s.Key(k)) {
			keys = append(keys, k)
		}
	}
	return keys
}

// wantPublishes deletes keys through s, each heard by w, and checks that
// node i of cs (and no other) answered the PUBLISHes. On a Cluster a key
// is heard up to once per master (dups).
func wantPublishes(t *testing.T, s *Store, w *testenv.Watcher, cs []*redis.Client, i int, keys []string, dups bool) {
	t.Helper()
	before := publishes(t, cs)
	for _, k := range keys {
		mustDelete(t, s, k)
		if dups {
			wantHeard(t, w, k)
		} else {
			w.WantForgot(t, k)
		}
	}
	after := publishes(t, cs)
	for j := range cs {
		want := int64(0)
		if j == i {
			want = int64(len(keys))
		}
		if got := after[j] - before[j]; got != want {
			t.Errorf("deleting %d keys held by node %d: node %d answered %d PUBLISHes, want %d", len(keys), i, j, got, want)
		}
	}
}

// TestDeleteAnnouncesOnKeysMasterCluster: on a Cluster, Delete announces
// through the master that holds the key, which has just answered the HDEL,
// not through whichever master go-redis picks for a keyless PUBLISH (it
// may be down while the key's is not); the watcher listens on every
// master and hears it from that one.
func TestDeleteAnnouncesOnKeysMasterCluster(t *testing.T) {
	pc := startPrivateCluster(t)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: pc.addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { cc.Close() })
	s := newStore(t, cc, Options{Logger: discard()})
	w := testenv.Watch(t, s.WatchDeletes)
	for i := range pc.nodes {
		keys := keysWhere(s, 4, func(k string) bool { return pc.node(t, k) == i })
		wantPublishes(t, s, w, pc.admin, i, keys, true)
	}
}

// newRing returns a Ring of servers whose heartbeat marks a shard down
// (or up) within a few tenths of a second.
func newRing(t testing.TB, servers ...*privateServer) *redis.Ring {
	addrs := map[string]string{}
	for i, ps := range servers {
		addrs["s"+strconv.Itoa(i)] = ps.addr()
	}
	r := redis.NewRing(&redis.RingOptions{Addrs: addrs, ContextTimeoutEnabled: true,
		HeartbeatFrequency: 50 * time.Millisecond, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { r.Close() })
	return r
}

// onShard reports whether r sends redisKey to the server at addr.
func onShard(t testing.TB, r *redis.Ring, addr string) func(string) bool {
	return func(redisKey string) bool {
		c, err := r.GetShardClientForKey(redisKey)
		if err != nil {
			t.Fatal(err)
		}
		return c.Options().Addr == addr
	}
}

// waitShards waits (bounded) until r counts n live shards.
func waitShards(t testing.TB, r *redis.Ring, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for r.Len() != n {
		if time.Now().After(deadline) {
			t.Fatalf("the ring has %d live shards after 10s, want %d", r.Len(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestWatchDeletesRing: a Ring's shards share nothing, pub/sub included,
// so WatchDeletes listens on every shard and Delete announces on the key's
// own, where the HDEL has just been answered: a watcher in another process
// hears of deletions on each shard.
func TestWatchDeletesRing(t *testing.T) {
	servers := []*privateServer{startPrivateServer(t), startPrivateServer(t)}
	prefix := randomPrefix(t)
	watched := newStore(t, newRing(t, servers...), Options{Prefix: prefix})
	deleter := newRing(t, servers...)
	s := newStore(t, deleter, Options{Prefix: prefix})
	w := testenv.Watch(t, watched.WatchDeletes)
	admin := []*redis.Client{servers[0].client(t), servers[1].client(t)}
	for i, ps := range servers {
		wantPublishes(t, s, w, admin, i, keysWhere(s, 3, onShard(t, deleter, ps.addr())), false)
	}
	if n := admin[0].PubSubNumSub(context.Background(), s.deletesChannel()).Val()[s.deletesChannel()] +
		admin[1].PubSubNumSub(context.Background(), s.deletesChannel()).Val()[s.deletesChannel()]; n != 2 {
		t.Errorf("%d subscriptions to the channel over both shards, want the watcher's 2", n)
	}
}

// TestWatchDeletesRingShardDownAndBack: when a shard dies the watcher
// goes on with the others once its ring has marked the shard down (with a
// reset: the lost shard's announcements were missed), and when the shard
// is back it subscribes there too (with a reset again) and hears of
// deletions of its keys.
func TestWatchDeletesRingShardDownAndBack(t *testing.T) {
	setWatchTimes(t, time.Second, 50*time.Millisecond)
	a, b := startPrivateServer(t), startPrivateServer(t)
	prefix := randomPrefix(t)
	watched := newStore(t, newRing(t, a, b), Options{Prefix: prefix})
	deleter := newRing(t, a, b)
	s := newStore(t, deleter, Options{Prefix: prefix})
	w := testenv.Watch(t, watched.WatchDeletes)
	onA := keysWhere(s, 1, onShard(t, deleter, a.addr()))[0]
	onB := keysWhere(s, 1, onShard(t, deleter, b.addr()))[0]

	b.kill()
	w.WantReset(t) // on a alone
	waitShards(t, deleter, 1)
	mustDelete(t, s, onA)
	w.WantForgot(t, onA)
	// A key of the dead shard is not deleted elsewhere (see client).
	if err := s.Delete(context.Background(), onB); !errors.Is(err, idempotency.ErrUnavailable) {
		t.Fatalf("Delete(%s) while its shard is down = %v; want ErrUnavailable", onB, err)
	}

	b.start()
	w.WantReset(t) // on b too
	waitShards(t, deleter, 2)
	for _, k := range keysWhere(s, 3, onShard(t, deleter, b.addr())) {
		mustDelete(t, s, k)
		w.WantForgot(t, k)
	}
}

// TestWatchDeletesRingSameShardsReordered: SetAddrs with the addresses the
// ring has already keeps its shards but may list them in another order
// (go-redis builds the list from a map). The watcher listens on the same
// shards as before, so it goes on without a reset: a reset drops every
// cache entry, and a service that refreshes its addresses periodically
// would otherwise empty its caches each time.
func TestWatchDeletesRingSameShardsReordered(t *testing.T) {
	addrs := map[string]string{}
	for i := range 4 {
		addrs["s"+strconv.Itoa(i)] = startPrivateServer(t).addr()
	}
	var beats atomic.Int64
	r := redis.NewRing(&redis.RingOptions{Addrs: addrs, ContextTimeoutEnabled: true,
		HeartbeatFrequency: 20 * time.Millisecond, DialTimeout: 200 * time.Millisecond,
		HeartbeatFn: func(ctx context.Context, c *redis.Client) bool {
			beats.Add(1)
			return c.Ping(ctx).Err() == nil
		}})
	t.Cleanup(func() { r.Close() })
	waitShards(t, r, len(addrs))
	s := newStore(t, r, Options{Prefix: randomPrefix(t)})
	w := testenv.Watch(t, s.WatchDeletes)

	before := r.GetShardClients()
	for i := 0; slices.Equal(before, r.GetShardClients()); i++ {
		if i == 1000 {
			t.Fatal("SetAddrs with the same addresses never listed the shards in another order")
		}
		r.SetAddrs(addrs)
	}
	if after := r.GetShardClients(); len(after) != len(before) {
		t.Fatalf("the ring lists %d live shards after SetAddrs, want %d", len(after), len(before))
	}
	// Let the watcher look at the ring's shards a few times: it looks
	// as often as the ring's heartbeat runs.
	for n := beats.Load() + 5*int64(len(addrs)); beats.Load() < n; {
		time.Sleep(5 * time.Millisecond)
	}
	mustDelete(t, s, "after-reorder")
	w.WantForgot(t, "after-reorder") // not a reset first
}
