package idempotency_test

import (
	"context"
	"errors"
	"testing"

	"github.com/archlab/idempotency"
)

// Misuse is reported as an error wrapping ErrInvalidConfig, never a panic on
// every request.

// wrappedStore is a Store of a pointer type other than *MemoryStore, so that
// a Guard on it takes the path through Store.Begin.
type wrappedStore struct{ idempotency.Store }

func typedNilStores() map[string]idempotency.Store {
	var mem *idempotency.MemoryStore // as left by ignoring a constructor's error
	var other *wrappedStore
	var cache *idempotency.ReplayCache
	return map[string]idempotency.Store{"memory": mem, "other": other, "cache": cache}
}

func TestNewGuardRefusesTypedNilStore(t *testing.T) {
	for name, s := range typedNilStores() {
		t.Run(name, func(t *testing.T) {
			if g, err := idempotency.NewGuard(s, nil); !errors.Is(err, idempotency.ErrInvalidConfig) || g != nil {
				t.Errorf("NewGuard(typed nil) = %v, %v; want nil and ErrInvalidConfig", g, err)
			}
			if err := (&idempotency.Guard{Store: s}).Validate(); !errors.Is(err, idempotency.ErrInvalidConfig) {
				t.Errorf("Validate = %v, want ErrInvalidConfig", err)
			}
		})
	}
}

// TestGuardLiteralTypedNilStore: the seed's shape, a Guard literal used
// without NewGuard, fails closed on a typed-nil Store instead of panicking.
func TestGuardLiteralTypedNilStore(t *testing.T) {
	for name, s := range typedNilStores() {
		t.Run(name, func(t *testing.T) {
			g := &idempotency.Guard{Store: s}
			ran := false
			fn := func(context.Context) (idempotency.Response, error) {
				ran = true
				return idempotency.Response{Status: 200}, nil
			}
			_, out, err := g.Do(context.Background(), "k", "fp", fn)
			if ran || out != idempotency.Unavailable || !errors.Is(err, idempotency.ErrUnavailable) || !errors.Is(err, idempotency.ErrInvalidConfig) {
				t.Errorf("Do: ran %v, %s, %v; want fn not run, %s, ErrUnavailable and ErrInvalidConfig", ran, out, err, idempotency.Unavailable)
			}
			res, err := g.Run(context.Background(), "k", "fp", fn)
			if ran || res.Outcome != idempotency.Unavailable || !errors.Is(err, idempotency.ErrInvalidConfig) {
				t.Errorf("Run: ran %v, %s, %v; want fn not run, %s and ErrInvalidConfig", ran, res.Outcome, err, idempotency.Unavailable)
			}
		})
	}
}

// TestGuardLiteralStorePanicsStillPanic: a store whose Begin panics for a
// reason of its own is not mistaken for a typed-nil one.
func TestGuardLiteralStorePanicsStillPanic(t *testing.T) {
	g := &idempotency.Guard{Store: &wrappedStore{}} // non-nil, but its embedded Store is nil
	defer func() {
		if recover() == nil {
			t.Error("Do on a store whose Begin panics returned; want the panic to go on")
		}
	}()
	_, _, _ = g.Do(context.Background(), "k", "fp", func(context.Context) (idempotency.Response, error) {
		return idempotency.Response{}, nil
	})
}

// TestGuardNilFn: Do and Run with a nil fn return ErrInvalidConfig without
// claiming the key (which used to stay claimed until its lease ended, after
// the panic).
func TestGuardNilFn(t *testing.T) {
	counting := newCallCountingStore()
	for _, tc := range []struct {
		name string
		s    idempotency.Store
	}{{"memory", idempotency.NewMemoryStore()}, {"other", counting}} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.s
			g, err := idempotency.NewGuard(s, nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			_, out, err := g.Do(ctx, "k", "fp", nil)
			if out != idempotency.Unavailable || !errors.Is(err, idempotency.ErrInvalidConfig) {
				t.Errorf("Do(nil fn) = %s, %v; want %s and ErrInvalidConfig", out, err, idempotency.Unavailable)
			}
			res, err := g.Run(ctx, "k", "fp", nil)
			if res.Outcome != idempotency.Unavailable || !errors.Is(err, idempotency.ErrInvalidConfig) {
				t.Errorf("Run(nil fn) = %s, %v; want %s and ErrInvalidConfig", res.Outcome, err, idempotency.Unavailable)
			}
			if n := counting.begins.Load(); n != 0 {
				t.Errorf("the store saw %d Begin calls for a nil fn, want none", n)
			}
			// The key was not claimed: a call with a fn runs at once.
			_, out, err = g.Do(ctx, "k", "fp", func(context.Context) (idempotency.Response, error) {
				return idempotency.Response{Status: 201}, nil
			})
			if out != idempotency.Executed || err != nil {
				t.Errorf("Do after a nil fn = %s, %v; want %s", out, err, idempotency.Executed)
			}
		})
	}
}
