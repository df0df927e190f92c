package redisstore

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

// TestBatchSenderKeepsItsDeadline: the caller that sends a batch returns by
// its own deadline, not by the latest one in the batch. On a paused server
// a short-deadline caller queued first, then a long-deadline one; when the
// lone call ahead of them gives up, the two go out together. The short one
// used to lead (it came first) and wait on the wire for the long one's
// deadline, seconds past its own.
func TestBatchSenderKeepsItsDeadline(t *testing.T) {
	ps := startPrivateServer(t)
	s := newStore(t, ps.client(t), Options{OpTimeout: 10 * time.Second, Logger: discard()})
	ctx := context.Background()
	if _, _, err := s.Begin(ctx, "warm", "fp", time.Now(), time.Minute, time.Hour); err != nil {
		t.Fatal(err)
	}
	ps.signal(syscall.SIGSTOP)
	defer ps.signal(syscall.SIGCONT)

	type result struct {
		took time.Duration
		err  error
	}
	begin := func(d time.Duration, key string) chan result {
		ch := make(chan result, 1)
		go func() {
			ctx, cancel := context.WithTimeout(ctx, d)
			defer cancel()
			start := time.Now()
			_, _, err := s.Begin(ctx, key, "fp", time.Now(), time.Minute, time.Hour)
			ch <- result{time.Since(start), err}
		}()
		return ch
	}
	// The lone call's deadline leaves the other two time to queue behind
	// it on a loaded machine; the short one's, time to be in the batch when
	// the lone one gives up; the long one's is far past the short one's
	// bound below.
	const lonely, short, long = 2 * time.Second, 3 * time.Second, 6 * time.Second
	lone := begin(lonely, "lone")
	onWire(t, s, lonely)
	shortCh := begin(short, "short")
	queueLen(t, s, 1, lonely)
	longCh := begin(long, "long")
	queueLen(t, s, 2, lonely)

	var rLone, rShort, rLong result
	hangGuard(t, 20*time.Second, "Begins on a paused server", func() { rLone, rShort, rLong = <-lone, <-shortCh, <-longCh })
	for name, r := range map[string]result{"lone": rLone, "short": rShort, "long": rLong} {
		if !errors.Is(r.err, idempotency.ErrUnavailable) {
			t.Errorf("Begin(%s) on a paused server = %v; want ErrUnavailable", name, r.err)
		}
	}
	if s.batches.Load() != 1 {
		t.Fatalf("%d batches sent, want the two queued calls in one", s.batches.Load())
	}
	// A bound, not a speed goal: the short caller must not wait for the
	// long one's deadline (seconds later).
	if rShort.took > short+time.Second {
		t.Fatalf("Begin with a %v deadline returned after %v, in a batch with a %v one: its deadline was not kept", short, rShort.took, long)
	}
	idle(t, s)
}
