package idempotency

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestReplayCacheOldestLeaveFirst: "The oldest entries leave first" when
// MaxBytes is reached: in every shard, the entries held are the ones
// cached last, and a newcomer is cached rather than refused.
func TestReplayCacheOldestLeaveFirst(t *testing.T) {
	s := NewMemoryStore()
	c, err := NewReplayCache(s, &CacheOptions{TTL: time.Hour, MaxBytes: 80 << 10}) // 1280 bytes a shard
	if err != nil {
		t.Fatal(err)
	}
	ctx, now := context.Background(), time.Unix(1e9, 0)
	body := make([]byte, 300) // about 630 bytes an entry: two a shard
	order := map[*cacheShard][]string{}
	for i := range 64 * 8 {
		key := fmt.Sprintf("k%03d", i)
		rec, _, err := s.Begin(ctx, key, "fp", now, time.Minute, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, key, rec.Token, Response{Status: 200, Body: body}, now, time.Hour); err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.Begin(ctx, key, "fp", now, time.Minute, time.Hour); err != nil { // a miss: cached
			t.Fatal(err)
		}
		sh := c.shard(key)
		order[sh] = append(order[sh], key)
	}
	for sh, keys := range order {
		held := 0
		for i, k := range keys {
			_, ok := sh.m[k]
			if want := i >= len(keys)-len(sh.m); ok != want {
				t.Errorf("shard of %d keys holding %d: %s (cached %d-th) held %v, want %v", len(keys), len(sh.m), k, i+1, ok, want)
			}
			if ok {
				held++
			}
		}
		if len(keys) > 2 && held != 2 {
			t.Errorf("a shard holds %d entries of %d cached, want 2 under its budget", held, len(keys))
		}
	}
}

// TestVerySlowBeginStopsFnBeforeLease: Do's doc promises that, when no
// renewal gets through, fn's ctx "is cancelled a tenth of the lease before
// the last successful claim or renewal would let another holder take
// over", however long Begin took to answer. Here Begin answers 8s into a
// 10s lease, later than the first renewal was due (Lease/3): the first
// attempt must be made at once, not a whole RenewEvery after fn started,
// by which time another holder has taken the key over.
func TestVerySlowBeginStopsFnBeforeLease(t *testing.T) {
	for _, now := range []struct {
		name string
		fn   func() time.Time
	}{{"Now set", time.Now}, {"Now nil", nil}} {
		t.Run(now.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := NewMemoryStore()
				const lease = 10 * time.Second
				g := &Guard{Store: slowBeginStore{mem, 8 * time.Second}, Lease: lease, Now: now.fn}
				other := &Guard{Store: mem, Lease: lease}
				fn, overlap := overlapWatch()
				done := make(chan struct{})
				go func() {
					defer close(done)
					g.Do(context.Background(), "k", "fp", fn)
				}()
				time.Sleep(lease) // the lease granted at the start has ended
				_, out, err := other.Do(context.Background(), "k", "fp", func(ctx context.Context) (Response, error) {
					fn(ctx)
					return Response{Status: 201}, nil
				})
				<-done
				if out != Executed || err != nil {
					t.Fatalf("takeover when the lease ended: %s %v", out, err)
				}
				if overlap() {
					t.Errorf("fn ran twice at once for one key: the first holder's ctx outlived its lease of %v", lease)
				}
			})
		})
	}
}

// slowBeginOnly makes the claim at once and answers Begin after a delay (a
// slow reply); renewals get through.
type slowBeginOnly struct {
	*MemoryStore
	delay time.Duration
}

func (s slowBeginOnly) Begin(ctx context.Context, key, fp string, now time.Time, lease, retention time.Duration) (Record, bool, error) {
	rec, ok, err := s.MemoryStore.Begin(ctx, key, fp, now, lease, retention)
	time.Sleep(s.delay)
	return rec, ok, err
}

// TestVerySlowBeginStillRenewed: "fn runs at most once per key while the
// holder lives and keeps renewing". A claim that Begin answered 8s into its
// 10s lease is renewed at once, so a retry when the first lease would have
// ended finds it in flight instead of taking it over.
func TestVerySlowBeginStillRenewed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemoryStore()
		const lease = 10 * time.Second
		g := &Guard{Store: slowBeginOnly{mem, 8 * time.Second}, Lease: lease}
		other := &Guard{Store: mem, Lease: lease}
		var runs atomic.Int32
		fn := func(ctx context.Context) (Response, error) {
			runs.Add(1)
			select {
			case <-ctx.Done():
				return Response{}, ctx.Err()
			case <-time.After(20 * time.Second):
				return Response{Status: 201}, nil
			}
		}
		done := make(chan error, 1)
		go func() {
			_, _, err := g.Do(context.Background(), "k", "fp", fn)
			done <- err
		}()
		time.Sleep(lease + time.Second)
		if _, out, err := other.Do(context.Background(), "k", "fp", fn); out != InFlight {
			t.Errorf("a retry 11s into a claim that Begin answered at 8s: %s %v; want %s", out, err, InFlight)
		}
		if err := <-done; err != nil {
			t.Errorf("the slow claim: %v", err)
		}
		if n := runs.Load(); n != 1 {
			t.Errorf("fn ran %d times, want 1", n)
		}
	})
}

// TestBeginAnsweredAfterLeaseDoesNotStartFn: a claim that Begin answers
// when its lease is over, or all but (past the point where fn's ctx must
// end), is not one fn may start on: another holder may already have taken
// the key over. Fail closed: fn does not start, the answer is Unavailable,
// and the claim, if still this caller's, is given back.
func TestBeginAnsweredAfterLeaseDoesNotStartFn(t *testing.T) {
	for _, tc := range []struct {
		name  string
		delay time.Duration
		other bool // another holder takes the key over meanwhile
	}{{"nine tenths", 9500 * time.Millisecond, false}, {"taken over", 11 * time.Second, true}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := NewMemoryStore()
				const lease = 10 * time.Second
				g := &Guard{Store: slowBeginOnly{mem, tc.delay}, Lease: lease}
				fn, overlap := overlapWatch()
				var runs atomic.Int32
				counted := func(ctx context.Context) (Response, error) {
					runs.Add(1)
					return fn(ctx)
				}
				type answer struct {
					out Outcome
					err error
				}
				done := make(chan answer, 1)
				go func() {
					_, out, err := g.Do(context.Background(), "k", "fp", counted)
					done <- answer{out, err}
				}()
				otherDone := make(chan struct{})
				if tc.other {
					time.Sleep(lease + 500*time.Millisecond)
					other := &Guard{Store: mem, Lease: lease}
					go func() {
						defer close(otherDone)
						other.Do(context.Background(), "k", "fp", counted)
					}()
				} else {
					close(otherDone)
				}
				defer func() { <-otherDone }()
				a := <-done
				if a.out != Unavailable || !errors.Is(a.err, ErrUnavailable) {
					t.Errorf("Do on a claim answered %v into a %v lease = %s, %v; want %s", tc.delay, lease, a.out, a.err, Unavailable)
				}
				synctest.Wait()
				if tc.other {
					if runs.Load() != 1 || overlap() {
						t.Errorf("fn ran %d times (overlapping: %v), want once, by the holder that took over", runs.Load(), overlap())
					}
					return
				}
				if runs.Load() != 0 {
					t.Errorf("fn ran %d times on a claim answered too late", runs.Load())
				}
				// The claim was given back: a retry runs at once.
				r, err := (&Guard{Store: mem, Lease: lease}).Run(context.Background(), "k", "fp", func(context.Context) (Response, error) { return Response{Status: 201}, nil })
				if r.Outcome != Executed || err != nil {
					t.Errorf("retry = %s, %v; want %s at once", r.Outcome, err, Executed)
				}
			})
		})
	}
}
