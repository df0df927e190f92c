package idempotency

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"testing/synctest"
	"time"
	"unsafe"
)

// wallBehind returns t, which carries a monotonic reading, with its wall
// reading moved back by d and its monotonic reading kept. It is how an
// anchor taken just before a suspend of d looks just after it: the monotonic
// clock stopped while the wall clock did not, so time.Since finds the
// anchor fresh and the local clock reads d late.
func wallBehind(t *testing.T, now time.Time, d time.Duration) time.Time {
	t.Helper()
	type layout struct { // time.Time's fields
		wall uint64
		ext  int64
		loc  *time.Location
	}
	l := (*layout)(unsafe.Pointer(&now))
	if l.wall>>63 == 0 {
		t.Skip("time.Now carries no monotonic reading")
	}
	l.wall -= uint64(d/time.Second) << 30 // the seconds above 30 bits of nanoseconds
	if got := time.Since(now); got < 0 || got > anchorFor/2 {
		t.Skipf("time.Time's layout changed: time.Since = %v", got)
	}
	if got := time.Until(now.Add(d).Round(0)); got < -time.Second || got > time.Second {
		t.Skipf("time.Time's layout changed: wall reading %v", now)
	}
	return now
}

// TestClaimAfterSuspend: the local clock may run late for up to
// anchorFor after a suspend, because the monotonic clock stopped. A claim
// taken by such a reading must not write a lease that has already run out
// by everyone else's clock, nor a result whose window ends that much early:
// a second caller would run fn again while the first still runs it, or run
// it again after the window that callers were promised. Both the
// MemoryStore's fast path and the path of every other store are checked.
func TestClaimAfterSuspend(t *testing.T) {
	defer anchor.Store(nil)
	const suspend = time.Hour
	for _, path := range []string{"fast", "store"} {
		t.Run(path, func(t *testing.T) {
			ms := NewMemoryStore()
			var s Store = ms
			if path == "store" {
				s = hidden{ms}
			}
			ctx := context.Background()
			local := &Guard{Store: s, Lease: 30 * time.Second, Retention: time.Hour} // Now nil: the local clock
			other := &Guard{Store: s, Lease: 30 * time.Second, Retention: time.Hour, Now: time.Now}

			at := wallBehind(t, time.Now(), suspend)
			anchor.Store(&clockAnchor{t: at, unix: at.UnixNano()})
			started, finish := make(chan struct{}), make(chan struct{})
			done := make(chan Result)
			go func() {
				r, err := local.Run(ctx, "k", "fp", func(context.Context) (Response, error) {
					close(started)
					<-finish
					return Response{Status: 200}, nil
				})
				if err != nil {
					t.Errorf("first caller: %v", err)
				}
				done <- r
			}()
			<-started
			r, err := other.Run(ctx, "k", "fp", func(context.Context) (Response, error) {
				return Response{Status: 201}, nil
			})
			close(finish)
			first := <-done
			if r.Outcome != InFlight || !errors.Is(err, ErrInFlight) {
				t.Errorf("a second caller while fn runs: %s %v, want %s: the claim's lease had run out when it was written", r.Outcome, err, InFlight)
			}
			if first.Outcome != Executed {
				t.Fatalf("first caller: %s", first.Outcome)
			}

			// A result stored by the late clock is replayed for the whole
			// window by a correct one.
			at = wallBehind(t, time.Now(), suspend)
			anchor.Store(&clockAnchor{t: at, unix: at.UnixNano()})
			r, err = local.Run(ctx, "k2", "fp", func(context.Context) (Response, error) { return Response{Status: 200}, nil })
			if err != nil || r.Outcome != Executed {
				t.Fatal(r.Outcome, err)
			}
			if want := time.Now().Add(local.Retention).Round(0); r.ExpiresAt.Round(0).Before(want.Add(-time.Minute)) {
				t.Errorf("Result.ExpiresAt %v, want about %v", r.ExpiresAt, want)
			}
			if _, err := s.Get(ctx, "k2", time.Now().Add(local.Retention-time.Minute)); err != nil {
				t.Errorf("the stored result is gone a minute before its window ends: %v", err)
			}
		})
	}
}

// TestLocalClockReplaysLate: with the local clock late, a Begin that
// writes nothing may still be answered by it, and only on the safe side: a
// result whose window ended during the suspend is replayed, a lease that
// ran out is still in flight.
func TestLocalClockReplaysLate(t *testing.T) {
	defer anchor.Store(nil)
	s := NewMemoryStore()
	ctx := context.Background()
	past := time.Now().Add(-2 * time.Minute)
	then := &Guard{Store: s, Lease: 10 * time.Second, Retention: time.Minute, Now: func() time.Time { return past }, RenewEvery: -1}
	if _, err := then.Run(ctx, "done", "fp", func(context.Context) (Response, error) { return Response{Status: 200}, nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := then.Run(ctx, "held", "fp", func(context.Context) (Response, error) { return Response{}, errors.New("kept") }); err == nil {
		t.Fatal("fn's error was lost")
	}
	local := &Guard{Store: s, Lease: 10 * time.Second, Retention: time.Minute, RenewEvery: -1}
	at := wallBehind(t, time.Now(), 2*time.Minute)
	anchor.Store(&clockAnchor{t: at, unix: at.UnixNano()})
	ran := false
	fn := func(context.Context) (Response, error) { ran = true; return Response{Status: 201}, nil }
	if r, err := local.Run(ctx, "done", "fp", fn); err != nil || r.Outcome != Replayed {
		t.Errorf("done: %s %v, want %s", r.Outcome, err, Replayed)
	}
	if r, err := local.Run(ctx, "held", "fp", fn); !errors.Is(err, ErrInFlight) {
		t.Errorf("held: %s %v, want %s", r.Outcome, err, InFlight)
	}
	if ran {
		t.Error("fn ran")
	}
}

// TestGoexitReleases: fn calling runtime.Goexit (t.FailNow does) on
// the MemoryStore's fast path, with the local clock, inside a synctest
// bubble: the key is released, the renewer stopped, and a retry runs at once.
func TestGoexitReleases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewMemoryStore()
		g := &Guard{Store: s, Lease: 3 * time.Second, Retention: time.Hour}
		ctx := context.Background()
		returned := make(chan struct{})
		go func() {
			defer close(returned)
			_, _ = g.Run(ctx, "k", "fp", func(context.Context) (Response, error) {
				time.Sleep(2 * time.Second) // a renewal happens first
				runtime.Goexit()
				return Response{}, nil
			})
			t.Error("Run returned after Goexit")
		}()
		<-returned
		if _, err := s.Get(ctx, "k", time.Now()); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Get after Goexit = %v, want ErrNotFound", err)
		}
		r, err := g.Run(ctx, "k", "fp", func(context.Context) (Response, error) { return Response{Status: 200}, nil })
		if err != nil || r.Outcome != Executed {
			t.Fatalf("retry: %s %v", r.Outcome, err)
		}
		time.Sleep(time.Hour) // no renewer of either call fires
	})
}

// TestLocalClockAhead: after the wall clock is stepped back (NTP
// correcting a clock that ran fast), the local clock reads ahead for up to
// anchorFor. A Begin that would take a key over by that reading is decided
// by time.Now instead, so a lease that has time left is not taken over.
func TestLocalClockAhead(t *testing.T) {
	defer anchor.Store(nil)
	s := NewMemoryStore()
	ctx := context.Background()
	held := &Guard{Store: s, Lease: 5 * time.Second, Retention: time.Minute, Now: time.Now, RenewEvery: -1}
	if _, err := held.Run(ctx, "k", "fp", func(context.Context) (Response, error) { return Response{}, errors.New("kept") }); err == nil {
		t.Fatal("fn's error was lost")
	}
	at := wallBehind(t, time.Now(), -10*time.Second)
	anchor.Store(&clockAnchor{t: at, unix: at.UnixNano()})
	local := &Guard{Store: s, Lease: 5 * time.Second, Retention: time.Minute, RenewEvery: -1}
	r, err := local.Run(ctx, "k", "fp", func(context.Context) (Response, error) { return Response{Status: 201}, nil })
	if !errors.Is(err, ErrInFlight) {
		t.Fatalf("a clock 10 s ahead: %s %v, want %s", r.Outcome, err, InFlight)
	}
	if got := time.Until(r.LeaseUntil.Round(0)); got < 3*time.Second || got > 5*time.Second {
		t.Errorf("LeaseUntil is %v from now, want the holder's lease", got)
	}
}
