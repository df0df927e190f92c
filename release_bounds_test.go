package idempotency

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestMemoryQueueBoundedUnderReleases: a key claimed and given back many
// times inside its retention (fn failing with Retryable, as validation
// errors do) leaves the expiry queue about one entry per live record, so
// memory stays bounded by MaxRecords. Every release used to leave its
// claim's entry queued for the full retention (a day by default).
func TestMemoryQueueBoundedUnderReleases(t *testing.T) {
	s, err := NewMemoryStoreWith(&MemoryOptions{MaxRecords: 10})
	if err != nil {
		t.Fatal(err)
	}
	g := &Guard{Store: s}
	refused := Retryable(errors.New("validation failed"))
	const calls = 50000
	for i := range calls {
		key := fmt.Sprintf("k%d", i%8)
		_, out, err := g.Do(context.Background(), key, "fp", func(context.Context) (Response, error) {
			return Response{}, refused
		})
		if out != Executed || !errors.Is(err, refused) {
			t.Fatalf("call %d: %s %v", i, out, err)
		}
	}
	if s.Len() != 0 {
		t.Errorf("Len = %d after every claim was released, want 0", s.Len())
	}
	// Each shard may hold a bounded backlog of stale entries.
	if got, limit := queueLen(s), memShards*(compactMin+1); got > limit {
		t.Errorf("expiry queue holds %d entries for %d records after %d released claims, want at most %d", got, s.Len(), calls, limit)
	}
}

// slowBeginStore answers Begin after a delay and cannot be reached to renew.
type slowBeginStore struct {
	*MemoryStore
	delay time.Duration
}

func (s slowBeginStore) Begin(ctx context.Context, key, fp string, now time.Time, lease, retention time.Duration) (Record, bool, error) {
	time.Sleep(s.delay)
	return s.MemoryStore.Begin(ctx, key, fp, now, lease, retention)
}

func (s slowBeginStore) Extend(context.Context, string, uint64, time.Time, time.Duration) error {
	return fmt.Errorf("extend: %w", ErrUnavailable)
}

// TestSlowBeginWithNowSetStopsFnBeforeLease: with Guard.Now set (here to
// the real clock, as a UTC wrapper would be), the lease the store grants
// runs from the Now read before Begin. When no renewal gets through, fn's
// ctx must end before that lease does, however long Begin took to answer;
// it used to be timed from Begin's return, so a second holder could take
// the key over while fn still ran.
func TestSlowBeginWithNowSetStopsFnBeforeLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemoryStore()
		const lease = 10 * time.Second
		g := &Guard{Store: slowBeginStore{mem, 5 * time.Second}, Lease: lease, Now: time.Now}
		other := &Guard{Store: mem, Lease: lease, Now: time.Now}
		var running atomic.Int32
		var overlap atomic.Bool
		fn := func(ctx context.Context) (Response, error) {
			if running.Add(1) > 1 {
				overlap.Store(true)
			}
			defer running.Add(-1)
			select {
			case <-ctx.Done():
				return Response{}, ctx.Err()
			case <-time.After(time.Minute):
				return Response{Status: 200}, nil
			}
		}
		start := time.Now()
		done := make(chan struct{})
		go func() {
			defer close(done)
			g.Do(context.Background(), "k", "fp", fn)
		}()
		time.Sleep(lease + time.Second) // past the lease granted at start
		_, out, err := other.Do(context.Background(), "k", "fp", func(ctx context.Context) (Response, error) {
			fn(ctx)
			return Response{Status: 201}, nil
		})
		<-done
		if out != Executed || err != nil {
			t.Fatalf("takeover %v after the claim: %s %v", time.Since(start), out, err)
		}
		if overlap.Load() {
			t.Errorf("fn ran twice at once for one key: the first holder's ctx outlived its lease of %v", lease)
		}
	})
}

// TestRenewEveryAcceptedMeansRenewed: a RenewEvery that Validate accepts
// must renew the lease before the Guard gives up on it. With RenewEvery at
// or past nine tenths of the lease, the first renewal was due only after
// the Guard's own deadline, so fn's ctx was cancelled on a healthy store
// without a single renewal attempt.
func TestRenewEveryAcceptedMeansRenewed(t *testing.T) {
	for _, every := range []time.Duration{9 * time.Second, 9500 * time.Millisecond} {
		t.Run(every.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := &Guard{Store: NewMemoryStore(), Lease: 10 * time.Second, RenewEvery: every}
				if err := g.Validate(); err != nil {
					if !errors.Is(err, ErrInvalidConfig) {
						t.Fatalf("Validate = %v, want nil or ErrInvalidConfig", err)
					}
					return
				}
				resp, out, err := g.Do(context.Background(), "k", "fp", func(ctx context.Context) (Response, error) {
					select {
					case <-ctx.Done():
						return Response{}, ctx.Err()
					case <-time.After(30 * time.Second):
						return Response{Status: 200}, nil
					}
				})
				if out != Executed || err != nil || resp.Status != 200 {
					t.Errorf("Do with a 30s fn, Lease 10s, RenewEvery %v accepted by Validate: %d %s %v; want 200 Executed", every, resp.Status, out, err)
				}
			})
		})
	}
}
