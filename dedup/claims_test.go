package dedup_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/dedup"
	"github.com/archlab/idempotency/faultstore"
)

// clock is a settable clock for Options.Now.
type clock struct{ t atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.t.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *clock) now() time.Time          { return time.Unix(0, c.t.Load()).UTC() }
func (c *clock) advance(d time.Duration) { c.t.Add(int64(d)) }
func (c *clock) set(t time.Time)         { c.t.Store(t.UnixNano()) }
func ok(context.Context) error           { return nil }
func never(t *testing.T) func(context.Context) error {
	return func(context.Context) error { t.Error("fn ran"); return nil }
}

// TestInFlightNakDelayFloor: a message claimed elsewhere whose holder is
// about to run out of lease is Nak'ed for Options.MinDelay (10ms when 0),
// not for the few milliseconds left, so that it is not polled in a loop.
func TestInFlightNakDelayFloor(t *testing.T) {
	for _, tc := range []struct {
		name     string
		minDelay time.Duration
		want     time.Duration
	}{
		{"default", 0, 10 * time.Millisecond},
		{"set", 300 * time.Millisecond, 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClock()
			store := idempotency.NewMemoryStore()
			// Another consumer's claim, with 2ms left on its lease.
			if _, claimed, err := store.Begin(context.Background(), "m1", "dedup/v1", c.now(), time.Second, time.Hour); err != nil || !claimed {
				t.Fatal(claimed, err)
			}
			c.advance(time.Second - 2*time.Millisecond)
			w := newWindow(t, store, &dedup.Options{Lease: time.Second, MinDelay: tc.minDelay, Now: c.now})
			d, err := w.Process(context.Background(), "m1", never(t))
			if err != nil || d.Action != dedup.Nak || d.Outcome != idempotency.InFlight || d.Delay != tc.want {
				t.Errorf("%+v, %v; want Nak InFlight after %v", d, err, tc.want)
			}
		})
	}
}

// TestDefaultLeaseIsTheClaimsLease: with Lease 0 a claim excludes the others
// for idempotency.DefaultLease (30s): a duplicate that comes as the holder
// starts is Nak'ed for all of it.
func TestDefaultLeaseIsTheClaimsLease(t *testing.T) {
	c := newClock()
	w := newWindow(t, idempotency.NewMemoryStore(), &dedup.Options{Now: c.now})
	var d dedup.Decision
	var err error
	if _, perr := w.Process(context.Background(), "m1", func(ctx context.Context) error {
		d, err = w.Process(ctx, "m1", never(t))
		return nil
	}); perr != nil {
		t.Fatal(perr)
	}
	if err != nil || d.Outcome != idempotency.InFlight || d.Delay != idempotency.DefaultLease {
		t.Errorf("duplicate during the first run: %+v, %v; want InFlight, Nak after %v", d, err, idempotency.DefaultLease)
	}
}

// TestUnavailableDelayDefault: with UnavailableDelay 0 a message whose
// claim the store cannot make is Nak'ed after 1s, with an error wrapping
// ErrUnavailable, and fn does not run.
func TestUnavailableDelayDefault(t *testing.T) {
	store := idempotency.NewMemoryStore()
	store.Fault = func(string) error { return errors.New("connection refused") }
	w := newWindow(t, store, nil)
	d, err := w.Process(context.Background(), "m1", never(t))
	if !errors.Is(err, idempotency.ErrUnavailable) || d.Action != dedup.Nak || d.Outcome != idempotency.Unavailable || d.Delay != time.Second {
		t.Errorf("%+v, %v; want Nak after 1s with ErrUnavailable", d, err)
	}
}

// TestRetryDelayDefaultIsImmediate: with RetryDelay 0 a failed message is
// Nak'ed with no delay.
func TestRetryDelayDefaultIsImmediate(t *testing.T) {
	w := newWindow(t, idempotency.NewMemoryStore(), nil)
	boom := errors.New("boom")
	d, err := w.Process(context.Background(), "m1", func(context.Context) error { return boom })
	if !errors.Is(err, boom) || d.Action != dedup.Nak || d.Delay != 0 {
		t.Errorf("%+v, %v; want Nak at once with fn's error", d, err)
	}
}

// TestWindowBoundsTheDedup: a processed id is dropped for Options.Window
// (24h when 0) after its success was stored, and runs fn again after it.
func TestWindowBoundsTheDedup(t *testing.T) {
	for _, tc := range []struct {
		name   string
		window time.Duration
		want   time.Duration
	}{
		{"default", 0, 24 * time.Hour},
		{"set", time.Hour, time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClock()
			start := c.now()
			w := newWindow(t, idempotency.NewMemoryStore(), &dedup.Options{Window: tc.window, Now: c.now})
			runs := 0
			fn := func(context.Context) error { runs++; return nil }
			for _, step := range []struct {
				at   time.Duration
				want idempotency.Outcome
			}{
				{0, idempotency.Executed},
				{tc.want - time.Second, idempotency.Replayed},
				{tc.want + time.Second, idempotency.Executed},
			} {
				c.set(start.Add(step.at))
				d, err := w.Process(context.Background(), "m1", fn)
				if err != nil || d.Action != dedup.Ack || d.Outcome != step.want {
					t.Errorf("at +%v: %+v, %v; want Ack %s", step.at, d, err, step.want)
				}
			}
			if runs != 2 {
				t.Errorf("fn ran %d times, want 2 (once in the window, once after it)", runs)
			}
		})
	}
}

// TestFnCarriesTheFencingToken: fn's ctx carries the claim's fencing
// token, and a consumer that takes over a dead one's claim gets a greater
// one, so that the dead one's late writes can be refused downstream.
func TestFnCarriesTheFencingToken(t *testing.T) {
	c := newClock()
	store := idempotency.NewMemoryStore()
	dead, claimed, err := store.Begin(context.Background(), "m1", "dedup/v1", c.now(), 5*time.Second, time.Hour)
	if err != nil || !claimed {
		t.Fatal(claimed, err)
	}
	c.advance(6 * time.Second)
	w := newWindow(t, store, &dedup.Options{Lease: 5 * time.Second, Now: c.now})
	var token uint64
	var has bool
	d, err := w.Process(context.Background(), "m1", func(ctx context.Context) error {
		token, has = idempotency.TokenFrom(ctx)
		return nil
	})
	if err != nil || d.Outcome != idempotency.Executed {
		t.Fatalf("%+v, %v; want Executed", d, err)
	}
	if !has || token <= dead.Token {
		t.Errorf("fn's token %d (present %v), want one greater than the dead consumer's %d", token, has, dead.Token)
	}
}

// TestCancelWhileFnRuns: cancelling Process's ctx cancels fn's; a fn that
// returns that error is Nak'ed after RetryDelay with its claim released
// (the release is not cut short by the cancel), so the redelivery runs it
// at once.
func TestCancelWhileFnRuns(t *testing.T) {
	store := idempotency.NewMemoryStore()
	w := newWindow(t, store, &dedup.Options{Lease: time.Minute, RetryDelay: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	d, err := w.Process(ctx, "m1", func(fctx context.Context) error {
		cancel()
		select {
		case <-fctx.Done():
			return fctx.Err()
		case <-time.After(5 * time.Second):
			return errors.New("fn's ctx was not cancelled with Process's")
		}
	})
	if !errors.Is(err, context.Canceled) || d.Action != dedup.Nak || d.Outcome != idempotency.Executed || d.Delay != 20*time.Millisecond {
		t.Fatalf("%+v, %v; want Nak after RetryDelay with ctx's error", d, err)
	}
	if rec, err := store.Get(context.Background(), "m1", time.Now()); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("store after the cancel: %+v, %v; want the claim released", rec, err)
	}
	if d, err := w.Process(context.Background(), "m1", ok); err != nil || d.Outcome != idempotency.Executed {
		t.Errorf("redelivery: %+v, %v; want Executed at once", d, err)
	}
}

// TestLostAcknowledgements: a store write that was applied but whose
// answer was lost. A lost Begin: Nak after UnavailableDelay with
// ErrUnavailable, fn does not run, and the claim nobody holds blocks the id
// until its lease ends (redeliveries before then are Nak'ed as in flight
// with the time left on it); then the message runs once. A lost Complete:
// Ack with the error (the effect happened), and a redelivery is replayed,
// since the success was stored after all.
func TestLostAcknowledgements(t *testing.T) {
	t.Run("begin", func(t *testing.T) {
		c := newClock()
		fs := faultstore.New(idempotency.NewMemoryStore(), faultstore.Times(1, faultstore.OnOps(faultstore.LostAck(nil), faultstore.OpBegin)))
		w := newWindow(t, fs, &dedup.Options{Lease: 5 * time.Second, UnavailableDelay: 100 * time.Millisecond, Now: c.now})
		d, err := w.Process(context.Background(), "m1", never(t))
		if !errors.Is(err, idempotency.ErrUnavailable) || d.Action != dedup.Nak || d.Outcome != idempotency.Unavailable || d.Delay != 100*time.Millisecond {
			t.Fatalf("lost Begin: %+v, %v; want Nak after UnavailableDelay with ErrUnavailable", d, err)
		}
		c.advance(2 * time.Second)
		d, err = w.Process(context.Background(), "m1", never(t))
		if err != nil || d.Action != dedup.Nak || d.Outcome != idempotency.InFlight || d.Delay != 3*time.Second {
			t.Fatalf("redelivery inside the lost claim's lease: %+v, %v; want Nak InFlight after the 3s left", d, err)
		}
		c.advance(3*time.Second + time.Millisecond)
		runs := 0
		d, err = w.Process(context.Background(), "m1", func(context.Context) error { runs++; return nil })
		if err != nil || d.Action != dedup.Ack || d.Outcome != idempotency.Executed || runs != 1 {
			t.Errorf("redelivery after the lease: %+v, %v, ran %d; want Executed once", d, err, runs)
		}
	})
	t.Run("complete", func(t *testing.T) {
		fs := faultstore.New(idempotency.NewMemoryStore(), faultstore.Times(1, faultstore.OnOps(faultstore.LostAck(nil), faultstore.OpComplete)))
		w := newWindow(t, fs, nil)
		runs := 0
		fn := func(context.Context) error { runs++; return nil }
		d, err := w.Process(context.Background(), "m1", fn)
		if !errors.Is(err, idempotency.ErrUnavailable) || d.Action != dedup.Ack || d.Outcome != idempotency.Executed {
			t.Fatalf("lost Complete: %+v, %v; want Ack with ErrUnavailable", d, err)
		}
		d, err = w.Process(context.Background(), "m1", fn)
		if err != nil || d.Action != dedup.Ack || d.Outcome != idempotency.Replayed || runs != 1 {
			t.Errorf("redelivery: %+v, %v, ran %d; want Replayed, fn run once", d, err, runs)
		}
	})
}
