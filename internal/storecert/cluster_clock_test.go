package storecert

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/archlab/idempotency/idemtest"
	"github.com/archlab/idempotency/internal/storeurl"
	"github.com/archlab/idempotency/internal/testenv"
)

// clusterURL is a redis+cluster:// URL on the test cluster with a prefix
// of its own, then extra (query parameters, each starting with &).
func clusterURL(t *testing.T, extra string) string {
	t.Helper()
	return "redis+cluster://" + strings.Join(testenv.RedisCluster(t), ",") +
		"?prefix=storecert-test-" + newRunID() + ":" + extra
}

// TestRunRedisCluster certifies a Redis Cluster store on its default clock,
// the server's: the contract's clauses move time through their now
// arguments, so they must run on a clock=caller handle, as for redis://.
func TestRunRedisCluster(t *testing.T) {
	certifies(t, clusterURL(t, ""))
}

// TestRedisClusterClocks: whatever clock= a cluster URL gives, the
// contract's clauses run on the caller's clock, and the campaign runs on
// the clock the URL names (the server's by default), and knows which.
func TestRedisClusterClocks(t *testing.T) {
	const clause = "Begin/processing-past-lease-takes-over"
	var takeover idemtest.Clause
	for _, cl := range idemtest.Clauses() {
		if cl.Name == clause {
			takeover = cl
		}
	}
	if takeover.Name == "" {
		t.Fatalf("idemtest has no clause %q", clause)
	}
	for _, tc := range []struct {
		name        string
		extra       string
		serverClock bool
	}{
		{"default", "", true},
		{"server", "&clock=server", true},
		{"caller", "&clock=caller", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			tgt, err := resolve(ctx, clusterURL(t, tc.extra))
			if err != nil {
				t.Fatal(err)
			}
			defer tgt.close()
			if err := takeover.Check(ctx, tgt.contract); err != nil {
				t.Errorf("contract handle: %v", err)
			}
			if tgt.serverClock != tc.serverClock {
				t.Errorf("campaign on the server's clock = %v, want %v", tgt.serverClock, tc.serverClock)
			}
			f, err := tgt.campaign(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			defer f.close()
			// A claim made an hour ago by the caller's clock has a lease
			// long over; on the server's clock it was made just now.
			rec, claimed, err := f.store.Begin(ctx, "clock-"+newRunID(), "fp", time.Now().Add(-time.Hour), time.Minute, time.Hour)
			if err != nil || !claimed {
				t.Fatalf("Begin on the campaign's store = %+v, %v, %v; want a claim", rec, claimed, err)
			}
			if onServer := rec.LeaseUntil.After(time.Now()); onServer != tc.serverClock {
				t.Errorf("campaign's store: lease of a claim made at now-1h ends at %v (server clock: %v), want server clock %v",
					rec.LeaseUntil, onServer, tc.serverClock)
			}
		})
	}
}

// TestClusterCallerClock covers the cluster forms no test cluster serves
// here (TLS, IPv6 seeds, a password): the contract's URL says clock=caller,
// keeps every other parameter, and the clock the URL gave is reported.
func TestClusterCallerClock(t *testing.T) {
	for _, tc := range []struct {
		url, want, clock, redacted string
	}{
		{"redis+cluster://h1:7000,h2:7000", "redis+cluster://h1:7000,h2:7000?clock=caller", "",
			"redis+cluster://h1:7000,h2:7000"},
		{"rediss+cluster://app:s%3Fcret@[::1]:7000,[::1]:7001/?prefix=p:&clock=server",
			"rediss+cluster://app:s%3Fcret@[::1]:7000,[::1]:7001/?clock=caller&prefix=p%3A", "server",
			"rediss+cluster://app:xxxxx@[::1]:7000,[::1]:7001/?prefix=p:&clock=server"},
		{"REDISS+CLUSTER://app@h1:7000?clock=caller&read_timeout=1s",
			"REDISS+CLUSTER://app@h1:7000?clock=caller&read_timeout=1s", "caller",
			"REDISS+CLUSTER://app@h1:7000?clock=caller&read_timeout=1s"},
	} {
		got, clock, err := clusterCallerClock(tc.url)
		if err != nil || got != tc.want || clock != tc.clock {
			t.Errorf("clusterCallerClock(%q) = %q, %q, %v; want %q, %q, nil", tc.url, got, clock, err, tc.want, tc.clock)
		}
		if got := storeurl.Redact(tc.url); got != tc.redacted {
			t.Errorf("storeurl.Redact(%q) = %q, want %q", tc.url, got, tc.redacted)
		}
	}
	if _, _, err := clusterCallerClock("redis+cluster://h1:7000?clock=%zz"); err == nil {
		t.Error("clusterCallerClock accepted a query that does not parse")
	}
}
