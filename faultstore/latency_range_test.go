package faultstore

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"
)

// A latency range as wide as time.Duration allows (which Parse accepts)
// draws inside the range instead of panicking in the random source.
func TestLatencyWidestRange(t *testing.T) {
	spec, err := Parse("begin:latency=0s-" + time.Duration(math.MaxInt64).String())
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	f := spec.Injector(1).MaybeFault(OpBegin, "k")
	if err := f.Apply(ctx, OpBegin, "k", func(context.Context) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("Apply with a cancelled ctx = %v, want context.Canceled", err)
	}
	for _, r := range []struct{ min, max time.Duration }{
		{0, math.MaxInt64},
		{math.MinInt64, math.MaxInt64},
		{-time.Second, math.MaxInt64},
	} {
		l := Latency(7, r.min, r.max).(*latencyFault)
		for range 100 {
			if d := l.draw(); d < r.min || d > r.max {
				t.Fatalf("Latency(%v, %v) drew %v, outside the range", r.min, r.max, d)
			}
		}
	}
}
