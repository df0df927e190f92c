package idempotency_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/archlab/idempotency"
)

// partitioned is one holder's view of a shared store while a partition cuts
// it off: Extend never answers until its ctx ends.
type partitioned struct{ idempotency.Store }

func (p partitioned) Extend(ctx context.Context, _ string, _ uint64, _ time.Time, _ time.Duration) error {
	<-ctx.Done()
	return ctx.Err()
}

// While renewals cannot reach the store, fn's ctx must end before its lease
// does, since from then on another holder may take the key over. It used to
// stay live for up to one more RenewEvery (an Extend attempt that started
// before the deadline ran its full timeout first).
func TestLeaseRunsOutDuringPartition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := idempotency.NewMemoryStore()
		const lease = 3 * time.Second
		cut := &idempotency.Guard{Store: partitioned{mem}, Lease: lease}
		other := &idempotency.Guard{Store: mem, Lease: lease}
		start := time.Now()
		var ended time.Duration
		done := make(chan struct{})
		go func() {
			defer close(done)
			cut.Do(context.Background(), "k", "fp", func(ctx context.Context) (idempotency.Response, error) {
				<-ctx.Done()
				ended = time.Since(start)
				return idempotency.Response{}, ctx.Err()
			})
		}()
		synctest.Wait()
		time.Sleep(lease) // the other holder may take over from here
		var overlap bool
		_, out, err := other.Do(context.Background(), "k", "fp", func(context.Context) (idempotency.Response, error) {
			select {
			case <-done:
			default:
				overlap = true
			}
			return idempotency.Response{Status: 200}, nil
		})
		<-done
		if out != idempotency.Executed || err != nil {
			t.Fatalf("takeover after the lease: %s %v", out, err)
		}
		if ended >= lease || overlap {
			t.Fatalf("the cut-off holder's ctx ended %v after its claim (lease %v); the takeover overlapped it: %v", ended, lease, overlap)
		}
	})
}
