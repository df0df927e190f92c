package faultstore_test

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/faultstore"
)

// TestSpecIsSeeded: a spec's injector makes the same choices and waits the
// same latencies for the same seed and the same calls, and others for
// another seed; the errors it injects land on the same calls.
func TestSpecIsSeeded(t *testing.T) {
	spec, err := faultstore.Parse("begin:error:0.3,*:latency=1ms-50ms:0.5")
	if err != nil {
		t.Fatal(err)
	}
	run := func(seed uint64) string {
		var out string
		synctest.Test(t, func(t *testing.T) {
			s := faultstore.New(idempotency.NewMemoryStore(), spec.Injector(seed))
			for i := range 40 {
				start := time.Now()
				_, _, err := s.Begin(context.Background(), fmt.Sprint("k", i), "fp", t0, lease, retention)
				out += fmt.Sprintf("%v/%t ", time.Since(start), err != nil)
			}
		})
		return out
	}
	a, b, c := run(5), run(5), run(6)
	if a != b {
		t.Errorf("seed 5 gave two runs:\n%s\n%s", a, b)
	}
	if a == c {
		t.Errorf("seeds 5 and 6 gave the same run: %s", a)
	}
}
