//go:build corebench

// This file is not built with the module. scripts/bench-core.sh copies it
// into a temporary module next to the seed's own code (../shared/seed), so
// that the seed's Guard and MemoryStore and ours are measured in one binary,
// in one run.
package corebench

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"corebench/seed"

	"github.com/archlab/idempotency"
)

var body = []byte(`{"order":"o","charged":1299}`)

func newSeed() *seed.Guard {
	return &seed.Guard{Store: seed.NewMemoryStore(), Lease: 30 * time.Second, Retention: time.Hour}
}

func newOurs() *idempotency.Guard {
	return &idempotency.Guard{Store: idempotency.NewMemoryStore(), Lease: 30 * time.Second, Retention: time.Hour}
}

func seedFn(context.Context) (seed.Response, error) {
	return seed.Response{Status: 201, Body: body}, nil
}
func oursFn(context.Context) (idempotency.Response, error) {
	return idempotency.Response{Status: 201, Body: body}, nil
}

func keys(n int) []string {
	k := make([]string, n)
	for i := range k {
		k[i] = "order-" + strconv.Itoa(i)
	}
	return k
}

// Unique keys: every call claims, runs fn and stores its result. Keys are
// made before the timer so that both sides pay only for the Guard.
func BenchmarkNewKey(b *testing.B) {
	b.Run("impl=seed", func(b *testing.B) {
		g, ks := newSeed(), keys(b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if _, out, err := g.Do(context.Background(), ks[i], "fp", seedFn); err != nil || out != seed.Executed {
				b.Fatal(out, err)
			}
		}
	})
	b.Run("impl=ours", func(b *testing.B) {
		g, ks := newOurs(), keys(b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if _, out, err := g.Do(context.Background(), ks[i], "fp", oursFn); err != nil || out != idempotency.Executed {
				b.Fatal(out, err)
			}
		}
	})
}

func BenchmarkReplay(b *testing.B) {
	ks := keys(1024)
	b.Run("impl=seed", func(b *testing.B) {
		g := newSeed()
		for _, k := range ks {
			g.Do(context.Background(), k, "fp", seedFn)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if _, out, _ := g.Do(context.Background(), ks[i%len(ks)], "fp", seedFn); out != seed.Replayed {
				b.Fatal(out)
			}
		}
	})
	b.Run("impl=ours", func(b *testing.B) {
		g := newOurs()
		for _, k := range ks {
			g.Do(context.Background(), k, "fp", oursFn)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if _, out, _ := g.Do(context.Background(), ks[i%len(ks)], "fp", oursFn); out != idempotency.Replayed {
				b.Fatal(out)
			}
		}
	})
}

func BenchmarkNewKeyParallel(b *testing.B) {
	b.Run("impl=seed", func(b *testing.B) {
		g, ks := newSeed(), keys(b.N+1024)
		var next atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				k := ks[next.Add(1)%int64(len(ks))]
				g.Do(context.Background(), k, "fp", seedFn)
			}
		})
	})
	b.Run("impl=ours", func(b *testing.B) {
		g, ks := newOurs(), keys(b.N+1024)
		var next atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				k := ks[next.Add(1)%int64(len(ks))]
				g.Do(context.Background(), k, "fp", oursFn)
			}
		})
	})
}

func BenchmarkReplayParallel(b *testing.B) {
	ks := keys(1024)
	b.Run("impl=seed", func(b *testing.B) {
		g := newSeed()
		for _, k := range ks {
			g.Do(context.Background(), k, "fp", seedFn)
		}
		var next atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				g.Do(context.Background(), ks[next.Add(1)%int64(len(ks))], "fp", seedFn)
			}
		})
	})
	b.Run("impl=ours", func(b *testing.B) {
		g := newOurs()
		for _, k := range ks {
			g.Do(context.Background(), k, "fp", oursFn)
		}
		var next atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				g.Do(context.Background(), ks[next.Add(1)%int64(len(ks))], "fp", oursFn)
			}
		})
	})
}

// steadyRound is the number of keys a steady-state run keeps in the window
// (as idemhttp's benchmarks do): the clock moves a third of the retention
// every quarter round, so a record leaves the window about a round after
// it came in, like a service that has been up longer than its retention.
const steadyRound = 1 << 14

func steadyClock() (now func() time.Time, tick func(i int)) {
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	return func() time.Time { return time.Unix(0, clock.Load()) }, func(i int) {
		if i%(steadyRound/4) == 0 {
			clock.Add(int64(time.Hour / 3))
		}
	}
}

// Unique keys in steady state: every key is new, and records leave the
// window as new ones come in. Ours reclaims them as it writes, so it holds
// about one window; the seed never removes a record, so its map grows for
// as long as the benchmark runs, as it would in a long-running service.
func BenchmarkNewKeySteady(b *testing.B) {
	b.Run("impl=seed", func(b *testing.B) {
		now, tick := steadyClock()
		g := &seed.Guard{Store: seed.NewMemoryStore(), Lease: 30 * time.Second, Retention: time.Hour, Now: now}
		ks := keys(b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			tick(i)
			if _, out, err := g.Do(context.Background(), ks[i], "fp", seedFn); err != nil || out != seed.Executed {
				b.Fatal(out, err)
			}
		}
	})
	b.Run("impl=ours", func(b *testing.B) {
		now, tick := steadyClock()
		g := &idempotency.Guard{Store: idempotency.NewMemoryStore(), Lease: 30 * time.Second, Retention: time.Hour, Now: now}
		ks := keys(b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			tick(i)
			if _, out, err := g.Do(context.Background(), ks[i], "fp", oursFn); err != nil || out != idempotency.Executed {
				b.Fatal(out, err)
			}
		}
	})
}
