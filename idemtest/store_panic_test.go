package idemtest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemtest"
)

// panicking is a MemoryStore whose method op panics; it has a Sweep, which
// panics for op "sweep" and collects nothing otherwise.
type panicking struct {
	idempotency.Store
	op string
}

func (p panicking) check(op string) {
	if p.op == op {
		panic("store bug in " + op)
	}
}

func (p panicking) Begin(ctx context.Context, key, fp string, now time.Time, lease, retention time.Duration) (idempotency.Record, bool, error) {
	p.check("begin")
	return p.Store.Begin(ctx, key, fp, now, lease, retention)
}

func (p panicking) Complete(ctx context.Context, key string, token uint64, resp idempotency.Response, now time.Time, retention time.Duration) error {
	p.check("complete")
	return p.Store.Complete(ctx, key, token, resp, now, retention)
}

func (p panicking) Extend(ctx context.Context, key string, token uint64, now time.Time, lease time.Duration) error {
	p.check("extend")
	return p.Store.Extend(ctx, key, token, now, lease)
}

func (p panicking) Release(ctx context.Context, key string, token uint64) error {
	p.check("release")
	return p.Store.Release(ctx, key, token)
}

func (p panicking) Get(ctx context.Context, key string, now time.Time) (idempotency.Record, error) {
	p.check("get")
	return p.Store.Get(ctx, key, now)
}

func (p panicking) Delete(ctx context.Context, key string) error {
	p.check("delete")
	return p.Store.Delete(ctx, key)
}

func (p panicking) Sweep(context.Context, time.Time, int) (int, error) {
	p.check("sweep")
	return 0, nil
}

// TestCheckReportsStorePanics: Clause.Check reports a panic of the store as
// a failure of the clause, also where the clause calls the store from
// goroutines of its own (racers, a holder against a takeover, churn, a call
// on a broken store bounded in time). A panic there used to end the
// process, and with it an idemcheck -store run, without a report.
func TestCheckReportsStorePanics(t *testing.T) {
	clauses := append(idemtest.Clauses(), idemtest.UnavailableClauses()...)
	// Clauses whose store calls of op are made in a goroutine the clause
	// started, not in its own.
	reached := map[string][]string{
		"begin":    {"Concurrency/one-claim-of-64", "Unavailable/begin"},
		"complete": {"Concurrency/holder-races-takeover", "Concurrency/distinct-keys-64", "Unavailable/complete"},
		"extend":   {"Unavailable/extend"},
		"release":  {"Concurrency/holder-release-races-takeover", "Concurrency/tokens-in-claim-order", "Unavailable/release"},
		"get":      {"Unavailable/get"},
		"delete":   {"Concurrency/holder-races-delete", "Unavailable/delete"},
		"sweep":    {"Concurrency/tokens-in-claim-order"},
	}
	for op, names := range reached {
		t.Run(op, func(t *testing.T) {
			for _, c := range clauses {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				err := c.Check(ctx, panicking{idempotency.NewMemoryStore(), op})
				cancel()
				for _, name := range names {
					if c.Name == name && (err == nil || !strings.Contains(err.Error(), "store bug in "+op)) {
						t.Errorf("%s on a store whose %s panics = %v; want a failure naming the panic", c.Name, op, err)
					}
				}
			}
		})
	}
}
