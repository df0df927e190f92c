package idempotency_test

// A randomized property test: seeded histories of concurrent Guard.Do calls
// over a few keys, with injected faults (errors, lost acknowledgements,
// latency), clock jumps and handlers slower than the lease, checked against
// invariants from a recorded history. Pebble's metamorphic tests are the
// model: every run prints its seed, and a failure prints the command that
// replays it.
//
//	IDEMPOTENCY_SEED=n            replay seed n (default: time-based, printed)
//	IDEMPOTENCY_PROPERTY_LONG=1   ten times the rounds
//
// Time: renewals run on real timers (lease 40ms), so the test does not use
// testing/synctest (the Guard's pooled renewal timers do not mix with
// bubbles; see faultstore's guard_synctest_test.go). Guard.Now is the real
// clock plus an offset that a jumper goroutine moves forward, sometimes past
// the lease or the retention window. The invariants are judged on the
// history, not on timing, so a slow machine changes which histories are
// explored, never the verdict.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/faultstore"
)

const (
	propLease     = 40 * time.Millisecond
	propRetention = 400 * time.Millisecond
)

func TestProperty(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("IDEMPOTENCY_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("IDEMPOTENCY_SEED=%q: %v", s, err)
		}
		seed = v
	}
	rounds := 12
	if os.Getenv("IDEMPOTENCY_PROPERTY_LONG") == "1" {
		rounds = 120
	}
	if testing.Short() {
		rounds = 3
	}
	t.Logf("seed %d (replay: IDEMPOTENCY_SEED=%d go test -race -run TestProperty -count=1 ./)", seed, seed)
	var stats propStats
	for r := range rounds {
		h := runRound(seed+uint64(r), &stats)
		if msg := h.check(); msg != "" {
			t.Fatalf("round %d: %s\nseed %d; repro: IDEMPOTENCY_SEED=%d go test -race -run TestProperty -count=1 ./",
				r, msg, seed, seed)
		}
	}
	t.Logf("%d rounds: %v", rounds, &stats)
	// A run that explored nothing proves nothing.
	if stats.outcomes[idempotency.Executed] == 0 || stats.outcomes[idempotency.Replayed] == 0 || stats.faults == 0 {
		t.Errorf("degenerate run: %v", &stats)
	}
}

type propStats struct {
	mu       sync.Mutex
	outcomes map[idempotency.Outcome]int
	faults   int
	jumps    int
	overlaps int // executions allowed to overlap because a lease ran out unrenewed
}

func (s *propStats) String() string {
	return fmt.Sprintf("outcomes %v, %d injected faults, %d clock jumps, %d permitted overlaps",
		s.outcomes, s.faults, s.jumps, s.overlaps)
}

// event is one entry of a round's history. Store events are recorded under
// the recorder's lock together with the operation, so their order is the
// order in which the store applied them.
type event struct {
	seq     int
	kind    string // begin complete extend release | fn-start fn-end | do
	call    int    // the Do call it belongs to (0: unknown)
	key, fp string
	now     time.Time
	lease   time.Duration
	token   uint64
	claimed bool
	rec     idempotency.Record
	resp    idempotency.Response
	outcome idempotency.Outcome
	err     error
}

func (e event) String() string {
	s := fmt.Sprintf("#%d %s call=%d key=%s", e.seq, e.kind, e.call, e.key)
	if e.fp != "" {
		s += " fp=" + e.fp
	}
	if e.token != 0 {
		s += fmt.Sprintf(" token=%d", e.token)
	}
	if !e.now.IsZero() {
		s += " now=" + e.now.Format("15:04:05.000000")
	}
	switch e.kind {
	case "begin":
		s += fmt.Sprintf(" -> claimed=%v %s token=%d lease=%s exp=%s", e.claimed, e.rec.State, e.rec.Token,
			e.rec.LeaseUntil.Format("15:04:05.000000"), e.rec.ExpiresAt.Format("15:04:05.000000"))
	case "do":
		s += fmt.Sprintf(" -> %s %q", e.outcome, e.resp.Body)
	case "complete", "fn-end":
		s += fmt.Sprintf(" resp=%q", e.resp.Body)
	}
	if e.err != nil {
		s += " err=" + e.err.Error()
	}
	return s
}

type history struct {
	mu     sync.Mutex
	events []event
	stats  *propStats
}

func (h *history) add(e event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.addLocked(e)
}

func (h *history) addLocked(e event) {
	e.seq = len(h.events)
	h.events = append(h.events, e)
}

type callKey struct{}

func callOf(ctx context.Context) int {
	c, _ := ctx.Value(callKey{}).(int)
	return c
}

// recorder is a Store that logs what the store beneath it applied.
type recorder struct {
	inner idempotency.Store
	h     *history
}

func (r *recorder) Begin(ctx context.Context, key, fp string, now time.Time, lease, retention time.Duration) (idempotency.Record, bool, error) {
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	rec, claimed, err := r.inner.Begin(ctx, key, fp, now, lease, retention)
	r.h.addLocked(event{kind: "begin", call: callOf(ctx), key: key, fp: fp, now: now, lease: lease, claimed: claimed, rec: rec, err: err})
	return rec, claimed, err
}

func (r *recorder) Complete(ctx context.Context, key string, token uint64, resp idempotency.Response, now time.Time, retention time.Duration) error {
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	err := r.inner.Complete(ctx, key, token, resp, now, retention)
	r.h.addLocked(event{kind: "complete", call: callOf(ctx), key: key, token: token, resp: resp, now: now, lease: retention, err: err})
	return err
}

func (r *recorder) Extend(ctx context.Context, key string, token uint64, now time.Time, lease time.Duration) error {
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	err := r.inner.Extend(ctx, key, token, now, lease)
	r.h.addLocked(event{kind: "extend", call: callOf(ctx), key: key, token: token, now: now, lease: lease, err: err})
	return err
}

func (r *recorder) Release(ctx context.Context, key string, token uint64) error {
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	err := r.inner.Release(ctx, key, token)
	r.h.addLocked(event{kind: "release", call: callOf(ctx), key: key, token: token, err: err})
	return err
}

func (r *recorder) Get(ctx context.Context, key string, now time.Time) (idempotency.Record, error) {
	return r.inner.Get(ctx, key, now)
}

func (r *recorder) Delete(ctx context.Context, key string) error { return r.inner.Delete(ctx, key) }

// runRound runs one seeded history and returns it.
func runRound(seed uint64, stats *propStats) *history {
	h := &history{stats: stats}
	fs := faultstore.New(&recorder{inner: idempotency.NewMemoryStore(), h: h}, faultstore.Any(
		faultstore.Random(seed+1, 0.04, faultstore.OnOps(faultstore.Error(nil), faultstore.OpBegin, faultstore.OpComplete, faultstore.OpExtend, faultstore.OpRelease)),
		faultstore.Random(seed+2, 0.04, faultstore.OnOps(faultstore.LostAck(nil), faultstore.OpBegin, faultstore.OpComplete, faultstore.OpExtend, faultstore.OpRelease)),
		faultstore.Random(seed+3, 0.2, faultstore.Latency(seed+4, 0, 3*time.Millisecond)),
	))
	var offset atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	g := &idempotency.Guard{Store: fs, Lease: propLease, Retention: propRetention, Now: now}

	keys := []string{"k0", "k1", "k2"}
	const workers, calls = 6, 8
	var nextCall atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	jumps := 0
	jumper := make(chan struct{})
	jrng := rand.New(rand.NewPCG(seed, 2))
	go func() {
		defer close(jumper)
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(jrng.Int64N(int64(3 * propLease)))):
			}
			var d time.Duration
			switch p := jrng.Float64(); {
			case p < 0.6:
				d = time.Duration(jrng.Int64N(int64(propLease / 2)))
			case p < 0.9:
				d = propLease + time.Duration(jrng.Int64N(int64(propLease))) // past any unrenewed lease
			default:
				d = propRetention + time.Duration(jrng.Int64N(int64(propLease))) // past the window
			}
			offset.Add(int64(d))
			jumps++
		}
	}()
	for w := range workers {
		wrng := rand.New(rand.NewPCG(seed, uint64(10+w)))
		wg.Go(func() {
			for range calls {
				call := int(nextCall.Add(1))
				key := keys[wrng.IntN(len(keys))]
				fp := "fp-A"
				if wrng.Float64() < 0.1 {
					fp = "fp-B"
				}
				work := time.Duration(wrng.Int64N(int64(5 * propLease / 2))) // up to 2.5 leases
				fail := wrng.Float64()
				ctx := context.WithValue(context.Background(), callKey{}, call)
				resp, out, err := g.Do(ctx, key, fp, func(ctx context.Context) (idempotency.Response, error) {
					token, _ := idempotency.TokenFrom(ctx)
					h.add(event{kind: "fn-start", call: call, key: key, fp: fp, token: token, now: now()})
					resp := idempotency.Response{Status: 200, Body: []byte(fmt.Sprintf("%s/%s/call-%d", key, fp, call))}
					var ferr error
					t := time.NewTimer(work)
					select {
					case <-t.C:
					case <-ctx.Done():
						t.Stop()
						ferr = ctx.Err()
					}
					switch {
					case ferr != nil:
					case fail < 0.08:
						ferr = errors.New("handler failed")
					case fail < 0.12:
						ferr = idempotency.Retryable(errors.New("refused before any effect"))
					}
					h.add(event{kind: "fn-end", call: call, key: key, token: token, resp: resp, err: ferr})
					return resp, ferr
				})
				h.add(event{kind: "do", call: call, key: key, fp: fp, resp: resp, outcome: out, err: err})
				time.Sleep(time.Duration(wrng.Int64N(int64(propLease / 2))))
			}
		})
	}
	wg.Wait()
	close(stop)
	<-jumper
	stats.mu.Lock()
	stats.faults += fs.InjectedTotal()
	stats.jumps += jumps
	stats.mu.Unlock()
	return h
}

// check verifies the invariants on the history and returns a description of
// the first violation, or "".
func (h *history) check() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	claims := map[uint64]event{} // token -> the Begin that claimed it
	leases := map[uint64]time.Time{}
	type stored struct {
		resp      idempotency.Response
		expiresAt time.Time
		ev        event
	}
	results := map[string]*stored{}    // key -> the result of the current window
	active := map[string][]event{}     // key -> fn-start events of running executions
	begins := map[int]event{}          // call -> its Begin
	completes := map[uint64]event{}    // token -> the applied Complete
	claimedFp := map[string][]string{} // key -> fingerprints that ever claimed it
	fail := func(e event, format string, args ...any) string {
		return fmt.Sprintf("%s\n  at %v\n%s", fmt.Sprintf(format, args...), e, h.around(e))
	}
	for _, e := range h.events {
		switch e.kind {
		case "begin":
			begins[e.call] = e
			if e.err != nil {
				continue
			}
			if e.claimed {
				claims[e.rec.Token] = e
				leases[e.rec.Token] = e.rec.LeaseUntil
				claimedFp[e.key] = append(claimedFp[e.key], e.fp)
			}
			if !e.claimed && e.rec.State == idempotency.Done {
				s := results[e.key]
				if s == nil || !e.now.Before(s.expiresAt) {
					return fail(e, "Begin replayed a result on %s when no result's window covers %v", e.key, e.now)
				}
				if !responsesEqual(e.rec.Response, s.resp) {
					return fail(e, "Begin replayed %q on %s; the window's result is %q", e.rec.Response.Body, e.key, s.resp.Body)
				}
			}
		case "extend":
			if e.err == nil {
				leases[e.token] = e.now.Add(e.lease)
			}
		case "complete":
			if e.err != nil {
				continue
			}
			claim, ok := claims[e.token]
			if !ok {
				return fail(e, "Complete applied with token %d, which no Begin handed out", e.token)
			}
			if s := results[e.key]; s != nil && claim.now.Before(s.expiresAt) {
				return fail(e, "second result stored on %s inside one window: its claim at %v precedes the end (%v) of the window of %v",
					e.key, claim.now, s.expiresAt, s.ev)
			}
			results[e.key] = &stored{resp: e.resp, expiresAt: e.now.Add(e.lease), ev: e}
			completes[e.token] = e
		case "fn-start":
			claim, ok := claims[e.token]
			if !ok || claim.key != e.key || claim.call != e.call {
				return fail(e, "fn started with token %d, which this call did not claim", e.token)
			}
			for _, other := range active[e.key] {
				if lease := leases[other.token]; lease.After(claim.now) {
					return fail(e, "fn runs concurrently on %s: token %d claimed at %v while token %d (call %d) held a renewed lease until %v",
						e.key, e.token, claim.now, other.token, other.call, lease)
				}
				h.stats.mu.Lock()
				h.stats.overlaps++
				h.stats.mu.Unlock()
			}
			active[e.key] = append(active[e.key], e)
		case "fn-end":
			a := active[e.key]
			for i, s := range a {
				if s.token == e.token {
					active[e.key] = append(a[:i:i], a[i+1:]...)
					break
				}
			}
		case "do":
			h.stats.mu.Lock()
			if h.stats.outcomes == nil {
				h.stats.outcomes = map[idempotency.Outcome]int{}
			}
			h.stats.outcomes[e.outcome]++
			h.stats.mu.Unlock()
			b, hasBegin := begins[e.call]
			switch e.outcome {
			case idempotency.Replayed:
				if !hasBegin || b.rec.State != idempotency.Done || !responsesEqual(e.resp, b.rec.Response) {
					return fail(e, "Do replayed %q, but its Begin (%v) returned another record", e.resp.Body, b)
				}
			case idempotency.Conflicted:
				if !hasBegin || b.rec.State != idempotency.Conflict || b.rec.Fingerprint == e.fp {
					return fail(e, "Do reported a conflict for fingerprint %s, but its Begin was %v", e.fp, b)
				}
				if !containsString(claimedFp[e.key], b.rec.Fingerprint) {
					return fail(e, "conflict with fingerprint %s, which never claimed %s", b.rec.Fingerprint, e.key)
				}
			case idempotency.Executed:
				if e.err == nil {
					c, ok := completes[b.rec.Token]
					if !hasBegin || !ok || c.call != e.call || !responsesEqual(c.resp, e.resp) {
						return fail(e, "Do reported a stored result %q, but no matching Complete was applied for its token", e.resp.Body)
					}
				}
			}
		}
	}
	return ""
}

// around returns the events of e's key up to e, the last 30 of them.
func (h *history) around(e event) string {
	var lines []string
	for _, x := range h.events[:e.seq+1] {
		if x.key == e.key {
			lines = append(lines, "    "+x.String())
		}
	}
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return strings.Join(lines, "\n")
}

func responsesEqual(a, b idempotency.Response) bool {
	return a.Status == b.Status && bytes.Equal(a.Body, b.Body)
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestPropertyChecker feeds the checker hand-made histories, each breaking
// one invariant, so that TestProperty's silence means something.
func TestPropertyChecker(t *testing.T) {
	t0 := time.Date(2026, 10, 19, 4, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	paid := func(s string) idempotency.Response { return idempotency.Response{Status: 200, Body: []byte(s)} }
	claim := func(call int, fp string, tok uint64, now time.Time) event {
		return event{kind: "begin", call: call, key: "k", fp: fp, now: now, claimed: true,
			rec: idempotency.Record{Fingerprint: fp, State: idempotency.Processing, Token: tok, LeaseUntil: now.Add(propLease), ExpiresAt: now.Add(propRetention)}}
	}
	done := func(call int, tok uint64, body string, now time.Time) event {
		return event{kind: "complete", call: call, key: "k", token: tok, resp: paid(body), now: now, lease: propRetention}
	}
	replay := func(call int, body string, now time.Time) event {
		return event{kind: "begin", call: call, key: "k", fp: "A", now: now,
			rec: idempotency.Record{Fingerprint: "A", State: idempotency.Done, Response: paid(body)}}
	}
	start := func(call int, tok uint64) event { return event{kind: "fn-start", call: call, key: "k", token: tok} }
	good := []event{claim(1, "A", 1, at(0)), start(1, 1), done(1, 1, "one", at(time.Millisecond)),
		{kind: "do", call: 1, key: "k", fp: "A", resp: paid("one"), outcome: idempotency.Executed},
		replay(2, "one", at(2*time.Millisecond)),
		{kind: "do", call: 2, key: "k", fp: "A", resp: paid("one"), outcome: idempotency.Replayed}}
	for _, tc := range []struct {
		name   string
		events []event
		want   string // a fragment of the verdict; "" for a valid history
	}{
		{"valid", good, ""},
		{"second result in one window", append(append([]event{}, good...),
			claim(3, "A", 2, at(3*time.Millisecond)), done(3, 2, "two", at(4*time.Millisecond))), "second result"},
		{"second result after the window", append(append([]event{}, good...),
			claim(3, "A", 2, at(propRetention+time.Millisecond)), done(3, 2, "two", at(propRetention+2*time.Millisecond))), ""},
		{"replay differs", append(append([]event{}, good...), replay(3, "other", at(3*time.Millisecond))), "replayed"},
		{"Do replays another body", append(append([]event{}, good[:5]...),
			event{kind: "do", call: 2, key: "k", fp: "A", resp: paid("forged"), outcome: idempotency.Replayed}), "replayed"},
		{"overlap inside a renewed lease", []event{claim(1, "A", 1, at(0)), start(1, 1),
			{kind: "extend", key: "k", token: 1, now: at(propLease - time.Millisecond), lease: propLease},
			claim(2, "A", 2, at(propLease)), start(2, 2)}, "concurrently"},
		{"overlap after an unrenewed lease", []event{claim(1, "A", 1, at(0)), start(1, 1),
			claim(2, "A", 2, at(propLease)), start(2, 2)}, ""},
		{"conflict on the same fingerprint", []event{claim(1, "A", 1, at(0)),
			{kind: "begin", call: 2, key: "k", fp: "A", now: at(0), rec: idempotency.Record{Fingerprint: "A", State: idempotency.Conflict}},
			{kind: "do", call: 2, key: "k", fp: "A", outcome: idempotency.Conflicted}}, "conflict"},
		{"Executed without a stored result", []event{claim(1, "A", 1, at(0)), start(1, 1),
			{kind: "do", call: 1, key: "k", fp: "A", resp: paid("one"), outcome: idempotency.Executed}}, "no matching Complete"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &history{stats: &propStats{}}
			for _, e := range tc.events {
				h.add(e)
			}
			got := h.check()
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("check() = %q; want a verdict containing %q", got, tc.want)
			}
		})
	}
}
