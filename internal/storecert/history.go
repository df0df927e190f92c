package storecert

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/faultstore"
)

// opKind names a Store method in the history.
type opKind uint8

const (
	opBegin opKind = iota
	opComplete
	opExtend
	opRelease
	opGet
	opDelete
)

var opNames = [...]string{"Begin", "Complete", "Extend", "Release", "Get", "Delete"}

func (k opKind) String() string { return opNames[k] }

// input is what a call was asked. nowLo and nowHi bound the instant (Unix
// nanoseconds) of the clock that judged the call: both are the now argument
// for a store on the caller's clock; for a store on its server's clock they
// are the call's invocation and return on the local clock, widened by
// serverSkew (hi is open for a call whose outcome is unknown, which the
// server may still apply later).
type input struct {
	kind         opKind
	key          string
	fp           string
	token        uint64
	body         string
	nowLo, nowHi int64
	lease        time.Duration
}

// errKind classifies a call's error for the model.
type errKind uint8

const (
	errNone errKind = iota
	errLeaseLost
	errNotFound
)

// output is what a call answered. unknown marks a call that failed without
// telling whether it was applied (ErrUnavailable, a ctx error, anything
// unexpected): the model lets it have happened or not.
type output struct {
	unknown    bool
	err        errKind
	claimed    bool
	state      idempotency.State
	fp         string
	token      uint64
	body       string
	leaseUntil int64
	errText    string
}

// op is one recorded call. call and ret are local monotonic nanoseconds
// since the recorder started; ret is math.MaxInt64 for an unknown outcome.
type op struct {
	in        input
	out       output
	call, ret int64
	// wallCall and wallRet are the local wall clock, Unix nanoseconds.
	wallCall, wallRet int64
	client            int
}

// serverSkew is how far a server's clock may be from ours, for stores that
// judge leases by their server's clock.
const serverSkew = 50 * time.Millisecond

// traceKey carries a *doTrace through the Guard to the recorder.
type traceKey struct{}

// doTrace is what the recorder saw of one Guard.Do: its Begin.
type doTrace struct {
	worker   int
	mu       sync.Mutex
	begun    bool
	beginErr error
	claimed  bool
	token    uint64
	beginOp  int // index of the Begin in the history
	// completeLost: the store answered the Complete ErrLeaseLost.
	completeLost bool
}

func traceFrom(ctx context.Context) *doTrace {
	t, _ := ctx.Value(traceKey{}).(*doTrace)
	return t
}

// recorder is a Store that records every call on the wrapped store, as the
// Guard saw it, and bounds each call by opTimeout (some drivers wait for a
// silent server as long as their ctx lets them). A call that panics, or
// has not returned callGrace after its opTimeout, is a fault of the store:
// the caller gets an error, and the campaign fails checkCallsReturn.
type recorder struct {
	inner       idempotency.Store
	opTimeout   time.Duration
	serverClock bool
	start       time.Time

	mu     sync.Mutex
	ops    []op
	calls  int
	faults []*callFault
}

// callGrace is how long the recorder waits for a store call past its
// opTimeout (when its ctx has ended, and the contract wants it to return
// promptly) before it reports the call as hung and stops waiting for it.
const callGrace = 10 * time.Second

// callFault is a store call that did not return normally: it panicked,
// ended its goroutine (runtime.Goexit), or was still running callGrace
// after its ctx ended. The call may have been applied, or still be, so
// the error wraps ErrUnavailable for the Guard.
type callFault struct {
	method, key string
	what        string
	// hung: the call was given up on and may still be running.
	hung bool
}

func (e *callFault) Error() string {
	return fmt.Sprintf("storecert: the store's %s (key %s) %s", e.method, e.key, e.what)
}

func (e *callFault) Unwrap() error { return idempotency.ErrUnavailable }

// abandoned reports whether err is that of a call that may still be
// running, whose results must not be read.
func abandoned(err error) bool {
	var f *callFault
	return errors.As(err, &f) && f.hung
}

var _ idempotency.Store = (*recorder)(nil)

func newRecorder(inner idempotency.Store, opTimeout time.Duration, serverClock bool) *recorder {
	return &recorder{inner: inner, opTimeout: opTimeout, serverClock: serverClock, start: time.Now()}
}

// callStats returns how many store calls were made, and those that did not
// return normally.
func (r *recorder) callStats() (calls int, faults []*callFault) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls, append([]*callFault(nil), r.faults...)
}

// guarded runs call on a goroutine of its own and returns its error. A
// panic there (wherever the Guard called from: a worker or one of its
// renewal goroutines) or a runtime.Goexit becomes a *callFault, and so
// does a call still running opTimeout+callGrace after it started, which is
// left behind.
func (r *recorder) guarded(ctx context.Context, in input, call func(ctx context.Context) error) error {
	fault := func(what string, hung bool) error {
		f := &callFault{method: in.kind.String(), key: in.key, what: what, hung: hung}
		r.mu.Lock()
		r.faults = append(r.faults, f)
		r.mu.Unlock()
		return f
	}
	r.mu.Lock()
	r.calls++
	r.mu.Unlock()
	done := make(chan error, 1)
	// settled is set by whichever comes first, the call's end or the
	// giving up on it, so that a call is one fault at most: a hung call
	// that panics later was reported already.
	var settled atomic.Bool
	go func() {
		returned := false
		defer func() {
			if returned {
				return
			}
			// recover is nil only for runtime.Goexit: panic(nil) panics
			// with a *runtime.PanicNilError.
			p := recover()
			if !settled.CompareAndSwap(false, true) {
				return
			}
			if p != nil {
				done <- fault(fmt.Sprintf("panicked: %v", p), false)
			} else {
				done <- fault("ended its goroutine (runtime.Goexit)", false)
			}
		}()
		err := call(ctx)
		returned = true
		settled.Store(true)
		done <- err
	}()
	bound := r.opTimeout + callGrace
	timer := time.NewTimer(bound)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		if !settled.CompareAndSwap(false, true) {
			return <-done // it ended just now, and sends at once
		}
		return fault(fmt.Sprintf("did not return within %v of its call (its ctx ended after %v)", bound, r.opTimeout), true)
	}
}

// history returns a copy of the calls recorded so far.
func (r *recorder) history() []op {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]op(nil), r.ops...)
}

// do runs one call and records it; fill sets the output from the call's
// results. It returns the op's index, or -1 for a call known not to have
// reached the store (dropped from the history: it changed nothing and
// answered nothing).
func (r *recorder) do(ctx context.Context, in input, now time.Time, call func(ctx context.Context) error, fill func(*output)) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	client := 0
	if t := traceFrom(ctx); t != nil {
		client = t.worker
	}
	callMono := time.Since(r.start).Nanoseconds()
	wallCall := time.Now().UnixNano()
	err := r.guarded(ctx, in, call)
	retMono := time.Since(r.start).Nanoseconds()
	wallRet := time.Now().UnixNano()

	var out output
	var ie *faultstore.InjectedError
	switch {
	case errors.As(err, &ie) && !ie.Applied:
		return -1, err
	case err == nil:
		fill(&out)
	case errors.Is(err, idempotency.ErrLeaseLost):
		out.err = errLeaseLost
	case errors.Is(err, idempotency.ErrNotFound):
		out.err = errNotFound
	default:
		out.unknown = true
		out.errText = err.Error()
	}
	if r.serverClock {
		in.nowLo = wallCall - int64(serverSkew)
		in.nowHi = wallRet + int64(serverSkew)
		if out.unknown {
			in.nowHi = math.MaxInt64
		}
	} else {
		in.nowLo, in.nowHi = now.UnixNano(), now.UnixNano()
	}
	o := op{in: in, out: out, call: callMono, ret: retMono, wallCall: wallCall, wallRet: wallRet, client: client}
	if out.unknown {
		o.ret = math.MaxInt64
	}
	r.mu.Lock()
	i := len(r.ops)
	r.ops = append(r.ops, o)
	r.mu.Unlock()
	return i, err
}

func (r *recorder) Begin(ctx context.Context, key, fp string, now time.Time, lease, retention time.Duration) (idempotency.Record, bool, error) {
	var rec idempotency.Record
	var ok bool
	i, err := r.do(ctx, input{kind: opBegin, key: key, fp: fp, lease: lease}, now, func(ctx context.Context) error {
		var err error
		rec, ok, err = r.inner.Begin(ctx, key, fp, now, lease, retention)
		return err
	}, func(o *output) {
		o.claimed, o.state, o.fp, o.token, o.body = ok, rec.State, rec.Fingerprint, rec.Token, string(rec.Response.Body)
		if !rec.LeaseUntil.IsZero() {
			o.leaseUntil = rec.LeaseUntil.UnixNano()
		}
	})
	if t := traceFrom(ctx); t != nil {
		t.mu.Lock()
		t.begun, t.beginErr, t.beginOp = true, err, i
		if err == nil && ok {
			t.claimed, t.token = true, rec.Token
		}
		t.mu.Unlock()
	}
	if abandoned(err) {
		// The call may still be writing rec and ok: neither is read.
		return idempotency.Record{}, false, err
	}
	return rec, ok, err
}

func (r *recorder) Complete(ctx context.Context, key string, token uint64, resp idempotency.Response, now time.Time, retention time.Duration) error {
	_, err := r.do(ctx, input{kind: opComplete, key: key, token: token, body: string(resp.Body)}, now, func(ctx context.Context) error {
		return r.inner.Complete(ctx, key, token, resp, now, retention)
	}, func(*output) {})
	if t := traceFrom(ctx); t != nil && errors.Is(err, idempotency.ErrLeaseLost) {
		t.mu.Lock()
		t.completeLost = true
		t.mu.Unlock()
	}
	return err
}

func (r *recorder) Extend(ctx context.Context, key string, token uint64, now time.Time, lease time.Duration) error {
	_, err := r.do(ctx, input{kind: opExtend, key: key, token: token, lease: lease}, now, func(ctx context.Context) error {
		return r.inner.Extend(ctx, key, token, now, lease)
	}, func(*output) {})
	return err
}

func (r *recorder) Release(ctx context.Context, key string, token uint64) error {
	_, err := r.do(ctx, input{kind: opRelease, key: key, token: token}, time.Now(), func(ctx context.Context) error {
		return r.inner.Release(ctx, key, token)
	}, func(*output) {})
	return err
}

func (r *recorder) Get(ctx context.Context, key string, now time.Time) (idempotency.Record, error) {
	var rec idempotency.Record
	_, err := r.do(ctx, input{kind: opGet, key: key}, now, func(ctx context.Context) error {
		var err error
		rec, err = r.inner.Get(ctx, key, now)
		return err
	}, func(o *output) {
		o.state, o.fp, o.token, o.body = rec.State, rec.Fingerprint, rec.Token, string(rec.Response.Body)
		if !rec.LeaseUntil.IsZero() {
			o.leaseUntil = rec.LeaseUntil.UnixNano()
		}
	})
	if abandoned(err) {
		return idempotency.Record{}, err // the call may still be writing rec
	}
	return rec, err
}

func (r *recorder) Delete(ctx context.Context, key string) error {
	_, err := r.do(ctx, input{kind: opDelete, key: key}, time.Now(), func(ctx context.Context) error {
		return r.inner.Delete(ctx, key)
	}, func(*output) {})
	return err
}

func (in input) String() string {
	switch in.kind {
	case opBegin:
		return fmt.Sprintf("Begin(fp=%s)", in.fp)
	case opComplete:
		return fmt.Sprintf("Complete(token=%d, %q)", in.token, in.body)
	case opExtend, opRelease:
		return fmt.Sprintf("%s(token=%d)", in.kind, in.token)
	}
	return in.kind.String() + "()"
}

func (o output) String() string {
	switch {
	case o.unknown:
		return "unknown: " + o.errText
	case o.err == errLeaseLost:
		return "ErrLeaseLost"
	case o.err == errNotFound:
		return "ErrNotFound"
	case o.state == "":
		return "ok"
	case o.state == idempotency.Done:
		return fmt.Sprintf("claimed=%v %s fp=%s token=%d %q", o.claimed, o.state, o.fp, o.token, o.body)
	}
	return fmt.Sprintf("claimed=%v %s fp=%s token=%d", o.claimed, o.state, o.fp, o.token)
}
