package boltstore

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

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

// BenchmarkOpen is the cost of Open (and of its check of an existing file
// alone, see verifyFile) against bbolt's own Open of the same file, with
// the options Open gives it, in the same run: a file of 200,000 claims
// (about 50 MB).
//
//	go test -run '^$' -bench Open -count 6 ./boltstore/ | benchstat -col /open -
func BenchmarkOpen(b *testing.B) {
	path := filepath.Join(b.TempDir(), "open.db")
	boltOpts := &bolt.Options{Timeout: time.Second, FreelistType: bolt.FreelistMapType, NoFreelistSync: true}
	db, err := bolt.Open(path, 0o600, boltOpts)
	if err != nil {
		b.Fatal(err)
	}
	s, err := New(db, nil)
	if err != nil {
		b.Fatal(err)
	}
	db.NoSync = true // New refuses it; filling the file needs no fsyncs
	ctx, now := context.Background(), time.Now()
	for i := range 200_000 {
		if _, _, err := s.Begin(ctx, "key-"+strconv.Itoa(i), "fp", now, time.Hour, 24*time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	db.NoSync = false
	if err := db.Close(); err != nil {
		b.Fatal(err)
	}
	b.Run("open=bbolt", func(b *testing.B) {
		for b.Loop() {
			db, err := bolt.Open(path, 0o600, boltOpts)
			if err != nil {
				b.Fatal(err)
			}
			db.Close()
		}
	})
	b.Run("open=check", func(b *testing.B) { // the check alone
		for b.Loop() {
			if err := inspectFile(path, time.Second); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("open=boltstore", func(b *testing.B) {
		for b.Loop() {
			s, err := Open(path, nil)
			if err != nil {
				b.Fatal(err)
			}
			s.Close()
		}
	})
}
