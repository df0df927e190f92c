package dedup_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/dedup"
)

// BenchmarkProcess measures messages per second through the window on a
// MemoryStore against a plain consumer function, in process. New: every
// message is new (claim, run, store); Duplicate: every message is a
// redelivery of a processed one (one lookup).
func BenchmarkProcess(b *testing.B) {
	var sink int
	work := func(context.Context) error { sink++; return nil }
	ctx := context.Background()
	ids := make([]string, 1<<16)
	for i := range ids {
		ids[i] = "msg-" + strconv.Itoa(i)
	}
	report := func(b *testing.B) {
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	}
	b.Run("Plain", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = work(ctx)
		}
		report(b)
	})
	b.Run("WindowNew", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		var w *dedup.Window
		for b.Loop() {
			if i%len(ids) == 0 { // a fresh store per round of ids keeps every message new
				w, _ = dedup.New(idempotency.NewMemoryStore(), nil)
			}
			if _, err := w.Process(ctx, ids[i%len(ids)], work); err != nil {
				b.Fatal(err)
			}
			i++
		}
		report(b)
	})
	b.Run("WindowDuplicate", func(b *testing.B) {
		w, _ := dedup.New(idempotency.NewMemoryStore(), nil)
		if _, err := w.Process(ctx, "dup", work); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if d, err := w.Process(ctx, "dup", work); err != nil || d.Outcome != idempotency.Replayed {
				b.Fatal(d, err)
			}
		}
		report(b)
	})
	_ = sink
}
