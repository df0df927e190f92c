package testenv

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// recorder is a testing.TB that records failures; Fatal ends the goroutine
// it is called on, as it ends a test.
type recorder struct {
	testing.TB // nil: a method not defined here panics
	mu         sync.Mutex
	failures   []string
}

func (r *recorder) Helper()             {}
func (r *recorder) Logf(string, ...any) {}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}

// failures runs f on a goroutine of its own with a recorder, and returns
// the failures it recorded.
func failures(f func(tb testing.TB)) []string {
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r.failures
}

// feed holds the callbacks given to a fake WatchDeletes, for the test to
// call as a store would.
type feed struct {
	forget func(string)
	reset  func()
	report func(error)
}

// fakeWatch starts a Watcher on a fake WatchDeletes that hands its
// callbacks to the test, then returns end(ctx).
func fakeWatch(t *testing.T, end func(ctx context.Context, f feed) error) (*Watcher, feed) {
	t.Helper()
	handed := make(chan feed, 1)
	w := StartWatch(t, func(ctx context.Context, forget func(string), reset func(), report func(error)) error {
		f := feed{forget, reset, report}
		handed <- f
		return end(ctx, f)
	})
	return w, <-handed
}

// untilCancelled is a WatchDeletes's end that returns ctx's error once
// ctx ends.
func untilCancelled(ctx context.Context, _ feed) error {
	<-ctx.Done()
	return ctx.Err()
}

func TestWatcher(t *testing.T) {
	errDown := errors.New("down")
	for _, tc := range []struct {
		name string
		end  func(ctx context.Context, f feed) error // nil: untilCancelled
		do   func(tb testing.TB, w *Watcher, f feed)
		want []string // in the failures, in order; none for a pass
	}{
		{
			name: "calls in order",
			do: func(tb testing.TB, w *Watcher, f feed) {
				f.reset()
				f.forget("a")
				f.forget("\x00\xff")
				f.reset()
				w.WantReset(tb)
				w.WantForgot(tb, "a")
				w.WantForgot(tb, "\x00\xff")
				w.WantReset(tb)
				w.WantQuiet(tb)
				w.WantNoReport(tb)
			},
		},
		{
			name: "reset where a key was wanted",
			do: func(tb testing.TB, w *Watcher, f feed) {
				f.reset()
				f.forget("a")
				w.WantForgot(tb, "a")
			},
			want: []string{`a reset, want forgot "a"`},
		},
		{
			name: "key where a reset was wanted",
			do: func(tb testing.TB, w *Watcher, f feed) {
				f.forget("a")
				f.reset()
				w.WantReset(tb)
			},
			want: []string{`forgot "a", want a reset`},
		},
		{
			name: "another key",
			do: func(tb testing.TB, w *Watcher, f feed) {
				f.forget("b")
				w.WantForgot(tb, "a")
			},
			want: []string{`forgot "b", want forgot "a"`},
		},
		{
			name: "long keys shortened, with their lengths",
			do: func(tb testing.TB, w *Watcher, f feed) {
				f.forget(strings.Repeat("k", 41))
				w.WantForgot(tb, strings.Repeat("k", 42))
			},
			want: []string{`(41 bytes), want forgot "` + strings.Repeat("k", 40) + `"… (42 bytes)`},
		},
		{
			name: "no key within Wait",
			do: func(tb testing.TB, w *Watcher, f feed) {
				f.report(errDown) // not a forget or reset
				w.WantForgot(tb, "a")
			},
			want: []string{`no forget or reset within 5s: want forgot "a"`},
		},
		{
			name: "Wait set by the test",
			do: func(tb testing.TB, w *Watcher, f feed) {
				w.Wait = 10 * time.Second
				w.WantReset(tb)
			},
			want: []string{"no forget or reset within 10s"},
		},
		{
			name: "report",
			do: func(tb testing.TB, w *Watcher, f feed) {
				f.report(errDown)
				if err := w.WantReport(tb); err != errDown {
					tb.Errorf("WantReport = %v", err)
				}
				w.WantReport(tb)
			},
			want: []string{"no failure reported within 5s"},
		},
		{
			name: "reports apart from the calls",
			do: func(tb testing.TB, w *Watcher, f feed) {
				f.report(errDown)
				f.reset()
				w.WantReset(tb)
				w.WantNoReport(tb)
			},
			want: []string{"reported down, want no failure"},
		},
		{
			name: "not quiet",
			do: func(tb testing.TB, w *Watcher, f feed) {
				f.forget("a")
				w.WantQuiet(tb)
			},
			want: []string{`forgot "a", want no forget or reset`},
		},
		{
			name: "calls made before returning",
			end: func(ctx context.Context, f feed) error {
				f.forget("last")
				f.report(errDown)
				return errDown
			},
			do: func(tb testing.TB, w *Watcher, f feed) {
				<-w.done
				w.WantForgot(tb, "last")
				w.WantReport(tb)
				w.WantReset(tb)
			},
			want: []string{"WatchDeletes returned down while the test waited for a reset"},
		},
		{
			name: "returns",
			do: func(tb testing.TB, w *Watcher, f feed) {
				w.WantReturn(tb, time.Second)
			},
		},
		{
			name: "returns another error",
			end: func(ctx context.Context, f feed) error {
				<-ctx.Done()
				return errDown
			},
			do: func(tb testing.TB, w *Watcher, f feed) {
				w.WantReturn(tb, time.Second)
			},
			want: []string{"WatchDeletes = down, want context.Canceled"},
		},
		{
			name: "returns late",
			end: func(ctx context.Context, f feed) error {
				<-ctx.Done()
				time.Sleep(2 * time.Second)
				return ctx.Err()
			},
			do: func(tb testing.TB, w *Watcher, f feed) {
				w.WantReturn(tb, time.Second)
			},
			want: []string{"WatchDeletes did not return within 1s of its context's end"},
		},
		{
			name: "calls not taken do not hold up the return",
			end: func(ctx context.Context, f feed) error {
				for range callBuffer + 1 {
					f.forget("k")
					f.report(errDown)
				}
				return ctx.Err()
			},
			do: func(tb testing.TB, w *Watcher, f feed) {
				w.WantReturn(tb, time.Second)
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				end := tc.end
				if end == nil {
					end = untilCancelled
				}
				w, f := fakeWatch(t, end)
				got := failures(func(tb testing.TB) { tc.do(tb, w, f) })
				if len(got) != len(tc.want) {
					t.Fatalf("failures %q, want %d like %q", got, len(tc.want), tc.want)
				}
				for i := range got {
					if !strings.Contains(got[i], tc.want[i]) {
						t.Errorf("failure %q, want one with %q", got[i], tc.want[i])
					}
				}
			})
		})
	}
}

// TestWatch: Watch waits for the first reset, and a watch still running
// when the test ends is cancelled.
func TestWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ended := make(chan error, 1)
		t.Cleanup(func() { // after the Watcher's, which cancels the watch
			if err := <-ended; !errors.Is(err, context.Canceled) {
				t.Errorf("the watch ended with %v, want context.Canceled", err)
			}
		})
		w := Watch(t, func(ctx context.Context, forget func(string), reset func(), report func(error)) error {
			reset()
			forget("a")
			<-ctx.Done()
			ended <- ctx.Err()
			return ctx.Err()
		})
		w.WantForgot(t, "a")
	})
}
