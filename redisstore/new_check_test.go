package redisstore

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/archlab/idempotency"
)

// closedAddr returns the address of a port that nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestNewUnreachableCluster: New on a Cluster none of whose nodes answers
// is not an error, as on a single node: the policy check only warns, and
// the store fails closed with ErrUnavailable when used. (New failed with
// the client's dial error, wrapping neither sentinel, so an application
// could not start while its cluster was briefly down.)
func TestNewUnreachableCluster(t *testing.T) {
	c := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 []string{closedAddr(t)},
		ContextTimeoutEnabled: true,
		DialTimeout:           200 * time.Millisecond,
		MaxRetries:            -1,
	})
	t.Cleanup(func() { c.Close() })
	var buf bytes.Buffer
	s, err := New(c, &Options{OpTimeout: time.Second, RequireNoEviction: true, Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	if err != nil {
		t.Fatalf("New on an unreachable cluster: %v; want a store (and a warning)", err)
	}
	if !strings.Contains(buf.String(), "could not read maxmemory-policy") {
		t.Fatalf("no warning about the unread policy: %q", buf.String())
	}
	_, _, err = s.Begin(context.Background(), "k", "fp", time.Now(), time.Minute, time.Hour)
	if !errors.Is(err, idempotency.ErrUnavailable) {
		t.Fatalf("Begin on an unreachable cluster = %v; want ErrUnavailable", err)
	}
}

// TestEvictionPolicyCheckRing: on a Ring every shard's policy is read, as
// every master's on Cluster. (A keyless CONFIG GET on a Ring goes to one
// shard at random, so an evicting shard passed RequireNoEviction about
// every other time.)
func TestEvictionPolicyCheckRing(t *testing.T) {
	good, bad := startPrivateServer(t), startPrivateServer(t)
	ctx := context.Background()
	if err := bad.client(t).ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewRing(&redis.RingOptions{
		Addrs:                 map[string]string{"good": good.addr(), "bad": bad.addr()},
		ContextTimeoutEnabled: true,
		DialTimeout:           time.Second,
	})
	t.Cleanup(func() { c.Close() })
	// Each New asks again; one that went to the good shard only would pass.
	for i := range 16 {
		if _, err := New(c, &Options{RequireNoEviction: true, Logger: discard()}); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Fatalf("New #%d on a Ring with an allkeys-lru shard, RequireNoEviction: %v; want ErrInvalidConfig", i, err)
		}
		var buf bytes.Buffer
		if _, err := New(c, &Options{Logger: slog.New(slog.NewTextHandler(&buf, nil))}); err != nil {
			t.Fatal(err)
		}
		if log := buf.String(); !strings.Contains(log, "allkeys-lru") || !strings.Contains(log, bad.addr()) || strings.Contains(log, good.addr()) {
			t.Fatalf("New #%d logged %q; want one warning naming %s (allkeys-lru) and none for %s", i, log, bad.addr(), good.addr())
		}
	}
}

// TestEvictionPolicyCheckCluster: on Cluster every master's policy is read:
// one evicting master fails New under RequireNoEviction and is named in
// the warning otherwise; the other master is not.
func TestEvictionPolicyCheckCluster(t *testing.T) {
	pc := startPrivateCluster(t)
	ctx := context.Background()
	if err := pc.admin[1].ConfigSet(ctx, "maxmemory-policy", "volatile-ttl").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: pc.addrs(), ContextTimeoutEnabled: true, DialTimeout: time.Second})
	t.Cleanup(func() { c.Close() })
	if _, err := New(c, &Options{RequireNoEviction: true, Logger: discard()}); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Fatalf("New on a Cluster with a volatile-ttl master, RequireNoEviction: %v; want ErrInvalidConfig", err)
	}
	var buf bytes.Buffer
	if _, err := New(c, &Options{Logger: slog.New(slog.NewTextHandler(&buf, nil))}); err != nil {
		t.Fatal(err)
	}
	port := func(i int) string { return ":" + strconv.Itoa(pc.nodes[i].port) }
	if log := buf.String(); strings.Count(log, "level=WARN") != 1 || !strings.Contains(log, "volatile-ttl") ||
		!strings.Contains(log, port(1)) || strings.Contains(log, port(0)) {
		t.Fatalf("New logged %q; want one warning naming the volatile-ttl master (%s)", log, port(1))
	}
}

// TestEvictionPolicyCheckNamesServer: on a single node the error and the
// warning name the server's address, as on a Ring or a Cluster. (They
// named none: "redisstore: ...: has maxmemory-policy ...", addr="".)
func TestEvictionPolicyCheckNamesServer(t *testing.T) {
	srv := startPrivateServer(t)
	c := srv.client(t)
	if err := c.ConfigSet(context.Background(), "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	_, err := New(c, &Options{RequireNoEviction: true, Logger: discard()})
	if !errors.Is(err, idempotency.ErrInvalidConfig) || !strings.Contains(err.Error(), srv.addr()+" has maxmemory-policy allkeys-lru") {
		t.Errorf("New with RequireNoEviction on an allkeys-lru server: %v; want ErrInvalidConfig naming %s", err, srv.addr())
	}
	var buf bytes.Buffer
	if _, err := New(c, &Options{Logger: slog.New(slog.NewTextHandler(&buf, nil))}); err != nil {
		t.Fatal(err)
	}
	if log := buf.String(); !strings.Contains(log, "addr="+srv.addr()) || !strings.Contains(log, "allkeys-lru") {
		t.Errorf("New logged %q; want a warning naming %s and allkeys-lru", log, srv.addr())
	}
}
