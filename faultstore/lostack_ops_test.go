package faultstore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/faultstore"
)

// TestLostAckEveryOperation: under LostAck every operation reaches the
// store, and its error says Applied exactly when the store did not refuse
// it; the store's state shows what was applied.
func TestLostAckEveryOperation(t *testing.T) {
	ctx := context.Background()
	type state struct {
		found bool
		state idempotency.State
	}
	for _, tc := range []struct {
		name        string
		call        func(s idempotency.Store, token uint64) error
		wantApplied bool
		want        state // the record of "k" afterwards
	}{
		{"begin of a claimed key", func(s idempotency.Store, _ uint64) error {
			_, _, err := s.Begin(ctx, "k", "fp", t0, lease, retention)
			return err
		}, true, state{true, idempotency.Processing}},
		{"complete", func(s idempotency.Store, token uint64) error {
			return s.Complete(ctx, "k", token, idempotency.Response{Status: 200}, t0, retention)
		}, true, state{true, idempotency.Done}},
		{"complete, stale token", func(s idempotency.Store, token uint64) error {
			return s.Complete(ctx, "k", token+1, idempotency.Response{Status: 200}, t0, retention)
		}, false, state{true, idempotency.Processing}},
		{"extend", func(s idempotency.Store, token uint64) error {
			return s.Extend(ctx, "k", token, t0, lease)
		}, true, state{true, idempotency.Processing}},
		{"extend, stale token", func(s idempotency.Store, token uint64) error {
			return s.Extend(ctx, "k", token+1, t0, lease)
		}, false, state{true, idempotency.Processing}},
		{"release", func(s idempotency.Store, token uint64) error {
			return s.Release(ctx, "k", token)
		}, true, state{}},
		{"release, stale token", func(s idempotency.Store, token uint64) error {
			return s.Release(ctx, "k", token+1)
		}, false, state{true, idempotency.Processing}},
		{"get", func(s idempotency.Store, _ uint64) error {
			_, err := s.Get(ctx, "k", t0)
			return err
		}, true, state{true, idempotency.Processing}},
		{"get of an absent key", func(s idempotency.Store, _ uint64) error {
			_, err := s.Get(ctx, "absent", t0)
			return err
		}, false, state{true, idempotency.Processing}},
		{"delete", func(s idempotency.Store, _ uint64) error {
			return s.Delete(ctx, "k")
		}, true, state{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := idempotency.NewMemoryStore()
			rec, _, err := mem.Begin(ctx, "k", "fp", t0, lease, retention)
			if err != nil {
				t.Fatal(err)
			}
			s := faultstore.New(mem, faultstore.LostAck(nil))
			err = tc.call(s, rec.Token)
			var ie *faultstore.InjectedError
			if !errors.As(err, &ie) || !errors.Is(err, idempotency.ErrUnavailable) {
				t.Fatalf("error = %v; want an InjectedError wrapping ErrUnavailable", err)
			}
			if errors.Is(err, idempotency.ErrLeaseLost) || errors.Is(err, idempotency.ErrNotFound) {
				t.Errorf("error = %v; the store's own answer must stay out of the chain", err)
			}
			if ie.Applied != tc.wantApplied {
				t.Errorf("Applied = %v; want %v (%v)", ie.Applied, tc.wantApplied, err)
			}
			got, gerr := mem.Get(ctx, "k", t0)
			if have := (state{gerr == nil, got.State}); have != tc.want {
				t.Errorf("the store's record afterwards: %+v (Get: %v); want %+v", have, gerr, tc.want)
			}
			if n := s.Injected(ie.Op); n != 1 {
				t.Errorf("Injected(%s) = %d; want 1", ie.Op, n)
			}
		})
	}
}
