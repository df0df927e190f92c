package idempotency_test

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"testing/synctest"
	"time"

	"github.com/archlab/idempotency"
)

// Contexts derived from fn's ctx follow it (parent cancellation and a lost
// lease alike) without a goroutine each: the claim context offers the
// AfterFunc method the context package looks for.
func TestDerivedContextsFollowTheClaim(t *testing.T) {
	t.Run("no goroutine per derived context", func(t *testing.T) {
		parent, cancel := context.WithCancel(context.Background())
		defer cancel()
		g := &idempotency.Guard{Store: idempotency.NewMemoryStore()}
		_, _, err := g.Do(parent, "k", "fp", func(ctx context.Context) (idempotency.Response, error) {
			before := runtime.NumGoroutine()
			cancels := make([]context.CancelFunc, 100)
			for i := range cancels {
				_, cancels[i] = context.WithCancel(ctx)
			}
			if d := runtime.NumGoroutine() - before; d > 5 {
				t.Errorf("100 contexts derived from fn's ctx started %d goroutines", d)
			}
			for _, c := range cancels {
				c()
			}
			return idempotency.Response{Status: 200}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Run("parent cancellation reaches derived contexts", func(t *testing.T) {
		parent, cancel := context.WithCancel(context.Background())
		g := &idempotency.Guard{Store: idempotency.NewMemoryStore()}
		g.Do(parent, "k", "fp", func(ctx context.Context) (idempotency.Response, error) {
			child, stop := context.WithTimeout(ctx, time.Minute)
			defer stop()
			cancel()
			select {
			case <-child.Done():
			case <-time.After(5 * time.Second):
				t.Error("a context derived from fn's ctx missed the parent's cancellation")
			}
			return idempotency.Response{}, nil
		})
	})
	t.Run("a lost lease reaches derived contexts", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			store := idempotency.NewMemoryStore()
			g := &idempotency.Guard{Store: store, Lease: 3 * time.Second}
			_, _, err := g.Do(context.Background(), "k", "fp", func(ctx context.Context) (idempotency.Response, error) {
				child, stop := context.WithCancel(ctx)
				defer stop()
				var fired bool
				unregister := context.AfterFunc(ctx, func() { fired = true })
				defer unregister()
				if err := store.Delete(context.Background(), "k"); err != nil { // an operator evicts the key
					t.Fatal(err)
				}
				select {
				case <-child.Done():
				case <-time.After(10 * time.Second):
					t.Error("a context derived from fn's ctx missed the lost lease")
				}
				synctest.Wait()
				if !fired {
					t.Error("context.AfterFunc on fn's ctx did not run when the lease was lost")
				}
				return idempotency.Response{}, nil
			})
			if !errors.Is(err, idempotency.ErrLeaseLost) {
				t.Errorf("Do = %v; want ErrLeaseLost", err)
			}
		})
	})
}

// A context derived from fn's ctx costs no more allocations under a
// caller's context that can be cancelled than under one that never is
// (context.Background): the claim links to the caller's cancellation once,
// for every context derived from it, not once per derived context (one per
// upstream request in idemproxy).
func TestDerivedContextLinksOncePerClaim(t *testing.T) {
	derive := func(parent context.Context) float64 {
		g := &idempotency.Guard{Store: idempotency.NewMemoryStore()}
		var allocs float64
		_, _, err := g.Do(parent, "k", "fp", func(ctx context.Context) (idempotency.Response, error) {
			allocs = testing.AllocsPerRun(100, func() {
				_, cancel := context.WithCancel(ctx)
				cancel()
			})
			return idempotency.Response{Status: 200}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return allocs
	}
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	attached, never := derive(parent), derive(context.Background())
	if attached > never {
		t.Errorf("deriving a context costs %v allocations under a cancellable caller, %v under context.Background; want no more", attached, never)
	}
}
