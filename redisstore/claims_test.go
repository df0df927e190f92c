package redisstore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/archlab/idempotency"
)

// TestFullServerFailsClosed: with maxmemory-policy noeviction a full
// server refuses writes that would grow it (OOM). Redis judges a script at
// its first write: a new claim, a takeover and a renewal are refused, with
// ErrUnavailable and nothing written (the Guard does not run fn), while
// Complete, Release and Delete, which begin by removing fields, go
// through, and so does a claim that replaces an ended record.
func TestFullServerFailsClosed(t *testing.T) {
	ps := startPrivateServer(t)
	c := ps.client(t)
	s := newStore(t, c, Options{Clock: CallerClock, Logger: discard()})
	ctx := context.Background()
	now := time.Now()
	claim := func(key string, now time.Time) idempotency.Record {
		t.Helper()
		rec, ok, err := s.Begin(ctx, key, "fp", now, time.Minute, time.Hour)
		if err != nil || !ok {
			t.Fatalf("Begin %s = %v, %v; want a claim", key, ok, err)
		}
		return rec
	}
	held, stale, released := claim("held", now), claim("stale", now.Add(-2*time.Minute)), claim("released", now)
	if err := s.Release(ctx, "released", released.Token); err != nil {
		t.Fatal(err)
	}
	// Make the server full: its data over maxmemory. (Filling it up to
	// maxmemory with SETs is not enough: the SET refused is the one whose
	// own query buffer went over, and once it is gone small writes fit.)
	if err := c.Set(ctx, "filler", strings.Repeat("x", 2<<20), 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.ConfigSet(ctx, "maxmemory", "1mb").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.ConfigSet(context.Background(), "maxmemory", "0").Err() })
	if err := c.Set(ctx, "probe", "x", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
		t.Fatalf("SET on the full server = %v, want an OOM refusal", err)
	}

	wantOOM := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, idempotency.ErrUnavailable) || !strings.Contains(err.Error(), "OOM") {
			t.Fatalf("%s on a full server = %v, want ErrUnavailable wrapping the OOM refusal", what, err)
		}
		var rerr redis.Error
		if !errors.As(err, &rerr) {
			t.Fatalf("%s = %v: errors.As finds no redis.Error", what, err)
		}
	}
	_, _, err := s.Begin(ctx, "new", "fp", now, time.Minute, time.Hour)
	wantOOM("Begin of a new key", err)
	if n, err := c.Exists(ctx, s.Key("new")).Result(); err != nil || n != 0 {
		t.Fatalf("a refused Begin left the key (%d, %v)", n, err)
	}
	g, err := idempotency.NewGuard(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	_, _, err = g.Do(ctx, "guarded", "fp", func(context.Context) (idempotency.Response, error) {
		ran = true
		return idempotency.Response{Status: 200}, nil
	})
	if ran || !errors.Is(err, idempotency.ErrUnavailable) {
		t.Fatalf("Guard.Do on a full server: ran %v, err %v; want ErrUnavailable without running fn", ran, err)
	}
	_, _, err = s.Begin(ctx, "stale", "fp", now, time.Minute, time.Hour)
	wantOOM("Begin taking over an abandoned claim", err)
	if rec, err := s.Get(ctx, "stale", now.Add(-2*time.Minute)); err != nil || rec.Token != stale.Token {
		t.Fatalf("the abandoned claim after a refused takeover: %+v, %v; want it unchanged", rec, err)
	}
	wantOOM("Extend", s.Extend(ctx, "held", held.Token, now, time.Minute))
	if rec, err := s.Get(ctx, "held", now); err != nil || !rec.LeaseUntil.Equal(held.LeaseUntil) {
		t.Fatalf("the claim after a refused Extend: %+v, %v; want its lease unchanged %v", rec, err, held.LeaseUntil)
	}

	// Work already done keeps its result; the rest frees the key.
	if err := s.Complete(ctx, "held", held.Token, idempotency.Response{Status: 200, Body: []byte("result")}, now, time.Hour); err != nil {
		t.Fatalf("Complete on a full server = %v, want its result stored", err)
	}
	if rec, err := s.Get(ctx, "held", now); err != nil || rec.State != idempotency.Done || string(rec.Response.Body) != "result" {
		t.Fatalf("after Complete the record is %+v (%v), want the result", rec, err)
	}
	if err := s.Release(ctx, "stale", stale.Token); err != nil {
		t.Fatalf("Release on a full server = %v", err)
	}
	if err := s.Delete(ctx, "held"); err != nil {
		t.Fatalf("Delete on a full server = %v", err)
	}
	if again := claim("released", now); again.Token <= released.Token {
		t.Fatalf("claim over a tombstone got token %d, not above %d", again.Token, released.Token)
	}
}

// TestReplicaFailsClosed: a client that reaches a replica (a stale
// Sentinel answer, a misconfigured address) meets READONLY on every write:
// the store fails closed with ErrUnavailable, claims nothing, and does not
// mistake a refused Complete for a lost lease.
func TestReplicaFailsClosed(t *testing.T) {
	master := startPrivateServer(t, "--repl-diskless-sync-delay", "0")
	replica := startPrivateServer(t, "--replicaof", "127.0.0.1", strconv.Itoa(master.port))
	prefix := randomPrefix(t)
	onMaster := newStore(t, master.client(t), Options{Prefix: prefix, Clock: CallerClock, Logger: discard()})
	onReplica := newStore(t, replica.client(t), Options{Prefix: prefix, Clock: CallerClock, Logger: discard()})
	ctx := context.Background()
	now := time.Now()
	held, ok, err := onMaster.Begin(ctx, "held", "fp", now, time.Minute, time.Hour)
	if err != nil || !ok {
		t.Fatalf("Begin on the master = %v, %v", ok, err)
	}
	waitReplicated(t, master)
	if _, err := onReplica.Get(ctx, "held", now); err != nil {
		t.Fatalf("Get of the replicated claim on the replica: %v", err)
	}

	_, _, err = onReplica.Begin(ctx, "new", "fp", now, time.Minute, time.Hour)
	if !errors.Is(err, idempotency.ErrUnavailable) || !strings.Contains(err.Error(), "READONLY") {
		t.Fatalf("Begin on a replica = %v, want ErrUnavailable wrapping READONLY", err)
	}
	err = onReplica.Complete(ctx, "held", held.Token, idempotency.Response{Status: 200}, now, time.Hour)
	if !errors.Is(err, idempotency.ErrUnavailable) || errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("Complete on a replica = %v, want ErrUnavailable (the claim is not lost)", err)
	}
	if err := onReplica.Delete(ctx, "held"); !errors.Is(err, idempotency.ErrUnavailable) {
		t.Fatalf("Delete on a replica = %v, want ErrUnavailable", err)
	}
	if rec, err := onMaster.Get(ctx, "held", now); err != nil || rec.State != idempotency.Processing || rec.Token != held.Token {
		t.Fatalf("the claim on the master after the replica's refusals: %+v, %v", rec, err)
	}
}

// TestCallerClockTTLNeverShortened: by the caller's clock the TTL is the
// window's end minus the now given, and a later call never shortens it. A
// host whose clock runs ahead, or a Complete with a shorter retention,
// must not make Redis drop a record that the other hosts still judge
// live: a retry would then run the operation a second time.
func TestCallerClockTTLNeverShortened(t *testing.T) {
	c := sharedClient(t)
	s := newStore(t, c, Options{Clock: CallerClock})
	ctx := context.Background()
	now := time.Now()
	ttl := func() time.Duration {
		t.Helper()
		d, err := c.PTTL(ctx, s.Key("k")).Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	rec, ok, err := s.Begin(ctx, "k", "fp", now, time.Minute, time.Hour)
	if err != nil || !ok {
		t.Fatalf("Begin = %v, %v", ok, err)
	}
	if d := ttl(); d < 59*time.Minute || d > time.Hour {
		t.Fatalf("TTL after Begin %v, want the window's hour", d)
	}
	ahead := now.Add(50 * time.Minute) // a host 50 minutes ahead
	if err := s.Extend(ctx, "k", rec.Token, ahead, time.Second); err != nil {
		t.Fatal(err)
	}
	if d := ttl(); d < 59*time.Minute {
		t.Fatalf("TTL after an Extend from a host ahead %v, want it kept at about an hour", d)
	}
	if err := s.Complete(ctx, "k", rec.Token, idempotency.Response{Status: 200}, ahead, time.Minute); err != nil {
		t.Fatal(err)
	}
	if d := ttl(); d < 59*time.Minute {
		t.Fatalf("TTL after a Complete from a host ahead with a short retention %v, want it kept at about an hour", d)
	}
	if err := s.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if d := ttl(); d < 59*time.Minute {
		t.Fatalf("tombstone's TTL %v, want the record's kept", d)
	}
}
