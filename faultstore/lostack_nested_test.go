package faultstore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/faultstore"
)

// TestLostAckAroundLostAck: a lost ack around another fault, or around a
// faultstore that lost the ack itself, still reports what happened to the
// write. It used to read the inner fault's error as the store's refusal
// and report a Begin the store had applied as not applied, so a checker
// that drops unapplied operations (storecert) lost a claim from its
// history.
func TestLostAckAroundLostAck(t *testing.T) {
	lost := faultstore.LostAck(nil)
	for _, tc := range []struct {
		name        string
		wrap        func(idempotency.Store) idempotency.Store
		wantApplied bool
	}{
		{"chained lostack+lostack", func(s idempotency.Store) idempotency.Store {
			return faultstore.New(s, faultstore.Chain(lost, lost))
		}, true},
		{"All of two lost acks", func(s idempotency.Store) idempotency.Store {
			return faultstore.New(s, faultstore.All(lost, faultstore.OnOps(lost, faultstore.OpBegin)))
		}, true},
		{"spec begin:lostack+lostack", func(s idempotency.Store) idempotency.Store {
			spec, err := faultstore.Parse("begin:lostack+lostack")
			if err != nil {
				t.Fatal(err)
			}
			return faultstore.New(s, spec.Injector(1))
		}, true},
		{"nested faultstores", func(s idempotency.Store) idempotency.Store {
			return faultstore.New(faultstore.New(s, lost), lost)
		}, true},
		{"lostack around error", func(s idempotency.Store) idempotency.Store {
			return faultstore.New(s, faultstore.Chain(lost, faultstore.Error(nil)))
		}, false},
		{"lostack around a nested error", func(s idempotency.Store) idempotency.Store {
			return faultstore.New(faultstore.New(s, faultstore.Error(nil)), lost)
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := idempotency.NewMemoryStore()
			_, _, err := begin(tc.wrap(mem), "k")
			var ie *faultstore.InjectedError
			if !errors.As(err, &ie) || !errors.Is(err, idempotency.ErrUnavailable) {
				t.Fatalf("Begin = %v; want an InjectedError wrapping ErrUnavailable", err)
			}
			_, getErr := mem.Get(context.Background(), "k", t0)
			if applied := getErr == nil; applied != tc.wantApplied {
				t.Fatalf("the store applied the Begin: %v (Get: %v); the test expects %v", applied, getErr, tc.wantApplied)
			}
			if ie.Applied != tc.wantApplied {
				t.Errorf("Begin error %q says Applied = %v; the store applied it: %v", err, ie.Applied, tc.wantApplied)
			}
		})
	}
}
