package redisstore

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/archlab/idempotency"
)

// TestRingShardDownFailsClosed: a Ring whose heartbeat marks a shard down
// sends that shard's keys to the others, where their records are not. A
// key whose shard is paused must then fail with ErrUnavailable: claimed
// again on another shard it would run a second time (done, or in flight
// on the paused one), a Delete there would report done what was not, and
// a Get would answer "not found". Keys of the live shards go on, and the
// paused shard's keys answer from their records once it is back.
func TestRingShardDownFailsClosed(t *testing.T) {
	a, b := startPrivateServer(t), startPrivateServer(t)
	r := redis.NewRing(&redis.RingOptions{
		Addrs:                 map[string]string{"a": a.addr(), "b": b.addr()},
		ContextTimeoutEnabled: true,
		HeartbeatFrequency:    50 * time.Millisecond,
		DialTimeout:           200 * time.Millisecond,
		ReadTimeout:           200 * time.Millisecond, // the heartbeat's PING to a paused shard
		WriteTimeout:          200 * time.Millisecond,
	})
	t.Cleanup(func() { r.Close() })
	s := newStore(t, r, Options{OpTimeout: 500 * time.Millisecond, Logger: discard()})
	ctx := context.Background()
	onB := keysWhere(s, 2, onShard(t, r, b.addr()))
	done, held := onB[0], onB[1]
	onA := keysWhere(s, 1, onShard(t, r, a.addr()))[0]
	rec, ok, err := s.Begin(ctx, done, "fp", time.Now(), time.Minute, time.Hour)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if err := s.Complete(ctx, done, rec.Token, idempotency.Response{Status: 200, Body: []byte("once")}, time.Now(), time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Begin(ctx, held, "fp", time.Now(), time.Minute, time.Hour); err != nil || !ok {
		t.Fatal(ok, err)
	}

	b.signal(syscall.SIGSTOP)
	paused := true
	defer func() {
		if paused {
			b.signal(syscall.SIGCONT)
		}
	}()
	waitShards(t, r, 1)
	for _, k := range []string{done, held} {
		if _, ok, err := s.Begin(ctx, k, "fp", time.Now(), time.Minute, time.Hour); !errors.Is(err, idempotency.ErrUnavailable) {
			t.Errorf("Begin(%s) while its shard is down = %v, %v; want ErrUnavailable (claimed elsewhere, it runs again)", k, ok, err)
		}
	}
	if _, err := s.Get(ctx, done, time.Now()); !errors.Is(err, idempotency.ErrUnavailable) {
		t.Errorf("Get(%s) while its shard is down = %v; want ErrUnavailable", done, err)
	}
	if err := s.Delete(ctx, done); !errors.Is(err, idempotency.ErrUnavailable) {
		t.Errorf("Delete(%s) while its shard is down = %v; want ErrUnavailable (its record stays)", done, err)
	}
	if _, ok, err := s.Begin(ctx, onA, "fp", time.Now(), time.Minute, time.Hour); err != nil || !ok {
		t.Errorf("Begin(%s) on the live shard = %v, %v; want a claim", onA, ok, err)
	}

	b.signal(syscall.SIGCONT)
	paused = false
	waitShards(t, r, 2)
	if rep, ok, err := s.Begin(ctx, done, "fp", time.Now(), time.Minute, time.Hour); err != nil || ok || string(rep.Response.Body) != "once" {
		t.Errorf("Begin(%s) with its shard back = %v, %+v, %v; want the replay", done, ok, rep, err)
	}
	if rep, ok, err := s.Begin(ctx, held, "fp", time.Now(), time.Minute, time.Hour); err != nil || ok || rep.State != idempotency.Processing {
		t.Errorf("Begin(%s) with its shard back = %v, %+v, %v; want in flight", held, ok, rep, err)
	}
}

// TestRingSetAddrsFollowed: shards given to the ring by SetAddrs after New
// are used as the ring routes to them (only a shard of the ring as built
// that is down makes its keys fail).
func TestRingSetAddrsFollowed(t *testing.T) {
	a, b, c := startPrivateServer(t), startPrivateServer(t), startPrivateServer(t)
	r := newRing(t, a)
	s := newStore(t, r, Options{Logger: discard()})
	ctx := context.Background()
	for _, addrs := range []map[string]string{
		{"s0": a.addr(), "s1": b.addr()}, // one more
		{"s2": c.addr()},                 // all new
	} {
		r.SetAddrs(addrs)
		waitShards(t, r, len(addrs))
		for _, addr := range addrs {
			for _, k := range keysWhere(s, 2, onShard(t, r, addr)) {
				if _, ok, err := s.Begin(ctx, k, "fp", time.Now(), time.Minute, time.Hour); err != nil {
					t.Fatalf("Begin(%s) on %s after SetAddrs(%v) = %v, %v", k, addr, addrs, ok, err)
				}
			}
		}
	}
}
