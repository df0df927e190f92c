package idemtest

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

// runUnavailable checks that every method of a store whose backend is gone
// fails with ErrUnavailable, and does so within hangLimit.
func runUnavailable(t *testing.T, broken func(t *testing.T) idempotency.Store) {
	now := time.Now().Truncate(time.Millisecond)
	key := fmt.Sprintf("idemtest:%s:%d:broken", runID, keySeq.Add(1))
	ops := []struct {
		name string
		call func(ctx context.Context, s idempotency.Store) error
	}{
		{"begin", func(ctx context.Context, s idempotency.Store) error {
			_, _, err := s.Begin(ctx, key, "fp", now, lease, retention)
			return err
		}},
		{"complete", func(ctx context.Context, s idempotency.Store) error {
			return s.Complete(ctx, key, 1, sampleResponse("x"), now, retention)
		}},
		{"extend", func(ctx context.Context, s idempotency.Store) error {
			return s.Extend(ctx, key, 1, now, lease)
		}},
		{"release", func(ctx context.Context, s idempotency.Store) error {
			return s.Release(ctx, key, 1)
		}},
		{"get", func(ctx context.Context, s idempotency.Store) error {
			_, err := s.Get(ctx, key, now)
			return err
		}},
		{"delete", func(ctx context.Context, s idempotency.Store) error {
			return s.Delete(ctx, key)
		}},
		{"guard-do", func(ctx context.Context, s idempotency.Store) error {
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
	for _, op := range ops {
		t.Run(op.name, func(t *testing.T) {
			t.Parallel()
			clause := "Unavailable/" + op.name
			s := broken(t)
			if s == nil {
				t.Fatalf("%s: Harness.Broken returned a nil store", clause)
			}
			start := time.Now()
			res := make(chan error, 1)
			go func() { res <- op.call(context.Background(), s) }()
			select {
			case err := <-res:
				took := time.Since(start)
				t.Logf("%s failed after %v: %v", clause, took, err)
				if !errors.Is(err, idempotency.ErrUnavailable) {
					t.Fatalf("%s: error = %v, want an error wrapping ErrUnavailable", clause, err)
				}
			case <-time.After(hangLimit):
				t.Fatalf("%s: no answer within %v from a store whose backend is unreachable; it must fail, not hang", clause, hangLimit)
			}
		})
	}
}
