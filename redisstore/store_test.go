package redisstore

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemtest"
	"github.com/archlab/idempotency/internal/testenv"
)

func newStore(t testing.TB, c redis.UniversalClient, o Options) *Store {
	t.Helper()
	if o.Prefix == "" {
		o.Prefix = randomPrefix(t)
	}
	s, err := New(c, &o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	cleanPrefix(t, c, o.Prefix)
	return s
}

// brokenStore is a store whose server is a closed port.
func brokenStore(t *testing.T) idempotency.Store {
	c := newClient(t, &redis.Options{Addr: closedAddr(t), MaxRetries: -1})
	s, err := New(c, &Options{Clock: CallerClock, OpTimeout: time.Second, Logger: discard()})
	if err != nil {
		t.Fatalf("New on a closed port: %v (an unreachable server must not fail New)", err)
	}
	return s
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestConformance(t *testing.T) {
	c := sharedClient(t)
	idemtest.Run(t, idemtest.Harness{
		New: func(t *testing.T) idempotency.Store {
			return newStore(t, c, Options{Clock: CallerClock})
		},
		Broken: brokenStore,
	})
}

func clusterClient(t testing.TB) *redis.ClusterClient {
	t.Helper()
	addrs := testenv.RedisCluster(t)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return n.Ping(ctx).Err() }); err != nil {
		t.Fatalf("cluster at %v: %v", addrs, err)
	}
	return c
}

func TestConformanceCluster(t *testing.T) {
	c := clusterClient(t)
	idemtest.Run(t, idemtest.Harness{
		New: func(t *testing.T) idempotency.Store {
			return newStore(t, c, Options{Clock: CallerClock})
		},
	})
	// The keys of one store must have spread over the masters: otherwise
	// the run above proved nothing about Cluster.
	ctx := context.Background()
	s := newStore(t, c, Options{Clock: CallerClock})
	now := time.Now()
	for i := range 30 {
		if _, _, err := s.Begin(ctx, "spread-"+strconv.Itoa(i), "fp", now, time.Minute, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	holders := 0
	err := c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		keys, err := n.Keys(ctx, s.Key("spread-*")).Result()
		if len(keys) > 0 {
			mu.Lock()
			holders++
			mu.Unlock()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if holders < 2 {
		t.Fatalf("30 keys landed on %d master(s), want them spread over the cluster", holders)
	}
}

// TestServerClock shows that by default leases are judged by Redis TIME:
// the now arguments, however far off, change nothing.
func TestServerClock(t *testing.T) {
	c := sharedClient(t)
	s := newStore(t, c, Options{})
	ctx := context.Background()
	const lease = 300 * time.Millisecond
	srvNow, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	future := time.Now().Add(48 * time.Hour) // a caller whose clock is two days ahead
	rec, ok, err := s.Begin(ctx, "k", "fp", future, lease, time.Hour)
	if err != nil || !ok {
		t.Fatalf("Begin = %+v, %v, %v; want a claim", rec, ok, err)
	}
	if d := rec.LeaseUntil.Sub(srvNow.Add(lease)); d < 0 || d > 5*time.Second {
		t.Fatalf("LeaseUntil %v is not server TIME %v + lease %v (off by %v)", rec.LeaseUntil, srvNow, lease, d)
	}
	// Another caller, even further ahead, finds the claim in flight: by the
	// caller's clock the lease would have ended long ago.
	got, ok, err := s.Begin(ctx, "k", "fp", future.Add(24*time.Hour), lease, time.Hour)
	if err != nil || ok || got.State != idempotency.Processing || got.Token != rec.Token {
		t.Fatalf("second Begin = %+v, %v, %v; want the first claim in flight", got, ok, err)
	}
	// A caller far behind, once the server's clock passed the lease, takes
	// over: by its own clock the lease has not even begun.
	time.Sleep(lease + 50*time.Millisecond)
	past := time.Now().Add(-48 * time.Hour)
	got, ok, err = s.Begin(ctx, "k", "fp", past, lease, time.Hour)
	if err != nil || !ok || got.Token <= rec.Token {
		t.Fatalf("Begin after the server's lease = %+v, %v, %v; want a takeover with a larger token than %d", got, ok, err, rec.Token)
	}
	// The window's TTL is PEXPIREAT at ExpiresAt by the server's clock.
	exp, err := c.PExpireTime(ctx, s.Key("k")).Result()
	if err != nil {
		t.Fatal(err)
	}
	if d := got.ExpiresAt.Sub(time.UnixMilli(int64(exp / time.Millisecond))); d < -time.Millisecond || d > time.Millisecond {
		t.Fatalf("PEXPIRETIME %v, want ExpiresAt %v", exp, got.ExpiresAt)
	}
	// Get too ignores now.
	if _, err := s.Get(ctx, "k", future.Add(1000*time.Hour)); err != nil {
		t.Fatalf("Get with a far-future now: %v, want the live record", err)
	}
	if err := s.Complete(ctx, "k", got.Token, idempotency.Response{Status: 200}, past, time.Hour); err != nil {
		t.Fatal(err)
	}
	done, err := s.Get(ctx, "k", past)
	if err != nil || done.State != idempotency.Done {
		t.Fatalf("Get after Complete = %+v, %v", done, err)
	}
	if d := done.ExpiresAt.Sub(time.Now().Add(time.Hour)); d < -5*time.Second || d > 5*time.Second {
		t.Fatalf("ExpiresAt %v is not server time + retention", done.ExpiresAt)
	}
}

// TestTokensIncrease checks the tombstone and the server-time floor: tokens
// grow across Release, Delete and physical expiry, with the caller's clock
// standing still.
func TestTokensIncrease(t *testing.T) {
	c := sharedClient(t)
	s := newStore(t, c, Options{Clock: CallerClock})
	ctx := context.Background()
	now := time.Now()
	var last uint64
	claim := func(step string) idempotency.Record {
		t.Helper()
		rec, ok, err := s.Begin(ctx, "k", "fp", now, time.Minute, time.Hour)
		if err != nil || !ok {
			t.Fatalf("%s: Begin = %+v, %v, %v; want a claim", step, rec, ok, err)
		}
		if rec.Token <= last {
			t.Fatalf("%s: token %d, not larger than %d", step, rec.Token, last)
		}
		last = rec.Token
		return rec
	}
	rec := claim("first claim")
	if err := s.Release(ctx, "k", rec.Token); err != nil {
		t.Fatal(err)
	}
	if n, err := c.HLen(ctx, s.Key("k")).Result(); err != nil || n != 1 {
		t.Fatalf("after Release the key holds %d fields (%v), want the tombstone's 1", n, err)
	}
	if ttl, err := c.PTTL(ctx, s.Key("k")).Result(); err != nil || ttl <= 0 {
		t.Fatalf("tombstone TTL %v (%v), want it kept", ttl, err)
	}
	if _, err := s.Get(ctx, "k", now); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("Get of a tombstone: %v, want ErrNotFound", err)
	}
	if err := s.Complete(ctx, "k", rec.Token, idempotency.Response{}, now, time.Hour); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("Complete on a tombstone: %v, want ErrLeaseLost", err)
	}
	rec = claim("after Release")
	if err := s.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	rec = claim("after Delete")
	// Make the token huge, far beyond the server's clock, so only the
	// tombstone can keep the next one larger.
	huge := uint64(1) << 52
	if err := c.HSet(ctx, s.Key("k"), "t", strconv.FormatUint(huge, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	last = huge
	if err := s.Release(ctx, "k", huge); err != nil {
		t.Fatal(err)
	}
	rec = claim("after Release of a huge token")
	if rec.Token != huge+1 {
		t.Fatalf("token %d, want %d", rec.Token, huge+1)
	}
	// Physical expiry: the key is gone, tombstone and all; the server's
	// clock in microseconds still gives a larger token than any earlier
	// real one.
	if err := c.Del(ctx, s.Key("k")).Err(); err != nil {
		t.Fatal(err)
	}
	last = 0
	rec = claim("after the key vanished")
	srv, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if us := uint64(srv.UnixMicro()); rec.Token > us || rec.Token+uint64(10*time.Second/time.Microsecond) < us {
		t.Fatalf("token of a re-created key %d, want the server's TIME in µs (%d)", rec.Token, us)
	}
}

// TestRoundTrips counts what each operation costs the server: a new
// request is two script calls (Begin, Complete), a replay one.
func TestRoundTrips(t *testing.T) {
	ps := startPrivateServer(t)
	c := ps.client(t)
	var sent sync.Map // command name -> *int64
	var mu sync.Mutex
	c.AddHook(countHook{func(name string) {
		mu.Lock()
		defer mu.Unlock()
		v, _ := sent.LoadOrStore(name, new(int64))
		*v.(*int64)++
	}})
	s := newStore(t, c, Options{})
	g, err := idempotency.NewGuard(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	fn := func(context.Context) (idempotency.Response, error) {
		return idempotency.Response{Status: 200, Body: []byte("ok")}, nil
	}
	// Warm the script cache: the first call of each script per server is
	// EVALSHA, NOSCRIPT, then EVAL.
	if _, _, err := g.Do(ctx, "warm", "fp", fn); err != nil {
		t.Fatal(err)
	}
	sentCount := func() map[string]int64 {
		mu.Lock()
		defer mu.Unlock()
		m := map[string]int64{}
		sent.Range(func(k, v any) bool { m[k.(string)] = *v.(*int64); return true })
		return m
	}
	for _, tc := range []struct {
		name string
		key  string
		want int64
		out  idempotency.Outcome
	}{
		{"new request", "k", 2, idempotency.Executed},
		{"replay", "k", 1, idempotency.Replayed},
		{"second new request", "k2", 2, idempotency.Executed},
	} {
		before, sentBefore := commandCalls(t, c), sentCount()
		_, out, err := g.Do(ctx, tc.key, "fp", fn)
		after, sentAfter := commandCalls(t, c), sentCount()
		if err != nil || out != tc.out {
			t.Fatalf("%s: Do = %v, %v; want %v", tc.name, out, err, tc.out)
		}
		d := delta(before, after)
		if d["evalsha"] != tc.want || d["eval"] != 0 {
			t.Errorf("%s: server counted %d EVALSHA and %d EVAL (all: %v), want %d EVALSHA", tc.name, d["evalsha"], d["eval"], d, tc.want)
		}
		sd := delta(sentBefore, sentAfter)
		if sum(sd) != tc.want {
			t.Errorf("%s: client sent %v, want %d round trips", tc.name, sd, tc.want)
		}
	}
}

type countHook struct{ count func(name string) }

func (countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n != "info" {
			h.count(n)
		}
		return next(ctx, cmd)
	}
}
func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.count("pipeline")
		return next(ctx, cmds)
	}
}

func TestEvictionPolicyCheck(t *testing.T) {
	ps := startPrivateServer(t)
	c := ps.client(t)
	ctx := context.Background()
	for _, tc := range []struct {
		policy  string
		require bool
		wantErr bool
		warn    bool
	}{
		{"noeviction", true, false, false},
		{"volatile-lru", false, false, true},
		{"volatile-ttl", true, true, false},
		{"allkeys-lru", true, true, false},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			if err := c.ConfigSet(ctx, "maxmemory-policy", tc.policy).Err(); err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			log := slog.New(slog.NewTextHandler(&buf, nil))
			_, err := New(c, &Options{RequireNoEviction: tc.require, Logger: log})
			if (err != nil) != tc.wantErr || (err != nil && !errors.Is(err, idempotency.ErrInvalidConfig)) {
				t.Fatalf("New with %s (require %v): %v, want error %v wrapping ErrInvalidConfig", tc.policy, tc.require, err, tc.wantErr)
			}
			if got := strings.Contains(buf.String(), tc.policy); got != tc.warn {
				t.Fatalf("warning logged %v, want %v: %q", got, tc.warn, buf.String())
			}
		})
	}
	// A server with CONFIG renamed away only gets a warning.
	ps2 := startPrivateServer(t, "--rename-command", "CONFIG", "")
	var buf bytes.Buffer
	if _, err := New(ps2.client(t), &Options{RequireNoEviction: true, Logger: slog.New(slog.NewTextHandler(&buf, nil))}); err != nil {
		t.Fatalf("New without CONFIG: %v, want a warning only", err)
	}
	if !strings.Contains(buf.String(), "could not read maxmemory-policy") {
		t.Fatalf("no warning without CONFIG: %q", buf.String())
	}
}

func TestOptions(t *testing.T) {
	c := newClient(t, &redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	for _, o := range []Options{{OpTimeout: -1}, {Clock: Clock(7)}} {
		if _, err := New(c, &o); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig", o, err)
		}
	}
	if _, err := New(nil, nil); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("New(nil) = %v, want ErrInvalidConfig", err)
	}
	s, err := New(c, &Options{Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	if s.Key("x") != DefaultPrefix+"x" || s.timeout != DefaultOpTimeout || !s.server {
		t.Fatalf("defaults: %v, timeout %v", s, s.timeout)
	}
}

func TestParseTime(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Time
		ok   bool
	}{
		{"", time.Time{}, true},
		{"01765000000123456789", time.Unix(1765000000, 123456789), true},
		{"1765000000123456789", time.Time{}, false},
		{"0176500000012345678x", time.Time{}, false},
	} {
		got, err := parseTime(tc.in)
		if (err == nil) != tc.ok || !got.Equal(tc.want) {
			t.Errorf("parseTime(%q) = %v, %v; want %v, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}
