package idempotency_test

import (
	"errors"
	"testing"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemtest"
)

func TestConformance(t *testing.T) {
	idemtest.Run(t, idemtest.Harness{
		New: func(t *testing.T) idempotency.Store { return idempotency.NewMemoryStore() },
		Broken: func(t *testing.T) idempotency.Store {
			s := idempotency.NewMemoryStore()
			s.Fault = func(op string) error { return errors.New("injected: backend down on " + op) }
			return s
		},
	})
}

// TestConformanceBounded runs the suite on a MemoryStore with a capacity,
// which takes the store's other path for new records.
func TestConformanceBounded(t *testing.T) {
	idemtest.TestStore(t, func(t *testing.T) idempotency.Store {
		s, err := idempotency.NewMemoryStoreWith(&idempotency.MemoryOptions{MaxRecords: 1000})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}
