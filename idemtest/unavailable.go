package idemtest

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/archlab/idempotency"
)

// unavailableOp is one call on a store whose backend is gone.
type unavailableOp struct {
	name string
	call func(ctx context.Context, s idempotency.Store, key string, now time.Time) error
}

var unavailableOps = []unavailableOp{
	{"begin", func(ctx context.Context, s idempotency.Store, key string, now time.Time) error {
		_, _, err := s.Begin(ctx, key, "fp", now, lease, retention)
		return err
	}},
	{"complete", func(ctx context.Context, s idempotency.Store, key string, now time.Time) error {
		return s.Complete(ctx, key, 1, sampleResponse("x"), now, retention)
	}},
	{"extend", func(ctx context.Context, s idempotency.Store, key string, now time.Time) error {
		return s.Extend(ctx, key, 1, now, lease)
	}},
	{"release", func(ctx context.Context, s idempotency.Store, key string, _ time.Time) error {
		return s.Release(ctx, key, 1)
	}},
	{"get", func(ctx context.Context, s idempotency.Store, key string, now time.Time) error {
		_, err := s.Get(ctx, key, now)
		return err
	}},
	{"delete", func(ctx context.Context, s idempotency.Store, key string, _ time.Time) error {
		return s.Delete(ctx, key)
	}},
	{"guard-do", func(ctx context.Context, s idempotency.Store, key string, _ time.Time) error {
		var ran atomic.Bool
		g := &idempotency.Guard{Store: s, Lease: lease, Retention: retention}
		_, out, err := g.Do(ctx, key, "fp", func(context.Context) (idempotency.Response, error) {
			ran.Store(true)
			return idempotency.Response{}, nil
		})
		if ran.Load() {
			return fmt.Errorf("fn ran although the store is unreachable (outcome %s, err %v); the Guard must fail closed", out, err)
		}
		if out != idempotency.Unavailable {
			return fmt.Errorf("outcome %s, want %s (err %v)", out, idempotency.Unavailable, err)
		}
		return err
	}},
}

// unavailableClauses check that every method of a store whose backend is
// gone fails with ErrUnavailable, and does so within hangLimit.
var unavailableClauses = func() []clause {
	out := make([]clause, len(unavailableOps))
	for i, op := range unavailableOps {
		out[i] = clause{op.name, func(e *env) { e.wantUnavailable(op) }}
	}
	return out
}()

func (e *env) wantUnavailable(op unavailableOp) {
	e.t.Helper()
	key := e.key("broken")
	start := time.Now()
	res := make(chan error, 1)
	go func() {
		defer panicked(func(err error) { res <- err })
		res <- op.call(e.ctx, e.s, key, e.t0)
	}()
	select {
	case err := <-res:
		e.t.Logf("%s failed after %v: %v", e.clause, time.Since(start), err)
		if !errors.Is(err, idempotency.ErrUnavailable) {
			e.fatalf("error = %v, want an error wrapping ErrUnavailable", err)
		}
	case <-time.After(hangLimit):
		e.fatalf("no answer within %v from a store whose backend is unreachable; it must fail, not hang", hangLimit)
	}
}
