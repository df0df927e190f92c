package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

// releaseFailingStore is a MemoryStore whose Release fails with err and
// changes nothing.
type releaseFailingStore struct {
	*idempotency.MemoryStore
	err error
}

func (s releaseFailingStore) Release(context.Context, string, uint64) error { return s.err }

// TestRetryableReleaseFails: when fn's error is Retryable but the Guard
// cannot release the key, Do's error must not say the key was released
// (IsRetryable false, as after a lost lease), must keep fn's error, and
// must classify the store's failure: ErrLeaseLost when the claim is no
// longer this caller's, otherwise ErrUnavailable, even when the store's
// error does not carry it (Begin and Complete failures are wrapped the
// same way). Adapters decide on these: idemhttp told a caller whose key
// was still claimed that it had been released, and dedup did not wait for
// the lease before redelivery.
func TestRetryableReleaseFails(t *testing.T) {
	refused := errors.New("refused before sending")
	for _, tc := range []struct {
		name     string
		storeErr error
		want     error
	}{
		{"store error without the sentinel", errors.New("connection reset"), idempotency.ErrUnavailable},
		{"store unavailable", fmt.Errorf("engine: %w", idempotency.ErrUnavailable), idempotency.ErrUnavailable},
		{"lease lost", fmt.Errorf("engine: %w", idempotency.ErrLeaseLost), idempotency.ErrLeaseLost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := idempotency.NewMemoryStore()
			g := &idempotency.Guard{Store: releaseFailingStore{mem, tc.storeErr}}
			_, out, err := g.Do(context.Background(), "k", "fp", func(context.Context) (idempotency.Response, error) {
				return idempotency.Response{}, idempotency.Retryable(refused)
			})
			if out != idempotency.Executed || !errors.Is(err, refused) || !errors.Is(err, tc.storeErr) {
				t.Fatalf("Do = %s, %v; want EXECUTED with fn's and the store's errors", out, err)
			}
			if !errors.Is(err, tc.want) {
				t.Errorf("Do = %v; want it to wrap %v", err, tc.want)
			}
			if idempotency.IsRetryable(err) {
				t.Errorf("Do = %v: IsRetryable, but the key was not released", err)
			}
			if _, gerr := mem.Get(context.Background(), "k", time.Now()); gerr != nil {
				t.Fatalf("Get = %v; the claim should still be held", gerr)
			}
		})
	}
}
