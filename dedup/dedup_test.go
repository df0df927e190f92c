package dedup_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/dedup"
)

func newWindow(t *testing.T, store idempotency.Store, opts *dedup.Options) *dedup.Window {
	t.Helper()
	w, err := dedup.New(store, opts)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestProcessedMessageIsDroppedOnRedelivery(t *testing.T) {
	w := newWindow(t, idempotency.NewMemoryStore(), nil)
	ctx := context.Background()
	var runs int
	fn := func(context.Context) error { runs++; return nil }
	d, err := w.Process(ctx, "m1", fn)
	if err != nil || d.Action != dedup.Ack || d.Outcome != idempotency.Executed {
		t.Fatalf("first delivery: %+v, %v; want Ack Executed", d, err)
	}
	for range 3 {
		d, err = w.Process(ctx, "m1", fn)
		if err != nil || d.Action != dedup.Ack || d.Outcome != idempotency.Replayed {
			t.Fatalf("redelivery: %+v, %v; want Ack Replayed", d, err)
		}
	}
	if runs != 1 {
		t.Errorf("fn ran %d times, want 1", runs)
	}
}

func TestFailedMessageIsProcessedAgain(t *testing.T) {
	w := newWindow(t, idempotency.NewMemoryStore(), &dedup.Options{RetryDelay: 50 * time.Millisecond})
	ctx := context.Background()
	boom := errors.New("downstream refused")
	runs := 0
	fn := func(context.Context) error {
		runs++
		if runs == 1 {
			return boom
		}
		return nil
	}
	d, err := w.Process(ctx, "m1", fn)
	if !errors.Is(err, boom) || d.Action != dedup.Nak || d.Delay != 50*time.Millisecond {
		t.Fatalf("failure: %+v, %v; want Nak after 50ms with fn's error", d, err)
	}
	d, err = w.Process(ctx, "m1", fn)
	if err != nil || d.Action != dedup.Ack || d.Outcome != idempotency.Executed {
		t.Fatalf("redelivery after failure: %+v, %v; want it processed", d, err)
	}
	if runs != 2 {
		t.Errorf("fn ran %d times, want 2", runs)
	}
}

func TestInFlightElsewhereIsNakedWithRemainingLease(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	store := idempotency.NewMemoryStore()
	w := newWindow(t, store, &dedup.Options{Lease: 10 * time.Second, RenewEvery: -1, Now: func() time.Time { return now }})
	ctx := context.Background()
	entered, finish := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := w.Process(ctx, "m1", func(context.Context) error {
			close(entered)
			<-finish
			return nil
		})
		done <- err
	}()
	<-entered
	now = now.Add(4 * time.Second) // only this goroutine reads now until finish
	d, err := w.Process(ctx, "m1", func(context.Context) error { t.Error("duplicate ran"); return nil })
	if err != nil || d.Action != dedup.Nak || d.Outcome != idempotency.InFlight || d.Delay != 6*time.Second {
		t.Errorf("duplicate in flight: %+v, %v; want Nak after the 6s left on the lease", d, err)
	}
	close(finish)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestCrashedConsumerIsTakenOverAfterLease(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	store := idempotency.NewMemoryStore()
	clock := func() time.Time { return now }
	w := newWindow(t, store, &dedup.Options{Lease: 5 * time.Second, Now: clock})
	// A consumer claimed m1 and died: its record stays Processing.
	if _, ok, err := store.Begin(context.Background(), "m1", "dedup/v1", now, 5*time.Second, time.Hour); err != nil || !ok {
		t.Fatal(ok, err)
	}
	ran := 0
	fn := func(context.Context) error { ran++; return nil }
	if d, _ := w.Process(context.Background(), "m1", fn); d.Action != dedup.Nak || ran != 0 {
		t.Fatalf("inside the dead consumer's lease: %+v, ran %d; want Nak", d, ran)
	}
	now = now.Add(6 * time.Second)
	if d, err := w.Process(context.Background(), "m1", fn); err != nil || d.Action != dedup.Ack || ran != 1 {
		t.Fatalf("after the lease: %+v, %v, ran %d; want taken over and processed", d, err, ran)
	}
}

func TestStoreUnavailableNaks(t *testing.T) {
	store := idempotency.NewMemoryStore()
	var down atomic.Bool
	store.Fault = func(op string) error {
		if down.Load() {
			return errors.New("injected outage")
		}
		return nil
	}
	w := newWindow(t, store, &dedup.Options{UnavailableDelay: 3 * time.Second})
	down.Store(true)
	ran := false
	d, err := w.Process(context.Background(), "m1", func(context.Context) error { ran = true; return nil })
	if !errors.Is(err, idempotency.ErrUnavailable) || d.Action != dedup.Nak || d.Delay != 3*time.Second || ran {
		t.Fatalf("store down: %+v, %v, ran=%v; want Nak after 3s, fn not run", d, err, ran)
	}
	// The store fails after fn succeeded: Ack (the effect happened), with
	// the error.
	down.Store(false)
	store.Fault = nil
	store2 := idempotency.NewMemoryStore()
	store2.Fault = func(op string) error {
		if op == "complete" {
			return errors.New("lost on the way")
		}
		return nil
	}
	w2 := newWindow(t, store2, nil)
	d, err = w2.Process(context.Background(), "m1", func(context.Context) error { return nil })
	if !errors.Is(err, idempotency.ErrUnavailable) || d.Action != dedup.Ack {
		t.Fatalf("complete failing: %+v, %v; want Ack with the error", d, err)
	}
}

func TestReleaseFailureNaksForTheLease(t *testing.T) {
	store := idempotency.NewMemoryStore()
	store.Fault = func(op string) error {
		if op == "release" {
			return errors.New("injected")
		}
		return nil
	}
	w := newWindow(t, store, &dedup.Options{Lease: 7 * time.Second})
	boom := errors.New("fn failed")
	d, err := w.Process(context.Background(), "m1", func(context.Context) error { return boom })
	if !errors.Is(err, boom) || d.Action != dedup.Nak || d.Delay != 7*time.Second {
		t.Fatalf("%+v, %v; want Nak after the 7s lease with fn's error", d, err)
	}
}

func TestConflictingRecordTerms(t *testing.T) {
	store := idempotency.NewMemoryStore()
	now := time.Now()
	if _, _, err := store.Begin(context.Background(), "q/m1", "someone-else", now, time.Second, time.Hour); err != nil {
		t.Fatal(err)
	}
	w := newWindow(t, store, &dedup.Options{Prefix: "q/"})
	d, err := w.Process(context.Background(), "m1", func(context.Context) error { return nil })
	if !errors.Is(err, idempotency.ErrConflict) || d.Action != dedup.Term {
		t.Errorf("%+v, %v; want Term with ErrConflict", d, err)
	}
	ran := false
	if d, err := w.Process(context.Background(), "", func(context.Context) error { ran = true; return nil }); !errors.Is(err, dedup.ErrNoID) ||
		d.Action != dedup.Term || d.Outcome != idempotency.Conflicted || ran {
		t.Errorf("empty id: %+v, %v, ran %v; want Term, Conflicted, ErrNoID, fn not run", d, err, ran)
	}
}

func TestConcurrentDuplicatesProcessOnce(t *testing.T) {
	w := newWindow(t, idempotency.NewMemoryStore(), nil)
	var effects sync.Map
	var wg sync.WaitGroup
	const ids, copies = 20, 8
	for c := range copies {
		wg.Go(func() {
			for i := range ids {
				id := string(rune('a' + (i+c)%ids))
				for {
					d, err := w.Process(context.Background(), id, func(context.Context) error {
						n, _ := effects.LoadOrStore(id, new(atomic.Int32))
						n.(*atomic.Int32).Add(1)
						return nil
					})
					if err != nil {
						t.Error(err)
						return
					}
					if d.Action == dedup.Ack {
						break
					}
					time.Sleep(time.Millisecond) // a Nak: redelivered later
				}
			}
		})
	}
	wg.Wait()
	for i := range ids {
		id := string(rune('a' + i))
		n, ok := effects.Load(id)
		if !ok || n.(*atomic.Int32).Load() != 1 {
			t.Errorf("message %s: effect count %v, want 1", id, n)
		}
	}
}

func TestOptionsValidated(t *testing.T) {
	s := idempotency.NewMemoryStore()
	for name, o := range map[string]*dedup.Options{
		"negative window":       {Window: -time.Second},
		"window below lease":    {Window: time.Second, Lease: time.Minute},
		"negative retry delay":  {RetryDelay: -1},
		"negative min delay":    {MinDelay: -1},
		"negative unavailable":  {UnavailableDelay: -1},
		"renew not below lease": {Lease: time.Second, RenewEvery: time.Second},
	} {
		if _, err := dedup.New(s, o); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := dedup.New(nil, nil); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("nil store: %v, want ErrInvalidConfig", err)
	}
}
