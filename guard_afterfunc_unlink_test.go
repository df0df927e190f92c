package idempotency_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/archlab/idempotency"
)

// linkCountingCtx is a caller's context that is never done while the test
// runs (a consumer's context, alive for the whole process) and that counts
// the functions linked to its cancellation through AfterFunc and not yet
// unlinked: what it holds on the claims' behalf.
type linkCountingCtx struct {
	context.Context
	done chan struct{}

	mu     sync.Mutex
	linked int
}

func newLinkCountingCtx() *linkCountingCtx {
	return &linkCountingCtx{Context: context.Background(), done: make(chan struct{})}
}

func (p *linkCountingCtx) Done() <-chan struct{} { return p.done }

func (p *linkCountingCtx) Err() error { return nil }

func (p *linkCountingCtx) AfterFunc(func()) (stop func() bool) {
	p.mu.Lock()
	p.linked++
	p.mu.Unlock()
	var once sync.Once
	return func() bool {
		stopped := false
		once.Do(func() {
			p.mu.Lock()
			p.linked--
			p.mu.Unlock()
			stopped = true
		})
		return stopped
	}
}

func (p *linkCountingCtx) links() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.linked
}

// TestDerivedContextEndedByTheClaimUnlinks: a context derived from fn's ctx
// that the claim ends (Guard.Timeout, a lost lease, fn returning while it
// is still in use) leaves nothing linked to the caller's context once Do
// has returned. The derived context's own cancel is then a no-op (it is
// already cancelled: context.WithCancel's, unlike WithTimeout's, then does
// not unlink), so a link made per derived context was kept by a long-lived
// caller's context, with the claim it reaches, until that context ended:
// one per call of a consumer that runs with a Timeout.
func TestDerivedContextEndedByTheClaimUnlinks(t *testing.T) {
	for _, tc := range []struct {
		name  string
		guard func(store idempotency.Store) *idempotency.Guard
		fn    func(store idempotency.Store) func(context.Context) (idempotency.Response, error)
	}{
		{"Timeout", func(store idempotency.Store) *idempotency.Guard {
			return &idempotency.Guard{Store: store, Timeout: time.Second}
		}, func(idempotency.Store) func(context.Context) (idempotency.Response, error) {
			return func(ctx context.Context) (idempotency.Response, error) {
				d, cancel := context.WithCancel(ctx)
				defer cancel()
				<-d.Done()
				return idempotency.Response{}, d.Err()
			}
		}},
		{"lost lease", func(store idempotency.Store) *idempotency.Guard {
			return &idempotency.Guard{Store: store, Lease: 3 * time.Second}
		}, func(store idempotency.Store) func(context.Context) (idempotency.Response, error) {
			return func(ctx context.Context) (idempotency.Response, error) {
				d, cancel := context.WithCancel(ctx)
				defer cancel()
				if err := store.Delete(context.Background(), "k"); err != nil {
					return idempotency.Response{}, err
				}
				<-d.Done()
				return idempotency.Response{}, d.Err()
			}
		}},
		{"fn returns first", func(store idempotency.Store) *idempotency.Guard {
			return &idempotency.Guard{Store: store}
		}, func(idempotency.Store) func(context.Context) (idempotency.Response, error) {
			return func(ctx context.Context) (idempotency.Response, error) {
				d, cancel := context.WithCancel(ctx)
				go func() { // work handed off, cancelled when it ends
					<-d.Done()
					cancel()
				}()
				return idempotency.Response{Status: 202}, nil
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				parent := newLinkCountingCtx()
				store := idempotency.NewMemoryStore()
				g := tc.guard(store)
				const calls = 5
				for i := range calls {
					_, out, err := g.Do(parent, "k", "fp", tc.fn(store))
					if out != idempotency.Executed {
						t.Fatalf("call %d: %s %v", i, out, err)
					}
					if err := store.Delete(context.Background(), "k"); err != nil {
						t.Fatal(err)
					}
				}
				synctest.Wait()
				if n := parent.links(); n != 0 {
					t.Errorf("after %d calls the caller's context holds %d links to ended claims, want 0", calls, n)
				}
			})
		})
	}
}
