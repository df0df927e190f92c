package idempotency_test

import (
	"context"
	"errors"
	"fmt"
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

// isDone reports, without waiting, whether ctx.Done is closed.
func isDone(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return true
	default:
		return false
	}
}

// fn's ctx never reports an error while its Done channel is open (the
// context contract: "If Done is not yet closed, Err returns nil"). The
// caller's cancellation used to reach Err at once but Done only later,
// from a goroutine: a select on Done right after a non-nil Err missed it.
func TestClaimContextErrMeansDone(t *testing.T) {
	g := &idempotency.Guard{Store: idempotency.NewMemoryStore()}
	t.Run("caller cancels while fn runs", func(t *testing.T) {
		for i := range 20 {
			parent, cancel := context.WithCancel(context.Background())
			_, _, err := g.Do(parent, fmt.Sprintf("run%d", i), "fp", func(ctx context.Context) (idempotency.Response, error) {
				ctx.Done() // linked to the caller before it cancels
				cancel()
				if err := ctx.Err(); !errors.Is(err, context.Canceled) {
					t.Errorf("Err after the caller cancelled = %v", err)
				}
				if !isDone(ctx) {
					t.Fatalf("call %d: Err = %v but Done is open", i, ctx.Err())
				}
				return idempotency.Response{Status: 200}, nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Run("caller cancelled before Done is asked", func(t *testing.T) {
		for i := range 20 {
			parent, cancel := context.WithCancel(context.Background())
			_, _, err := g.Do(parent, fmt.Sprintf("first%d", i), "fp", func(ctx context.Context) (idempotency.Response, error) {
				cancel()
				if !isDone(ctx) {
					t.Fatalf("call %d: the caller's context is done, fn's Done is open (Err = %v)", i, ctx.Err())
				}
				return idempotency.Response{Status: 200}, nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	})
}

// fn's ctx is cancelled when Do returns, as an http.Request's context is
// when ServeHTTP returns, along with every context derived from it. It
// used to be cut off from the caller instead: a goroutine left waiting on
// it was never woken, while Err reported the caller's later cancellation
// with Done open.
func TestClaimContextEndsWithDo(t *testing.T) {
	for _, tc := range []struct {
		name   string
		parent func() (context.Context, context.CancelFunc)
	}{
		{"cancellable caller", func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }},
		{"detached caller", func() (context.Context, context.CancelFunc) { return context.Background(), func() {} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				parent, cancel := tc.parent()
				g := &idempotency.Guard{Store: idempotency.NewMemoryStore()}
				var fnCtx, child context.Context
				var stopChild context.CancelFunc
				woken, quit := make(chan struct{}), make(chan struct{})
				defer close(quit)
				_, _, err := g.Do(parent, "k", "fp", func(ctx context.Context) (idempotency.Response, error) {
					fnCtx = ctx
					child, stopChild = context.WithCancel(ctx) // left for the claim's end to cancel
					// Work fn leaves behind, waiting on its ctx.
					go func() {
						select {
						case <-ctx.Done():
							close(woken)
						case <-quit:
						}
					}()
					return idempotency.Response{Status: 200}, nil
				})
				if err != nil {
					t.Fatal(err)
				}
				if !isDone(fnCtx) || !errors.Is(fnCtx.Err(), context.Canceled) {
					t.Errorf("after Do: Done closed %v, Err %v; want closed, context.Canceled", isDone(fnCtx), fnCtx.Err())
				}
				cancel()
				if err := fnCtx.Err(); err != context.Canceled {
					t.Errorf("Err = %v once the caller cancelled after Do, want context.Canceled still", err)
				}
				ran := false
				context.AfterFunc(fnCtx, func() { ran = true })
				synctest.Wait()
				select {
				case <-woken:
				default:
					t.Error("a goroutine waiting on fn's ctx was not woken when Do returned")
				}
				if !isDone(child) {
					t.Error("a context derived from fn's ctx is not done after Do returned")
				}
				if !ran {
					t.Error("context.AfterFunc on fn's ctx after Do returned did not run")
				}
				stopChild()
			})
		})
	}
}
