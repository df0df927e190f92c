package faultstore_test

import (
	"errors"
	"testing"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/faultstore"
	"github.com/archlab/idempotency/idemtest"
)

// With no fault to inject, a faultstore is the store it wraps and passes
// the conformance suite; with every operation failing it is the suite's
// broken store.
func TestConformance(t *testing.T) {
	idemtest.Run(t, idemtest.Harness{
		New: func(t *testing.T) idempotency.Store {
			return faultstore.New(idempotency.NewMemoryStore(), faultstore.None)
		},
		Broken: func(t *testing.T) idempotency.Store {
			return faultstore.New(idempotency.NewMemoryStore(), faultstore.Error(errors.New("connection refused")))
		},
	})
}
