package redisstore

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/testenv"
)

// oddKeys are keys with bytes that mean something to Redis Cluster (hash
// tags), to Lua, to the protocol or to C: each must name its own record,
// and its deletion must be announced byte for byte.
var oddKeys = []string{
	"", "{", "}", "{}", "}{", "{a}", "{a}b", "a{b}c", "{{a}}", "a{}b{c}",
	"\x00", "a\x00b", "{\x00}", "\xff\xfe\x80", "\r\n", "*3\r\n$4\r\nPING", " ",
	"%d%s", "é{ü}", strings.Repeat("k", 1<<20),
}

func keyName(k string) string {
	if len(k) > 40 {
		return strconv.Itoa(len(k)) + " bytes"
	}
	return strconv.Quote(k)
}

// roundTrip runs a key's whole life through s, with other watching its
// deletions: claim, complete, replay, get, delete (announced), claim again
// with a larger token.
func roundTrip(t *testing.T, s *Store, w *testenv.Watcher, key string) {
	t.Helper()
	ctx := context.Background()
	now := time.Now()
	fp := "fp:" + key
	body := []byte("body of " + key)
	rec, ok, err := s.Begin(ctx, key, fp, now, time.Minute, time.Hour)
	if err != nil || !ok {
		t.Fatalf("Begin(%s) = %v, %v; want a claim", keyName(key), ok, err)
	}
	resp := idempotency.Response{Status: 201, Header: map[string][]string{"X-K": {key}}, Body: body}
	if err := s.Complete(ctx, key, rec.Token, resp, now, time.Hour); err != nil {
		t.Fatalf("Complete(%s) = %v", keyName(key), err)
	}
	rep, ok, err := s.Begin(ctx, key, fp, now, time.Minute, time.Hour)
	if err != nil || ok || rep.State != idempotency.Done || !bytes.Equal(rep.Response.Body, body) ||
		rep.Response.Status != 201 || len(rep.Response.Header["X-K"]) != 1 || rep.Response.Header["X-K"][0] != key {
		t.Fatalf("replay of %s = %v, %v, state %v status %d; want its own result", keyName(key), ok, err, rep.State, rep.Response.Status)
	}
	if got, err := s.Get(ctx, key, now); err != nil || got.Fingerprint != fp || !bytes.Equal(got.Response.Body, body) {
		t.Fatalf("Get(%s) = fingerprint %s, %v; want its own record", keyName(key), keyName(got.Fingerprint), err)
	}
	if _, ok, err := s.Begin(ctx, key, "other", now, time.Minute, time.Hour); err != nil || ok {
		t.Fatalf("Begin(%s) with another fingerprint = %v, %v; want a conflict", keyName(key), ok, err)
	}
	mustDelete(t, s, key)
	if _, ok := s.c.(*redis.ClusterClient); ok {
		wantHeard(t, w, key) // heard from each master
	} else {
		w.WantForgot(t, key)
	}
	again, ok, err := s.Begin(ctx, key, fp, now, time.Minute, time.Hour)
	if err != nil || !ok || again.Token <= rec.Token {
		t.Fatalf("Begin(%s) after Delete = %v, %v, token %d after %d; want a claim with a larger token", keyName(key), ok, err, again.Token, rec.Token)
	}
}

func TestOddKeys(t *testing.T) {
	c := sharedClient(t)
	s := newStore(t, c, Options{})
	w := testenv.Watch(t, s.WatchDeletes)
	for _, k := range oddKeys {
		roundTrip(t, s, w, k)
	}
	// One record per key: none of them shared another's.
	n, err := c.Keys(context.Background(), s.prefix+"*").Result()
	if err != nil || len(n) != len(oddKeys) {
		t.Fatalf("%d Redis keys (%v) for %d keys", len(n), err, len(oddKeys))
	}
}

// TestOddKeysCluster runs the odd keys on Cluster with a plain prefix (the
// keys' own hash tags spread them) and with a prefix that holds a hash tag
// (every record and the deletion channel in one slot), and checks where
// the records landed.
func TestOddKeysCluster(t *testing.T) {
	c := clusterClient(t)
	ctx := context.Background()
	for _, tagged := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "tagged-prefix"}[tagged], func(t *testing.T) {
			prefix := randomPrefix(t)
			if tagged {
				prefix = "{" + prefix + "}"
			}
			s := newStore(t, c, Options{Prefix: prefix})
			w := testenv.Watch(t, s.WatchDeletes)
			for _, k := range oddKeys {
				roundTrip(t, s, w, k)
			}
			slots := map[int64]bool{}
			for _, k := range oddKeys {
				slot, err := c.ClusterKeySlot(ctx, s.Key(k)).Result()
				if err != nil {
					t.Fatal(err)
				}
				slots[slot] = true
				node, err := c.MasterForKey(ctx, s.Key(k))
				if err != nil {
					t.Fatal(err)
				}
				if n, err := node.Exists(ctx, s.Key(k)).Result(); err != nil || n != 1 {
					t.Fatalf("record of %s not on its slot's master %s: %d, %v", keyName(k), node.Options().Addr, n, err)
				}
			}
			if tagged && len(slots) != 1 || !tagged && len(slots) < 3 {
				t.Fatalf("records in %d slots with prefix %q", len(slots), prefix)
			}
		})
	}
}

// TestLargeResponses: bodies of several MB, stored and replayed by
// concurrent callers (so in batches), come back whole and each to its own
// caller.
func TestLargeResponses(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    func(t *testing.T) redis.UniversalClient
	}{
		{"single", func(t *testing.T) redis.UniversalClient { return sharedClient(t) }},
		{"cluster", func(t *testing.T) redis.UniversalClient { return clusterClient(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t, tc.c(t), Options{OpTimeout: 20 * time.Second})
			ctx := context.Background()
			body := func(i int) []byte {
				b := bytes.Repeat([]byte{byte(i), 0, '\r', '\n', '$'}, (3<<20)/5+i)
				return append(b, strconv.Itoa(i)...)
			}
			var wg sync.WaitGroup
			errs := make(chan error, 32)
			for i := range 8 {
				wg.Go(func() {
					key := "big" + strconv.Itoa(i)
					rec, ok, err := s.Begin(ctx, key, "fp", time.Now(), time.Minute, time.Hour)
					if err != nil || !ok {
						errs <- errors.New(key + ": no claim")
						return
					}
					if err := s.Complete(ctx, key, rec.Token, idempotency.Response{Status: 200, Body: body(i)}, time.Now(), time.Hour); err != nil {
						errs <- err
						return
					}
					for range 3 {
						rep, ok, err := s.Begin(ctx, key, "fp", time.Now(), time.Minute, time.Hour)
						if err != nil || ok || !bytes.Equal(rep.Response.Body, body(i)) {
							errs <- errors.New(key + ": replay is not its own body")
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}
