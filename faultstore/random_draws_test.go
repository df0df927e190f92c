package faultstore_test

import (
	"testing"

	"github.com/archlab/idempotency/faultstore"
)

// TestRandomDrawsOnlyForFaults: Random draws its choice only for calls
// where the injector it narrows has a fault, so calls of other operations
// in between do not move the choices a seed gives the faulty ones.
func TestRandomDrawsOnlyForFaults(t *testing.T) {
	begins := func(interleave bool) string {
		inj := faultstore.Random(7, 0.5, faultstore.OnOps(faultstore.Error(nil), faultstore.OpBegin))
		b := make([]byte, 64)
		for i := range b {
			if interleave {
				for range i%3 + 1 {
					if f := inj.MaybeFault(faultstore.OpGet, "k"); f != nil {
						t.Fatalf("Random gave get a fault %v; its injector has none for get", f)
					}
				}
			}
			b[i] = '.'
			if inj.MaybeFault(faultstore.OpBegin, "k") != nil {
				b[i] = 'x'
			}
		}
		return string(b)
	}
	alone, mixed := begins(false), begins(true)
	if alone != mixed {
		t.Errorf("the choices for begin moved when gets came between them:\nalone %s\nmixed %s", alone, mixed)
	}
}
