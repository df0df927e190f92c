package boltstore

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

// Close in the middle of a storm of writes and reads: no call panics or
// hangs, every call that fails says ErrUnavailable, every write that
// returned nil is in the reopened file, and a Begin after another
// goroutine's acknowledged Complete replays it instead of claiming the key
// (the read path never misses a completed record). TestMain's goleak
// check finds a committer or waiter left behind.
func TestCloseDuringStorm(t *testing.T) {
	for round := range 5 {
		t.Run(fmt.Sprint("round", round), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "storm.db")
			s, err := Open(path, &Options{MaxBatchSize: 8})
			if err != nil {
				t.Fatal(err)
			}
			var (
				mu      sync.Mutex
				claimed = map[string]uint64{}
				done    []string
				wg      sync.WaitGroup
			)
			completed := make(chan string, 1024)
			unavailable := func(what string, err error) {
				if !errors.Is(err, idempotency.ErrUnavailable) {
					t.Errorf("%s: %v, want nil or ErrUnavailable", what, err)
				}
			}
			const writers, readers = 8, 4
			var writing sync.WaitGroup
			for w := range writers {
				writing.Go(func() {
					for i := 0; ; i++ {
						key := fmt.Sprintf("w%d-%d", w, i)
						rec, ok, err := s.Begin(ctx, key, "fp", t0, lease, retention)
						if err != nil {
							unavailable("Begin", err)
							return
						}
						if !ok {
							t.Errorf("Begin(%s) of a new key did not claim it: %+v", key, rec)
							return
						}
						mu.Lock()
						claimed[key] = rec.Token
						mu.Unlock()
						err = s.Complete(ctx, key, rec.Token, idempotency.Response{Status: 200, Body: []byte(key)}, t0, retention)
						if err != nil {
							unavailable("Complete", err)
							return
						}
						mu.Lock()
						done = append(done, key)
						mu.Unlock()
						select {
						case completed <- key:
						default:
						}
					}
				})
			}
			for range readers {
				wg.Go(func() {
					for key := range completed {
						got, ok, err := s.Begin(ctx, key, "fp", t0.Add(time.Second), lease, retention)
						if err != nil {
							unavailable("Begin of a completed key", err)
							continue
						}
						if ok || got.State != idempotency.Done || string(got.Response.Body) != key {
							t.Errorf("Begin(%s) after its acknowledged Complete = %+v, %v; want a replay", key, got, ok)
						}
						if _, err := s.Get(ctx, key, t0); err != nil {
							unavailable("Get", err)
						}
					}
				})
			}
			// Let the storm run until some Completes are acknowledged.
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
				mu.Lock()
				n := len(done)
				mu.Unlock()
				if n > 20*(round+1) {
					break
				}
			}
			if err := s.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			writing.Wait()
			close(completed)
			wg.Wait()
			for _, err := range []error{
				func() error { _, _, err := s.Begin(ctx, "after", "fp", t0, lease, retention); return err }(),
				func() error { _, err := s.Get(ctx, "after", t0); return err }(),
				func() error { _, err := s.Sweep(ctx, t0, 0); return err }(),
			} {
				unavailable("a call after Close", err)
			}

			s, err = Open(path, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			checkFile(t, s.DB())
			checkIndex(t, s)
			for key, tok := range claimed {
				if rec, err := s.Get(ctx, key, t0); err != nil || rec.Token != tok {
					t.Errorf("acknowledged claim of %s (token %d) after Close: %+v, %v", key, tok, rec, err)
				}
			}
			for _, key := range done {
				if rec, err := s.Get(ctx, key, t0); err != nil || rec.State != idempotency.Done {
					t.Errorf("acknowledged Complete of %s after Close: %+v, %v", key, rec, err)
				}
			}
			t.Logf("%d claims and %d Completes acknowledged before Close", len(claimed), len(done))
		})
	}
}
