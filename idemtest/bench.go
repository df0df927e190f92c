package idemtest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/archlab/idempotency"
)

// BenchmarkStore runs the shared benchmarks of Guard.Do on s, so that every
// engine is measured the same way:
//
//	Do/new-key/workers=N   each call claims a fresh key, runs fn, stores the result
//	Do/replay/workers=N    each call replays one of 1024 stored results
//
// for N = 1, 8 and 64 goroutines. Keys carry a per-run prefix, so s may be
// a shared backend. Compare runs with benchstat.
func BenchmarkStore(b *testing.B, s idempotency.Store) {
	g := &idempotency.Guard{Store: s}
	resp := idempotency.Response{Status: 200,
		Header: map[string][]string{"Content-Type": {"application/json"}},
		Body:   []byte(`{"id":"ch_1","amount":1000,"currency":"eur"}`)}
	fn := func(context.Context) (idempotency.Response, error) { return resp, nil }
	prefix := fmt.Sprintf("idembench:%s:%d:", runID, keySeq.Add(1))

	const stored = 1024
	replayKeys := make([]string, stored)
	for i := range replayKeys {
		replayKeys[i] = fmt.Sprintf("%sreplay:%d", prefix, i)
		if _, out, err := g.Do(context.Background(), replayKeys[i], "fp", fn); err != nil || out != idempotency.Executed {
			b.Fatalf("idemtest: storing %s: %s, %v", replayKeys[i], out, err)
		}
	}
	var seq atomic.Uint64
	for _, workers := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("Do/new-key/workers=%d", workers), func(b *testing.B) {
			run := seq.Add(1)
			keys := func(i int) string { return fmt.Sprintf("%snew:%d:%d", prefix, run, i) }
			parallel(b, workers, func(i int) error {
				_, out, err := g.Do(context.Background(), keys(i), "fp", fn)
				if err == nil && out != idempotency.Executed {
					err = fmt.Errorf("outcome %s, want %s", out, idempotency.Executed)
				}
				return err
			})
		})
		b.Run(fmt.Sprintf("Do/replay/workers=%d", workers), func(b *testing.B) {
			parallel(b, workers, func(i int) error {
				_, out, err := g.Do(context.Background(), replayKeys[i%stored], "fp", fn)
				if err == nil && out != idempotency.Replayed {
					err = fmt.Errorf("outcome %s, want %s", out, idempotency.Replayed)
				}
				return err
			})
		})
	}
}

// parallel calls op b.N times in all, from exactly workers goroutines, with
// i counting calls. Key formatting is part of the measured work, as it is of
// a real caller's.
func parallel(b *testing.B, workers int, op func(i int) error) {
	b.ReportAllocs()
	var next atomic.Int64
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	n := int64(b.N)
	b.ResetTimer()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= n || failed.Load() != nil {
					return
				}
				if err := op(int(i)); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if err := failed.Load(); err != nil {
		b.Fatalf("idemtest: %v", *err)
	}
}
