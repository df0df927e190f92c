package redisstore

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/testenv"
)

func mustDelete(t *testing.T, s *Store, key string) {
	t.Helper()
	if err := s.Delete(context.Background(), key); err != nil {
		t.Fatal(err)
	}
}

func TestWatchDeletes(t *testing.T) {
	c1, c2 := sharedClient(t), sharedClient(t)
	prefix := randomPrefix(t)
	watched := newStore(t, c1, Options{Prefix: prefix})
	other := newStore(t, c2, Options{Prefix: prefix}) // another process, in effect
	elsewhere := newStore(t, c2, Options{})           // another prefix
	w := testenv.Watch(t, watched.WatchDeletes)

	mustDelete(t, other, "a")
	w.WantForgot(t, "a")
	mustDelete(t, watched, "b") // its own deletions too
	w.WantForgot(t, "b")
	mustDelete(t, elsewhere, "not-mine")
	mustDelete(t, other, "c")
	w.WantForgot(t, "c") // not "not-mine"
}

// TestWatchDeletesResubscribes: a subscription cut by the server is
// reported and made again, with a reset (deletions announced meanwhile
// are lost), and deletions reach the watcher again.
func TestWatchDeletesResubscribes(t *testing.T) {
	ps := startPrivateServer(t)
	s := newStore(t, ps.client(t), Options{})
	w := testenv.Watch(t, s.WatchDeletes)
	admin := ps.client(t)
	if err := admin.Do(context.Background(), "client", "kill", "type", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	w.WantReport(t) // the loss is reported
	w.WantReset(t)
	mustDelete(t, s, "after")
	w.WantForgot(t, "after")

	// A server gone for a while: the watcher keeps trying, and is back
	// with a reset when the server is.
	ps.kill()
	w.WantReport(t)
	time.Sleep(2 * watchRetry)
	ps.start()
	w.WantReset(t)
	mustDelete(t, s, "back")
	w.WantForgot(t, "back")
}

func TestWatchDeletesEndsWithContext(t *testing.T) {
	s := newStore(t, sharedClient(t), Options{})
	w := testenv.Watch(t, s.WatchDeletes)
	w.WantReturn(t, time.Second)
}

func TestWatchDeletesCluster(t *testing.T) {
	c1, c2 := clusterClient(t), clusterClient(t)
	prefix := randomPrefix(t)
	watched := newStore(t, c1, Options{Prefix: prefix})
	other := newStore(t, c2, Options{Prefix: prefix})
	w := testenv.Watch(t, watched.WatchDeletes)
	// Keys in several slots: the deletion reaches the watcher whichever
	// master holds the key.
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		mustDelete(t, other, k)
		wantHeard(t, w, k)
	}
}

// drainDups passes over the keys forgotten again (a Cluster's deletions
// are heard from each master) before a test waits for a reset.
func drainDups(w *testenv.Watcher) {
	w.Forgot("\x00no such key", 300*time.Millisecond)
}

// wantHeard fails t unless w forgets key within w.Wait, passing over the
// keys forgotten before: on a Cluster a deletion is heard from each master
// (see watchCluster).
func wantHeard(t testing.TB, w *testenv.Watcher, key string) {
	t.Helper()
	if !w.Forgot(key, w.Wait) {
		t.Fatalf("deletion of %q not heard within %v", key, w.Wait)
	}
}

// setWatchTimes shortens WatchDeletes's ping interval and retry pause for
// the test.
func setWatchTimes(t *testing.T, ping, retry time.Duration) {
	oldPing, oldRetry := watchPing, watchRetry
	watchPing, watchRetry = ping, retry
	t.Cleanup(func() { watchPing, watchRetry = oldPing, oldRetry })
}

// TestWatchDeletesPausedServer: a server that stops answering (SIGSTOP:
// the connection stays open, as when a host or a network path dies
// without a reset) is noticed by the ping, reported, and the subscription
// is made again, with a reset, once the server answers.
func TestWatchDeletesPausedServer(t *testing.T) {
	setWatchTimes(t, 100*time.Millisecond, 50*time.Millisecond)
	ps := startPrivateServer(t)
	s := newStore(t, ps.client(t), Options{OpTimeout: 300 * time.Millisecond})
	w := testenv.Watch(t, s.WatchDeletes)
	ps.signal(syscall.SIGSTOP)
	err := w.WantReport(t)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("reported %v, want a timeout", err)
	}
	ps.signal(syscall.SIGCONT)
	w.WantReset(t)
	mustDelete(t, s, "after")
	w.WantForgot(t, "after")
}

// TestWatchDeletesQuietServer: a server that answers the pings keeps the
// subscription however long no deletion comes (a pong is an answer, in
// RESP2 and RESP3): no report, and no reset, which would empty the cache.
func TestWatchDeletesQuietServer(t *testing.T) {
	setWatchTimes(t, 20*time.Millisecond, 10*time.Millisecond)
	for _, proto := range []int{2, 3} {
		t.Run("RESP"+strconv.Itoa(proto), func(t *testing.T) {
			o, err := redis.ParseURL(testenv.RedisURL(t))
			if err != nil {
				t.Fatal(err)
			}
			o.Protocol = proto
			s := newStore(t, newClient(t, o), Options{})
			w := testenv.Watch(t, s.WatchDeletes)
			time.Sleep(20 * watchPing)
			w.WantNoReport(t) // the subscription did not fail
			w.WantQuiet(t)    // nor was it made again
			mustDelete(t, s, "k")
			w.WantForgot(t, "k")
		})
	}
}

// TestWatchDeletesEndsWithContextWhileServerPaused: cancelled while it
// connects to a server that accepts connections and never answers,
// WatchDeletes returns within OpTimeout, not the client's ReadTimeout
// (which may be long or none: the watcher's stop then held up idemproxy's
// shutdown).
func TestWatchDeletesEndsWithContextWhileServerPaused(t *testing.T) {
	setWatchTimes(t, 100*time.Millisecond, 10*time.Millisecond)
	ps := startPrivateServer(t)
	c := newClient(t, &redis.Options{Addr: ps.addr(), ReadTimeout: 30 * time.Second, MaxRetries: -1})
	s := newStore(t, c, Options{OpTimeout: 200 * time.Millisecond})
	w := testenv.Watch(t, s.WatchDeletes)
	ps.signal(syscall.SIGSTOP)
	t.Cleanup(func() { ps.signal(syscall.SIGCONT) })
	w.WantReport(t) // the ping went unanswered
	// watchRetry later it connects again, and the server accepts the
	// connection but answers nothing.
	time.Sleep(100 * time.Millisecond)
	w.WantReturn(t, 3*time.Second)
}

// TestWatchDeletesWithoutChannelPermission: an ACL user without the
// channel (Redis 7 users start with none) cannot subscribe: WatchDeletes
// reports NOPERM and tries again a watchRetry later (no spinning), never
// calls reset, and Delete still deletes.
func TestWatchDeletesWithoutChannelPermission(t *testing.T) {
	setWatchTimes(t, time.Second, 100*time.Millisecond)
	ps := startPrivateServer(t)
	ctx := context.Background()
	if err := ps.client(t).Do(ctx, "acl", "setuser", "nochan", "on", ">pw", "~*", "+@all", "resetchannels").Err(); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, &redis.Options{Addr: ps.addr(), Username: "nochan", Password: "pw"})
	s := newStore(t, c, Options{Clock: CallerClock})
	start := time.Now()
	w := testenv.StartWatch(t, s.WatchDeletes)
	for range 3 {
		if err := w.WantReport(t); !strings.Contains(err.Error(), "NOPERM") {
			t.Fatalf("reported %v, want NOPERM", err)
		}
	}
	if took := time.Since(start); took < 2*watchRetry {
		t.Errorf("3 refusals reported within %v: WatchDeletes does not pause %v between tries", took, watchRetry)
	}
	w.WantQuiet(t) // no reset without a subscription

	now := time.Now()
	if _, claimed, err := s.Begin(ctx, "k", "fp", now, time.Minute, time.Hour); err != nil || !claimed {
		t.Fatalf("Begin = %v, %v", claimed, err)
	}
	if err := s.Delete(ctx, "k"); err != nil {
		t.Fatalf("Delete without PUBLISH permission = %v, want nil (the announcement is best effort)", err)
	}
	if _, err := s.Get(ctx, "k", now); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("Get after Delete = %v, want ErrNotFound", err)
	}
}

// TestDeleteAnnouncementBoundedWithoutContextTimeout: on a client without
// ContextTimeoutEnabled (go-redis's default), a node that stops answering
// between the HDEL and the PUBLISH holds Delete for OpTimeout, not for the
// client's ReadTimeout.
func TestDeleteAnnouncementBoundedWithoutContextTimeout(t *testing.T) {
	a, b := startPrivateServer(t), startPrivateServer(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a.addr(), "b": b.addr()},
		ReadTimeout: 10 * time.Second, MaxRetries: -1})
	t.Cleanup(func() { ring.Close() })
	s := newStore(t, ring, Options{OpTimeout: 300 * time.Millisecond, Logger: discard()})
	ctx := context.Background()
	const key = "k"
	if _, _, err := s.Begin(ctx, key, "fp", time.Now(), time.Minute, time.Hour); err != nil {
		t.Fatal(err)
	}
	node, err := ring.GetShardClientForKey(s.Key(key))
	if err != nil {
		t.Fatal(err)
	}
	paused := a
	if node.Options().Addr == b.addr() {
		paused = b
	}
	node.AddHook(afterCommand{name: "hdel", do: func() { paused.signal(syscall.SIGSTOP) }})
	t.Cleanup(func() { paused.signal(syscall.SIGCONT) })
	start := time.Now()
	err = s.Delete(ctx, key)
	took := time.Since(start)
	if err != nil {
		t.Errorf("Delete = %v, want nil (the key's node answered the HDEL)", err)
	}
	if took > 2*time.Second {
		t.Errorf("Delete took %v with OpTimeout 300ms (the node paused before the announcement)", took)
	}
	paused.signal(syscall.SIGCONT)
	if _, err := s.Get(ctx, key, time.Now()); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Get after Delete = %v, want ErrNotFound", err)
	}
}

// afterCommand is a hook that calls do once a command of the given name
// has been answered.
type afterCommand struct {
	name string
	do   func()
}

func (h afterCommand) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h afterCommand) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h afterCommand) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Name() == h.name {
			h.do()
		}
		return err
	}
}

// TestDeleteAnnouncesAfterCallerCancels: a caller that cancels its ctx
// once the record is deleted (an operator's HTTP client gone) does not
// take the announcement with it: the other processes' caches forget the
// key.
func TestDeleteAnnouncesAfterCallerCancels(t *testing.T) {
	prefix := randomPrefix(t)
	w := testenv.Watch(t, newStore(t, sharedClient(t), Options{Prefix: prefix}).WatchDeletes)
	c := sharedClient(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c.AddHook(afterCommand{name: "hdel", do: cancel})
	s := newStore(t, c, Options{Prefix: prefix})
	if err := s.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if ctx.Err() == nil {
		t.Fatal("the hook did not cancel the context")
	}
	w.WantForgot(t, "k")
}

// TestWatchDeletesClusterMigrationAndFailure: on a private two-master
// cluster, the watcher listens on both masters and keeps receiving while
// a slot moves to the other master, and when one dies and the survivor
// takes over its slots, it listens on the survivor alone, with a reset.
func TestWatchDeletesClusterMigrationAndFailure(t *testing.T) {
	setWatchTimes(t, time.Second, 100*time.Millisecond)
	pc := startPrivateCluster(t)
	nodes, admin, ids, ranges := pc.nodes, pc.admin, pc.ids, pc.ranges
	ctx := context.Background()

	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: pc.addrs(), ContextTimeoutEnabled: true, MaxRetries: 2})
	t.Cleanup(func() { cc.Close() })
	s := newStore(t, cc, Options{Logger: discard(), OpTimeout: 500 * time.Millisecond})
	w := testenv.Watch(t, s.WatchDeletes)
	// x: the master of the channel's slot, which moves; y: the other.
	slot := int(admin[0].ClusterKeySlot(ctx, s.deletesChannel()).Val())
	x, y := 1, 0
	if slot <= ranges[0][1] {
		x, y = 0, 1
	}
	for i := range admin {
		if n := admin[i].Do(ctx, "pubsub", "numsub", s.deletesChannel()).Val().([]any)[1].(int64); n != 1 {
			t.Fatalf("master %d has %d subscribers to the channel, want the watcher", i, n)
		}
	}
	for i := range 4 { // keys on both masters
		mustDelete(t, s, "a"+strconv.Itoa(i))
		wantHeard(t, w, "a"+strconv.Itoa(i))
	}

	// The channel's slot moves to y (no key holds it: SETSLOT NODE alone).
	if err := admin[y].Do(ctx, "cluster", "setslot", slot, "node", ids[y]).Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin[x].Do(ctx, "cluster", "setslot", slot, "node", ids[y]).Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		mustDelete(t, s, "b"+strconv.Itoa(i))
		wantHeard(t, w, "b"+strconv.Itoa(i))
	}

	// x dies; y forgets it and takes its slots, as a failover would.
	drainDups(w)
	nodes[x].kill()
	w.WantReport(t)
	if err := admin[y].Do(ctx, "cluster", "forget", ids[x]).Err(); err != nil {
		t.Fatal(err)
	}
	for _, r := range [][2]int{{ranges[x][0], slot - 1}, {slot + 1, ranges[x][1]}} {
		if r[0] > r[1] {
			continue
		}
		if err := admin[y].Do(ctx, "cluster", "addslotsrange", r[0], r[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	pc.waitOK(t, admin[y])
	start := time.Now()
	w.Wait = 10 * time.Second
	w.WantReset(t) // subscribed again
	t.Logf("subscribed again %v after the failover", time.Since(start))
	// Announcements are best effort: until the client has learnt the new
	// slot map, a PUBLISH (routed to any node) may go to the dead one and
	// be lost, and a Delete may fail. Each key is deleted again until the
	// watcher hears of it; what this checks is that the feed is back.
	for i := range 4 {
		k := "c" + strconv.Itoa(i)
		deadline := time.Now().Add(10 * time.Second)
		for {
			if err := s.Delete(ctx, k); err != nil {
				// A Delete is sent once, never re-routed: on a stale slot
				// map it fails against the dead node until the map is
				// reloaded, which nothing else asks for here.
				cc.ReloadState(ctx)
			}
			if w.Forgot(k, 200*time.Millisecond) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%q: no announcement heard within 10s after the failover", k)
			}
		}
	}
}

// TestWatchDeletesClusterNodePaused: one master of three stops (SIGSTOP)
// for longer than the cluster's node timeout, but not long enough for the
// watcher's ping to notice; meanwhile keys held by another master are
// deleted and announced there. The cluster's bus does not pass every
// announcement on to the paused node, so a watcher that listened there
// alone missed some and was never reset, leaving a replay cache serving
// deleted records until their TTL. Each deletion must be heard (or the
// watcher reset).
func TestWatchDeletesClusterNodePaused(t *testing.T) {
	setWatchTimes(t, 10*time.Second, 100*time.Millisecond)
	pc, s := threeMasterStore(t)
	x := pc.node(t, s.deletesChannel()) // where a single subscription goes
	y := (x + 1) % 3
	keys := keysWhere(s, 8, func(k string) bool { return pc.node(t, k) == y })
	w := testenv.Watch(t, s.WatchDeletes)
	mustDelete(t, s, keys[0])
	if !w.Forgot(keys[0], 5*time.Second) {
		t.Fatalf("%s: deletion not heard", keys[0])
	}

	pc.nodes[x].signal(syscall.SIGSTOP)
	paused := true
	defer func() {
		if paused {
			pc.nodes[x].signal(syscall.SIGCONT)
		}
	}()
	// Deletions spread over 4 s, 8 node timeouts: x's links to the others
	// are dropped and made again meanwhile.
	for _, k := range keys[1:] {
		time.Sleep(500 * time.Millisecond)
		if err := s.Delete(context.Background(), k); err != nil {
			t.Fatalf("Delete(%s) on a live master while another is paused: %v", k, err)
		}
	}
	time.Sleep(500 * time.Millisecond)
	pc.nodes[x].signal(syscall.SIGCONT)
	paused = false
	for _, k := range keys[1:] {
		if !w.Forgot(k, 5*time.Second) {
			t.Fatalf("%s, deleted on master %d while master %d was paused: neither heard nor reset", k, y, x)
		}
	}
	w.WantNoReport(t) // nothing failed
}

// TestWatchDeletesClusterMasterDown: one master of three dies (no
// failover; the others serve their own slots). Its subscription's loss is
// reported and tried again, but the deletions on the live masters are
// still heard; when the master is back, the watcher listens there again,
// with a reset (what it announced meanwhile was missed), and hears its
// deletions.
func TestWatchDeletesClusterMasterDown(t *testing.T) {
	setWatchTimes(t, time.Second, 100*time.Millisecond)
	pc, s := threeMasterStore(t)
	x := pc.node(t, s.deletesChannel()) // where a single subscription goes
	y := (x + 1) % 3
	onX := keysWhere(s, 3, func(k string) bool { return pc.node(t, k) == x })
	onY := keysWhere(s, 3, func(k string) bool { return pc.node(t, k) == y })
	w := testenv.Watch(t, s.WatchDeletes)
	mustDelete(t, s, onY[0])
	wantHeard(t, w, onY[0])
	drainDups(w)

	pc.nodes[x].kill()
	w.WantReport(t)
	for _, k := range onY[1:] {
		mustDelete(t, s, k)
		wantHeard(t, w, k)
	}

	drainDups(w)
	pc.nodes[x].start()
	w.Wait = 10 * time.Second
	w.WantReset(t)
	// x's deletions are heard again; until the client reconnects to x a
	// Delete of its key may fail, so each is tried until it succeeds.
	for _, k := range onX {
		deadline := time.Now().Add(10 * time.Second)
		for s.Delete(context.Background(), k) != nil {
			if time.Now().After(deadline) {
				t.Fatalf("Delete(%s) still failing 10s after its master is back", k)
			}
			time.Sleep(50 * time.Millisecond)
		}
		wantHeard(t, w, k)
	}
}

// threeMasterStore starts a private Cluster of three masters that serve
// their slots while another is down (the two others stay a majority, and
// full coverage is not required), and a Store on it.
func threeMasterStore(t *testing.T) (*privateCluster, *Store) {
	t.Helper()
	pc := startPrivateClusterOf(t, [][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}})
	for _, c := range pc.admin {
		if err := c.ConfigSet(context.Background(), "cluster-require-full-coverage", "no").Err(); err != nil {
			t.Fatal(err)
		}
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: pc.addrs(), ContextTimeoutEnabled: true, MaxRetries: 2})
	t.Cleanup(func() { cc.Close() })
	return pc, newStore(t, cc, Options{Logger: discard(), OpTimeout: 500 * time.Millisecond})
}
