package storeurl

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/testenv"
)

func unique(t *testing.T) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "t" + hex.EncodeToString(b)
}

func open(t *testing.T, raw string, opts Options) idempotency.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, c, err := Open(ctx, raw, opts)
	if err != nil {
		t.Fatalf("Open(%q): %v", raw, err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// roundTrip claims, completes and reads back a key, proving the store is
// live and answers as a Store.
func roundTrip(t *testing.T, s idempotency.Store, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	now := time.Now()
	rec, claimed, err := s.Begin(ctx, key, "fp", now, time.Minute, time.Hour)
	if err != nil || !claimed {
		t.Fatalf("Begin = %+v, %v, %v; want a claim", rec, claimed, err)
	}
	if err := s.Complete(ctx, key, rec.Token, idempotency.Response{Status: 201, Body: []byte("made")}, now, time.Hour); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	got, err := s.Get(ctx, key, now)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if got.State != idempotency.Done || got.Response.Status != 201 || string(got.Response.Body) != "made" {
		t.Fatalf("Get = %+v; want Done 201 made", got)
	}
	if err := s.Delete(ctx, key); err != nil {
		t.Fatalf("Delete: %v", err)
	}
}

func TestMemory(t *testing.T) {
	s := open(t, "memory", Options{})
	if _, ok := s.(*idempotency.MemoryStore); !ok {
		t.Fatalf("memory opened %T", s)
	}
	roundTrip(t, s, "k")
}

func TestBoltSurvivesReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	ctx := context.Background()
	s, c, err := Open(ctx, "bolt:"+path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	rec, _, err := s.Begin(ctx, "k", "fp", now, time.Minute, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, "k", rec.Token, idempotency.Response{Status: 200}, now, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := open(t, "bolt:"+path, Options{})
	got, err := s2.Get(ctx, "k", now)
	if err != nil || got.State != idempotency.Done {
		t.Fatalf("after reopen Get = %+v, %v; want Done", got, err)
	}
	roundTrip(t, s2, "k2")
}

func TestRedis(t *testing.T) {
	base := testenv.RedisURL(t)
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	p1, p2 := unique(t)+":", unique(t)+":"
	a := open(t, base+sep+"prefix="+p1+"&clock=caller", Options{})
	b := open(t, base+sep+"prefix="+p2, Options{})
	roundTrip(t, a, "k")
	// The prefix separates the two stores: a claim in one is not seen by
	// the other.
	ctx := context.Background()
	now := time.Now()
	if _, claimed, err := a.Begin(ctx, "shared", "fp", now, time.Minute, time.Hour); err != nil || !claimed {
		t.Fatalf("a.Begin: %v %v", claimed, err)
	}
	if _, err := b.Get(ctx, "shared", now); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("b.Get of a's key = %v; want ErrNotFound (prefixes must separate)", err)
	}
	if _, claimed, err := b.Begin(ctx, "shared", "fp", now, time.Minute, time.Hour); err != nil || !claimed {
		t.Fatalf("b.Begin: %v %v", claimed, err)
	}
	_ = a.Delete(ctx, "shared")
	_ = b.Delete(ctx, "shared")
}

func TestRedisCluster(t *testing.T) {
	addrs := testenv.RedisCluster(t)
	s := open(t, "redis+cluster://"+strings.Join(addrs, ",")+"?prefix="+unique(t)+":", Options{})
	for i := range 10 { // keys spread over the slots of every master
		roundTrip(t, s, "k"+string(rune('a'+i)))
	}
}

func TestPostgres(t *testing.T) {
	url, _ := testenv.PostgresStoreURL(t, "t")
	raw := url + "&table=keys"
	// Without Migrate the schema is not created, so Open fails.
	wantInvalidWith(t, raw, Options{})
	s := open(t, raw, Options{Migrate: true})
	roundTrip(t, s, "k")
	// postgresql:// is the same form.
	s2 := open(t, strings.Replace(raw, "postgres://", "postgresql://", 1)+"&clock=server", Options{})
	roundTrip(t, s2, "k2")
}

func TestErrors(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want error
	}{
		{"", ErrUnknownScheme},
		{"mysql://x", ErrUnknownScheme},
		{"/tmp/file.db", ErrUnknownScheme},
		{"memory:extra", idempotency.ErrInvalidConfig},
		{"bolt:", idempotency.ErrInvalidConfig},
		{"redis://127.0.0.1:1/0?clock=moon", idempotency.ErrInvalidConfig},
		{"redis://127.0.0.1:1/0?bogus_option=1", idempotency.ErrInvalidConfig},
		{"redis://127.0.0.1:1/0?prefix=a&prefix=b", idempotency.ErrInvalidConfig},
		{"redis+cluster://", idempotency.ErrInvalidConfig},
		{"redis+cluster:127.0.0.1:1", idempotency.ErrInvalidConfig},
		{"redis+cluster://127.0.0.1:1,127.0.0.1:2/3", idempotency.ErrInvalidConfig},
		{"postgres://127.0.0.1:1/x?clock=moon", idempotency.ErrInvalidConfig},
		{"postgres://127.0.0.1:1/x?schema=Bad-Name", idempotency.ErrInvalidConfig},
	} {
		t.Run(tc.url, func(t *testing.T) {
			s, c, err := Open(context.Background(), tc.url, Options{})
			if !errors.Is(err, tc.want) {
				if c != nil {
					c.Close()
				}
				t.Fatalf("Open(%q) = %T, %v; want %v", tc.url, s, err, tc.want)
			}
		})
	}
}

func TestPasswordNotInError(t *testing.T) {
	_, _, err := Open(context.Background(), "redis://u:s3cret@127.0.0.1:bad/0", Options{})
	if err == nil {
		t.Fatal("no error for a bad port")
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("error leaks the password: %v", err)
	}
}

func TestClusterUnreachable(t *testing.T) {
	// Both addresses of the cluster form are used: neither answers, so the
	// store fails closed, at Open or at the first operation.
	s, c, err := Open(context.Background(), "redis+cluster://u:p@127.0.0.1:1,127.0.0.1:2?prefix=x:&dial_timeout=1s&max_retries=-1", Options{})
	if err != nil {
		if !errors.Is(err, idempotency.ErrUnavailable) {
			t.Fatalf("Open = %v; want ErrUnavailable", err)
		}
		return
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := s.Get(ctx, "k", time.Now()); !errors.Is(err, idempotency.ErrUnavailable) {
		t.Fatalf("Get on unreachable cluster = %v; want ErrUnavailable", err)
	}
}

// TestRedisDeadlineReachesSocket: the clients Open makes carry the store's
// per-operation deadline to the socket (ContextTimeoutEnabled), so that no
// call is left running in a goroutine of its own past OpTimeout, held only
// by the client's ReadTimeout.
func TestRedisDeadlineReachesSocket(t *testing.T) {
	check := func(t *testing.T, raw string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, c, err := Open(ctx, raw, Options{})
		if err != nil {
			t.Fatalf("Open(%q): %v", raw, err)
		}
		defer c.Close()
		var enabled bool
		switch c := c.(type) {
		case *redis.Client:
			enabled = c.Options().ContextTimeoutEnabled
		case *redis.ClusterClient:
			enabled = c.Options().ContextTimeoutEnabled
		default:
			t.Fatalf("Open(%q) closer is a %T, want a go-redis client", raw, c)
		}
		if !enabled {
			t.Errorf("Open(%q): client without ContextTimeoutEnabled", raw)
		}
	}
	t.Run("single", func(t *testing.T) {
		base := testenv.RedisURL(t)
		sep := "?"
		if strings.Contains(base, "?") {
			sep = "&"
		}
		check(t, base+sep+"prefix="+unique(t)+":")
	})
	t.Run("cluster", func(t *testing.T) {
		check(t, "redis+cluster://"+strings.Join(testenv.RedisCluster(t), ",")+"?prefix="+unique(t)+":")
	})
}
