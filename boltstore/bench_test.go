package boltstore

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

// benchGuard runs b.N new requests (Begin, fn, Complete: two fsynced writes
// each) through Guard.Do from workers goroutines.
func benchGuard(b *testing.B, s *Store, workers int) {
	g, err := idempotency.NewGuard(s, nil)
	if err != nil {
		b.Fatal(err)
	}
	resp := idempotency.Response{Status: 200, Body: []byte(`{"ok":true}`)}
	fn := func(context.Context) (idempotency.Response, error) { return resp, nil }
	ctx := context.Background()
	prefix := fmt.Sprintf("bench-%d-%d-", workers, b.N)
	var next atomic.Int64
	commits0 := s.commits.Load()
	b.ResetTimer()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				_, outcome, err := g.Do(ctx, prefix+strconv.FormatInt(i, 10), "fp", fn)
				if err != nil || outcome != idempotency.Executed {
					b.Errorf("Do: %s %v", outcome, err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	b.ReportMetric(float64(s.commits.Load()-commits0)/float64(b.N), "fsyncs/req")
}

// BenchmarkGuardDo is Guard.Do throughput through boltstore, with group
// commit, at 1, 8 and 64 concurrent callers.
func BenchmarkGuardDo(b *testing.B) {
	for _, w := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("workers=%d", w), func(b *testing.B) {
			benchGuard(b, openTest(b, nil), w)
		})
	}
}

// BenchmarkGroupCommit compares group commit with one transaction (one
// fsync) per write, at 64 concurrent callers. The goal is a ratio of 10 or
// more between the req/s of the two.
func BenchmarkGroupCommit(b *testing.B) {
	b.Run("batched/workers=64", func(b *testing.B) {
		benchGuard(b, openTest(b, nil), 64)
	})
	b.Run("batched-delay200us/workers=64", func(b *testing.B) {
		benchGuard(b, openTest(b, &Options{MaxBatchDelay: 200 * time.Microsecond}), 64)
	})
	b.Run("solo/workers=64", func(b *testing.B) {
		s := openTest(b, nil)
		s.solo = true
		benchGuard(b, s, 64)
	})
}
