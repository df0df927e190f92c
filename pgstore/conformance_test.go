package pgstore

import (
	"testing"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemtest"
)

var _ idempotency.Store = (*Store)(nil)

func TestConformance(t *testing.T) {
	pool := testPool(t, 16, nil)
	schema := freshSchema(t, pool)
	idemtest.Run(t, idemtest.Harness{
		New: func(t *testing.T) idempotency.Store {
			return migratedStore(t, pool, schema, Options{})
		},
		Broken: func(t *testing.T) idempotency.Store { return brokenStore(t) },
	})
}
