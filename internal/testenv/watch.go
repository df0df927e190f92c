package testenv

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// WatchDeletesFunc is the signature of the stores' WatchDeletes method
// (redisstore.Store.WatchDeletes, pgstore.Store.WatchDeletes).
type WatchDeletesFunc func(ctx context.Context, forget func(key string), reset func(), report func(error)) error

// DefaultWait is the Wait of a new Watcher.
const DefaultWait = 5 * time.Second

// callBuffer is how many calls of each kind a Watcher holds before the
// watched WatchDeletes blocks (until the test takes one, or the watch ends).
const callBuffer = 1000

// Watcher runs a WatchDeletes until the test ends and lets the test wait
// for what it calls. Forgotten keys and resets are kept in one queue, in
// the order they came, so that a test sees a reset where it expected a key
// (and the other way round); failures reported are kept apart, since a
// store reports as often as it retries while a server is down.
//
// Its methods fail the test they are given, and must be called from that
// test's goroutine.
type Watcher struct {
	// Wait bounds how long WantReset, WantForgot and WantReport wait:
	// DefaultWait unless the test sets it.
	Wait time.Duration

	calls   chan call // forget and reset, in order
	reports chan error
	cancel  context.CancelFunc
	done    chan struct{} // closed once WatchDeletes has returned
	err     error         // what WatchDeletes returned, once done is closed
}

// call is one call of forget (reset false) or of reset.
type call struct {
	key   string
	reset bool
}

func (c call) String() string {
	if c.reset {
		return "a reset"
	}
	return "forgot " + quoteKey(c.key)
}

// Watch starts watch and waits for its first reset, which the stores call
// once they listen. The watch is cancelled when t ends, and t fails if it
// has not returned DefaultWait later.
func Watch(t testing.TB, watch WatchDeletesFunc) *Watcher {
	t.Helper()
	w := StartWatch(t, watch)
	w.WantReset(t)
	return w
}

// StartWatch is Watch without waiting for the first reset: for a watch
// that is expected never to listen.
func StartWatch(t testing.TB, watch WatchDeletesFunc) *Watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &Watcher{
		Wait:    DefaultWait,
		calls:   make(chan call, callBuffer),
		reports: make(chan error, callBuffer),
		cancel:  cancel,
		done:    make(chan struct{}),
	}
	go func() {
		defer close(w.done)
		w.err = watch(ctx,
			func(key string) { send(ctx, w.calls, call{key: key}) },
			func() { send(ctx, w.calls, call{reset: true}) },
			func(err error) { send(ctx, w.reports, err) })
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-w.done:
		case <-time.After(DefaultWait):
			t.Errorf("WatchDeletes did not return within %v of its context's end", DefaultWait)
		}
	})
	return w
}

// send sends v on ch, or gives up once ctx ends: a test that stopped
// taking calls never keeps WatchDeletes from returning.
func send[T any](ctx context.Context, ch chan<- T, v T) {
	select {
	case ch <- v:
	case <-ctx.Done():
	}
}

// take returns the next value on ch, failing t if none comes within
// w.Wait: noun names what ch carries, want what the test waits for.
func take[T any](t testing.TB, w *Watcher, ch <-chan T, noun, want string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-w.done:
		// Its last calls were made before it returned.
		select {
		case v := <-ch:
			return v
		default:
		}
		t.Fatalf("WatchDeletes returned %v while the test waited for %s", w.err, want)
	case <-time.After(w.Wait):
		t.Fatalf("no %s within %v: want %s", noun, w.Wait, want)
	}
	var zero T
	return zero
}

// next returns the next forget or reset; want says what the test waits for.
func (w *Watcher) next(t testing.TB, want string) call {
	t.Helper()
	return take(t, w, w.calls, "forget or reset", want)
}

// WantReset fails t unless the next call is a reset: a key forgotten
// first, or nothing within w.Wait, fails it.
func (w *Watcher) WantReset(t testing.TB) {
	t.Helper()
	if c := w.next(t, "a reset"); !c.reset {
		t.Fatalf("%v, want a reset", c)
	}
}

// WantForgot fails t unless the next call is forget(key): another key, a
// reset, or nothing within w.Wait fails it. Deletions are announced in the
// order they were made, so a deletion that should not have been announced
// shows up here in place of key.
func (w *Watcher) WantForgot(t testing.TB, key string) {
	t.Helper()
	want := "forgot " + quoteKey(key)
	if c := w.next(t, want); c.reset || c.key != key {
		t.Fatalf("%v, want %s", c, want)
	}
}

// Forgot reports whether key is forgotten within d, passing over the other
// keys forgotten and the resets meanwhile: for a feed that may lose
// announcements, whose test deletes a key again until it is heard.
func (w *Watcher) Forgot(key string, d time.Duration) bool {
	deadline := time.After(d)
	for {
		select {
		case c := <-w.calls:
			if !c.reset && c.key == key {
				return true
			}
		case <-deadline:
			return false
		}
	}
}

// WantReport returns the next failure reported, failing t if none comes
// within w.Wait.
func (w *Watcher) WantReport(t testing.TB) error {
	t.Helper()
	return take(t, w, w.reports, "failure reported", "a failure reported")
}

// WantQuiet fails t if a key was forgotten or a reset came that no Want
// method has taken. Failures reported are let be: see WantNoReport.
func (w *Watcher) WantQuiet(t testing.TB) {
	t.Helper()
	select {
	case c := <-w.calls:
		t.Fatalf("%v, want no forget or reset", c)
	default:
	}
}

// WantNoReport fails t if a failure was reported that no Want method has
// taken.
func (w *Watcher) WantNoReport(t testing.TB) {
	t.Helper()
	select {
	case err := <-w.reports:
		t.Fatalf("reported %v, want no failure", err)
	default:
	}
}

// WantReturn cancels the watch and fails t unless WatchDeletes returns
// context.Canceled within d.
func (w *Watcher) WantReturn(t testing.TB, d time.Duration) {
	t.Helper()
	start := time.Now()
	w.cancel()
	select {
	case <-w.done:
	case <-time.After(d):
		t.Fatalf("WatchDeletes did not return within %v of its context's end", d)
	}
	t.Logf("WatchDeletes returned %v after its context's end", time.Since(start))
	if !errors.Is(w.err, context.Canceled) {
		t.Errorf("WatchDeletes = %v, want context.Canceled", w.err)
	}
}

// quoteKey quotes key for a message, shortened to its first 40 bytes and
// its length when it is longer.
func quoteKey(key string) string {
	const most = 40
	if len(key) <= most {
		return fmt.Sprintf("%q", key)
	}
	return fmt.Sprintf("%q… (%d bytes)", key[:most], len(key))
}
