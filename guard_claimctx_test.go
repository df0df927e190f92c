package idempotency_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/archlab/idempotency"
)

// Once fn's ctx reports an error it keeps reporting the same one: a lease
// lost after the caller's deadline passed used to turn DeadlineExceeded into
// Canceled (the context contract: Err never changes once non-nil).
func TestClaimContextErrStable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		parent, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		store := idempotency.NewMemoryStore()
		g := &idempotency.Guard{Store: store, Lease: 3 * time.Second}
		g.Do(parent, "k", "fp", func(ctx context.Context) (idempotency.Response, error) {
			<-ctx.Done()
			first := ctx.Err()
			if !errors.Is(first, context.DeadlineExceeded) {
				t.Fatalf("Err after the caller's deadline = %v", first)
			}
			if err := store.Delete(context.Background(), "k"); err != nil {
				t.Fatal(err)
			}
			time.Sleep(3 * time.Second) // renewals run on and find the lease lost
			if err := ctx.Err(); err != first {
				t.Errorf("Err changed from %v to %v when the lease was lost", first, err)
			}
			if c := context.Cause(ctx); !errors.Is(c, context.DeadlineExceeded) {
				t.Errorf("Cause = %v, want the caller's DeadlineExceeded", c)
			}
			return idempotency.Response{}, ctx.Err()
		})
	})
	synctest.Test(t, func(t *testing.T) {
		store := idempotency.NewMemoryStore()
		g := &idempotency.Guard{Store: store, Lease: 3 * time.Second}
		g.Do(context.Background(), "k", "fp", func(ctx context.Context) (idempotency.Response, error) {
			if err := store.Delete(context.Background(), "k"); err != nil {
				t.Fatal(err)
			}
			<-ctx.Done()
			if err := ctx.Err(); err != context.Canceled {
				t.Errorf("Err after a lost lease = %v, want context.Canceled", err)
			}
			return idempotency.Response{}, nil
		})
	})
}
