package idempotency

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/archlab/idempotency/internal/keepclaim"
)

// Outcome says what Guard.Do did with a call.
type Outcome string

const (
	// Executed: this call claimed the key and ran fn.
	Executed Outcome = "EXECUTED"
	// Replayed: a stored result was returned; fn did not run.
	Replayed Outcome = "REPLAYED"
	// InFlight: another holder owns the key; fn did not run (ErrInFlight).
	InFlight Outcome = "IN_FLIGHT"
	// Conflicted: the key belongs to another fingerprint (ErrConflict).
	Conflicted Outcome = "CONFLICT"
	// Unavailable: the store could not answer; fn did not run
	// (ErrUnavailable). The Guard fails closed.
	Unavailable Outcome = "UNAVAILABLE"
)

// Defaults for the zero values of Guard's fields.
const (
	DefaultLease     = 30 * time.Second
	DefaultRetention = 24 * time.Hour
)

// Guard runs a function at most once per key and fingerprint inside a
// retention window, and replays its stored result to every retry.
//
// A Guard holds all the policy; the Store only stores. A Guard is safe for
// concurrent use and must not be modified after its first use.
//
// Store must hold a store: a nil Store, or a nil pointer of a store's type
// (as left by a constructor whose error was ignored), is refused with
// ErrInvalidConfig by NewGuard and Validate, and fails every call of Do
// with Unavailable and an error wrapping ErrInvalidConfig, not a panic.
//
// The zero value of every field but Store is usable:
//   - Lease (0: DefaultLease) is how long a claim excludes other callers
//     while fn runs. The Guard renews it while fn runs, so fn may run longer
//     than Lease; Lease bounds how long a crashed holder blocks the key.
//   - Retention (0: DefaultRetention) is the dedup window: how long a
//     stored result is replayed. It must be at least Lease.
//   - Now (nil: time.Now) is the clock handed to the Store. With nil, a
//     MemoryStore Begin that answers without writing (a replay, a conflict,
//     in flight) is judged by a cheaper reading of the same clock (see
//     localClock); whatever is written is judged by time.Now.
//   - RenewEvery (0: Lease/3) is the renewal interval, shorter than nine
//     tenths of Lease; negative disables renewal (the seed's behaviour).
//   - OnRenew (nil: none) is called after every renewal attempt, with its
//     error, from the renewing goroutine; not for an attempt cut short
//     because fn returned.
//   - Timeout (0: none) bounds each run of fn through its ctx, counted
//     from its claim by the local clock: once it has passed, fn's ctx is
//     done with context.DeadlineExceeded (unless the caller's ctx or a lost
//     lease ended it first), and its Deadline says when. It stops only a
//     fn that heeds ctx: the lease is renewed for as long as fn runs, and
//     whatever fn then returns is handled as always: an error keeps the
//     claim until its lease ends (fn may have had effects before it
//     stopped) unless it is Retryable; a response is stored. It costs no
//     timer of its own: the renewal timer also keeps the timeout, without
//     moving a renewal, which makes it cheaper than a context.WithTimeout
//     inside fn.
type Guard struct {
	Store      Store
	Lease      time.Duration
	Retention  time.Duration
	Now        func() time.Time
	RenewEvery time.Duration
	OnRenew    func(key string, err error)
	Timeout    time.Duration
}

// Options configure NewGuard; nil means all defaults. The zero value of
// each field is documented on Guard's field of the same name.
type Options struct {
	Lease      time.Duration
	Retention  time.Duration
	Now        func() time.Time
	RenewEvery time.Duration
	OnRenew    func(key string, err error)
	Timeout    time.Duration
}

// NewGuard returns a Guard on store, with its options validated. A nil
// store, or a nil pointer of a store's type, is refused with
// ErrInvalidConfig.
func NewGuard(store Store, opts *Options) (*Guard, error) {
	if opts == nil {
		opts = &Options{}
	}
	g := &Guard{Store: store, Lease: opts.Lease, Retention: opts.Retention, Now: opts.Now,
		RenewEvery: opts.RenewEvery, OnRenew: opts.OnRenew, Timeout: opts.Timeout}
	if err := g.Validate(); err != nil {
		return nil, err
	}
	return g, nil
}

// Validate reports whether the Guard's fields can work, with an error
// wrapping ErrInvalidConfig if not. Do checks the same (a handful of
// comparisons, and a typed-nil Store when its Begin panics) so that a Guard
// literal fails closed.
func (g *Guard) Validate() error {
	if _, err := g.config(); err != nil {
		return err
	}
	return checkStore(g.Store)
}

// checkStore refuses a Store that holds a nil pointer (or another nil
// value of a type with methods): every call on it would panic. It uses
// reflect, so it runs where the Guard is built and, on Do's path, only once
// a Begin has panicked (see begin).
func checkStore(s Store) error {
	v := reflect.ValueOf(s)
	switch v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Func, reflect.Chan, reflect.Slice:
		if v.IsNil() {
			return fmt.Errorf("%w: Guard.Store is a nil %v (was the error of the store's constructor ignored?)", ErrInvalidConfig, v.Type())
		}
	}
	return nil
}

// defaultNote names, for an error about Lease and Retention, the one left
// at its default (the other was set): a Retention of 10s fails against the
// default Lease of 30s, which the caller may not have in mind.
func defaultNote(leaseDefault, retentionDefault bool) string {
	switch {
	case leaseDefault && !retentionDefault:
		return " (the default Lease, DefaultLease)"
	case retentionDefault && !leaseDefault:
		return " (the default Retention, DefaultRetention)"
	}
	return ""
}

// errNilFn is Do's answer to a nil fn, given before the key is claimed.
var errNilFn = fmt.Errorf("%w: Guard.Do or Run called with a nil fn", ErrInvalidConfig)

type config struct {
	lease, retention, renewEvery, timeout time.Duration
}

func (g *Guard) config() (config, error) {
	c := config{lease: g.Lease, retention: g.Retention, renewEvery: g.RenewEvery, timeout: g.Timeout}
	if g.Store == nil {
		return c, fmt.Errorf("%w: Guard.Store is nil", ErrInvalidConfig)
	}
	if c.lease == 0 {
		c.lease = DefaultLease
	}
	if c.retention == 0 {
		c.retention = DefaultRetention
	}
	if c.renewEvery == 0 {
		c.renewEvery = c.lease / 3
	}
	switch {
	case c.lease < 0:
		return c, fmt.Errorf("%w: Lease %v is negative", ErrInvalidConfig, c.lease)
	case c.renewEvery == 0:
		// Lease/3 rounded down to nothing: renewal would silently be off.
		return c, fmt.Errorf("%w: Lease %v is too short to be renewed (set RenewEvery negative to run without renewal)", ErrInvalidConfig, c.lease)
	case c.timeout < 0:
		return c, fmt.Errorf("%w: Timeout %v is negative", ErrInvalidConfig, c.timeout)
	case c.retention < c.lease:
		return c, fmt.Errorf("%w: Retention %v is shorter than Lease %v%s", ErrInvalidConfig, c.retention, c.lease, defaultNote(g.Lease == 0, g.Retention == 0))
	case c.renewEvery >= c.lease-c.lease/10:
		// fn is stopped nine tenths of a lease after its last renewal (see
		// leaseDeadline): a renewal due later would never be tried.
		return c, fmt.Errorf("%w: RenewEvery %v is not shorter than nine tenths of Lease %v", ErrInvalidConfig, c.renewEvery, c.lease)
	}
	return c, nil
}

func (g *Guard) now() time.Time {
	if g.Now != nil {
		return g.Now()
	}
	return time.Now()
}

// localClock reads time.Now cheaply for a Guard whose Now is nil, to answer
// a MemoryStore Begin that writes nothing (see beginResult): the reading is
// a.t.Add(d), or a.unix+d in Unix nanoseconds. It is read through the
// monotonic clock from an anchor that time.Now renews every anchorFor:
// time.Since reads one clock where time.Now reads two, which is a good part
// of a replay's cost. The reading drifts from time.Now by no more than the
// wall clock is slewed in anchorFor; after a suspend, during which the
// monotonic clock stops, it runs late for at most anchorFor of waking time.
// Late is the safe side only for reading: a lease looks longer, a window
// too. Written, it would be the unsafe side (a claim whose lease is already
// over by everyone else's clock, a result whose window ends early), so
// writes read time.Now. Inside a testing/synctest bubble time.Since is
// computed from the bubble's time.Now, so the reading is exactly that.
func localClock() (a *clockAnchor, d time.Duration) {
	if a = anchor.Load(); a != nil {
		if d = time.Since(a.t); d >= 0 && d < anchorFor {
			return a, d
		}
	}
	t := time.Now()
	a = &clockAnchor{t: t, unix: t.UnixNano()}
	anchor.Store(a)
	return a, 0
}

type clockAnchor struct {
	t    time.Time
	unix int64
}

const anchorFor = time.Second

var anchor atomic.Pointer[clockAnchor]

// Result is the full answer of Guard.Run.
type Result struct {
	Response Response
	Outcome  Outcome
	// Token is the fencing token of this call's claim (Executed only).
	Token uint64
	// LeaseUntil is when the current holder's lease ends (InFlight only).
	LeaseUntil time.Time
	// ExpiresAt is when the key leaves the dedup window (Executed with a
	// stored result, and Replayed).
	ExpiresAt time.Time
}

// Do runs fn at most once for key and fingerprint within the retention
// window. It returns fn's response and Executed, a stored response and
// Replayed, or an error with InFlight, Conflicted or Unavailable, in which
// cases fn did not run. A ctx that is done before fn starts (even while the
// store grants the claim) gives Unavailable with ctx's error: fn does not
// start, and a claim already made is released. So does a claim that Begin
// answers too late to be of use, nine tenths of the lease or more after it
// was sent (by then fn's ctx would have to end at once, and another holder
// may take the key over): the error wraps ErrUnavailable. If that Release
// fails, the error also wraps ErrNotReleased: the key stays in flight
// until its lease ends.
//
// While fn runs the Guard renews the lease. If a renewal is rejected
// (another holder took the key over), fn's ctx is cancelled, the result is
// not stored and Do returns an error wrapping ErrLeaseLost (and
// ErrNotStored if fn returned a response, fn's error if it failed). If
// renewals cannot reach the store, they are retried at shrinking intervals,
// and fn's ctx is cancelled a tenth of the lease before the last successful
// claim or renewal would let another holder take over; fn should stop its
// side effects then. Its result is stored only if its token is still current.
// fn's ctx is cancelled when fn returns, as a request's is when its HTTP
// handler returns: work left running with it is told to stop (use
// context.WithoutCancel for work that must go on).
//
// When fn returns an error, nothing is stored and the claim is kept until
// its lease ends, as after a crash: fn may have had side effects. Mark the
// error with Retryable to release the key at once instead (if the release
// fails, the error wraps ErrNotReleased too and is no longer Retryable). If
// fn panics, the key is released and the panic continues. If storing the
// result fails, Do returns fn's response, Executed and an error wrapping
// ErrNotStored and the store's error: the side effect happened but a retry
// may run fn again after the lease (fence it downstream with TokenFrom).
//
// So with Executed and an error, errors.Is tells what happened: with
// ErrNotStored, fn succeeded and its response is returned, but it was not
// stored; otherwise fn failed and the error is fn's, joined with one
// wrapping ErrNotReleased when a Retryable error's Release failed, or with
// one wrapping ErrLeaseLost when the claim was lost while fn ran. fn's
// error is returned as it is, so this holds only if fn's errors wrap none
// of these sentinels: the error of a Do called inside fn may.
//
// A nil fn is a programming error: Do returns Unavailable and an error
// wrapping ErrInvalidConfig (and ErrUnavailable, as for every invalid
// Guard) without touching the store, so the key is not claimed.
func (g *Guard) Do(ctx context.Context, key, fingerprint string, fn func(context.Context) (Response, error)) (Response, Outcome, error) {
	var r Result
	err := g.run(ctx, key, fingerprint, fn, &r)
	return r.Response, r.Outcome, err
}

// Run is Do with the full Result, for adapters that need the lease and the
// window (Retry-After, expiry headers).
func (g *Guard) Run(ctx context.Context, key, fingerprint string, fn func(context.Context) (Response, error)) (Result, error) {
	var r Result
	err := g.run(ctx, key, fingerprint, fn, &r)
	return r, err
}

// run is Run answering into res, which is zero: a Result is large, and
// Do would otherwise copy it on its way out of every call.
func (g *Guard) run(ctx context.Context, key, fingerprint string, fn func(context.Context) (Response, error), res *Result) error {
	cfg, err := g.config()
	if err == nil && fn == nil {
		err = errNilFn
	}
	if err != nil {
		res.Outcome = Unavailable
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if ms, ok := g.Store.(*MemoryStore); ok {
		if ms == nil {
			res.Outcome = Unavailable
			return fmt.Errorf("%w: %w", ErrUnavailable, checkStore(ms))
		}
		// The same answer as below, without a Record in between, and
		// without a time.Time unless fn runs. The fault hook runs before
		// the clock is read: with Now set, the lease runs from that reading
		// and fn's from the local clock after the claim, so a hook that
		// injects latency must not fall between them.
		if err := ms.fault(ctx, "begin"); err != nil {
			*res = Result{Outcome: Unavailable}
			return unavailable("begin", err)
		}
		var (
			now   time.Time
			n     int64
			local *time.Time // where a Begin that writes reads time.Now
		)
		if g.Now != nil {
			now = g.Now()
			n = now.UnixNano()
		} else {
			a, d := localClock()
			n = a.unix + int64(d)
			local = &now
		}
		claimed, err := ms.beginResult(key, fingerprint, n, local, cfg.lease, cfg.retention, res)
		switch {
		case err != nil:
			*res = Result{Outcome: Unavailable}
			return unavailable("begin", err)
		case claimed:
			if g.Now != nil {
				now = time.Now() // in process: as good as before the claim
			}
			return g.execute(ctx, cfg, key, res.Token, now, false, fn, res)
		case res.Outcome == Conflicted:
			return ErrConflict
		case res.Outcome == InFlight:
			return ErrInFlight
		}
		return nil
	}
	now := g.now()
	// The renewer times the lease by the local clock from when Begin was
	// sent, not from when it answered: the store's lease runs from now.
	sent := now
	if g.Now != nil {
		sent = time.Now()
	}
	rec, claimed, err := g.begin(ctx, key, fingerprint, now, cfg)
	if err != nil {
		res.Outcome = Unavailable
		return unavailable("begin", err)
	}
	if !claimed {
		switch rec.State {
		case Done:
			*res = Result{Response: rec.Response, Outcome: Replayed, ExpiresAt: rec.ExpiresAt}
			return nil
		case Conflict:
			res.Outcome = Conflicted
			return ErrConflict
		default:
			*res = Result{Outcome: InFlight, LeaseUntil: rec.LeaseUntil}
			return ErrInFlight
		}
	}
	return g.execute(ctx, cfg, key, rec.Token, sent, true, fn, res)
}

// begin is Store.Begin for a Guard that may be a literal on a typed-nil
// Store, which NewGuard and Validate refuse but Do cannot afford to check
// with reflect on every call: a Begin that panics is checked then, and the
// panic of a Store that is not nil goes on.
func (g *Guard) begin(ctx context.Context, key, fingerprint string, now time.Time, cfg config) (rec Record, claimed bool, err error) {
	defer func() {
		if p := recover(); p != nil {
			if cerr := checkStore(g.Store); cerr != nil {
				rec, claimed, err = Record{}, false, fmt.Errorf("%w: %w", ErrUnavailable, cerr)
				return
			}
			panic(p)
		}
	}()
	return g.Store.Begin(ctx, key, fingerprint, now, cfg.lease, cfg.retention)
}

// execute runs fn for the claim named by token, sent to the store at sent
// by the local clock (time.Now), and answers into res. remote says that
// sent was read before a Begin that may have taken a good part of the
// lease to answer; otherwise it was read as the claim was made.
func (g *Guard) execute(ctx context.Context, cfg config, key string, token uint64, sent time.Time, remote bool, fn func(context.Context) (Response, error), res *Result) error {
	err := ctx.Err()
	if err == nil && remote {
		if d := time.Since(sent); d >= cfg.lease-cfg.lease/10 {
			// Begin answered so late that fn's ctx would have to end at
			// once (see leaseDeadline): the store may let, or may have let,
			// another holder take the key over before fn could do anything.
			// Fail closed, as if Begin had not answered.
			err = fmt.Errorf("the claim was answered %v after it was sent, too late for a lease of %v", d, cfg.lease)
		}
	}
	if err != nil {
		// The caller went away while the claim was made (a shutdown, a
		// client that hung up), or the claim came too late: fn has not
		// started, so nothing happened, and the key is given back for the
		// retry.
		*res = Result{Outcome: Unavailable}
		if rerr := g.Store.Release(context.WithoutCancel(ctx), key, token); rerr != nil {
			return errors.Join(unavailable("begin", err), storeFailed(ErrNotReleased, rerr))
		}
		return unavailable("begin", err)
	}
	*res = Result{Outcome: Executed, Token: token}
	c := &claimCtx{Context: ctx, token: token}
	if cfg.timeout > 0 {
		c.deadline = sent.Add(cfg.timeout)
	}
	var r *renewer
	if cfg.renewEvery > 0 || cfg.timeout > 0 {
		// The renewer keeps its deadlines on the local clock.
		r = startRenewer(g, cfg, c, key, sent, remote)
	}
	// Writes after fn must not be cut short by the caller going away: the
	// side effect has happened and its result must be stored (or the key
	// released) regardless.
	wctx := ctx
	if ctx.Done() != nil {
		wctx = context.WithoutCancel(ctx)
	}
	finished := false
	defer func() {
		if finished {
			return
		}
		// fn panicked (or called runtime.Goexit): nothing is stored and the
		// key is given back so the retry does not wait for the lease,
		// unless fn asked for the claim to be kept (an adapter whose
		// handler announced its work done, see keepclaim): then it stays
		// until its lease ends, as after a crash. The panic goes on with
		// its original stack.
		if r != nil {
			r.stop()
		}
		c.finish()
		if !c.keep.IsSet() {
			_ = g.Store.Release(wctx, key, token)
		}
	}()
	resp, ferr := fn(c)
	finished = true
	res.Response = resp
	if r != nil {
		r.stop()
	}
	if c.finish() {
		if ferr != nil {
			// fn's own failure is kept: it may say more than the lease.
			// Not released, so not Retryable whatever fn said; and not
			// ErrNotStored, which says that fn succeeded.
			return errors.Join(fmt.Errorf("idempotency: claim lost while fn ran: %w", ErrLeaseLost), notRetryable{ferr})
		}
		return fmt.Errorf("%w: %w", ErrNotStored, ErrLeaseLost)
	}
	if ferr != nil {
		if IsRetryable(ferr) {
			if rerr := g.Store.Release(wctx, key, token); rerr != nil {
				// The claim stays (until its lease ends, or with another
				// holder): fn's error loses its mark, as after a lost lease.
				return errors.Join(notRetryable{ferr}, storeFailed(ErrNotReleased, rerr))
			}
		}
		return ferr
	}
	now := g.now()
	if err := g.Store.Complete(wctx, key, token, resp, now, cfg.retention); err != nil {
		return storeFailed(ErrNotStored, err)
	}
	res.ExpiresAt = now.Add(cfg.retention)
	return nil
}

// TokenFrom returns the fencing token of the claim whose fn is running with
// ctx (or a context derived from it). A downstream write made by fn should
// be conditional on it, so that a holder whose lease was taken over cannot
// overwrite the new holder's work:
//
//	UPDATE orders SET state = $1, fence = $2 WHERE id = $3 AND fence < $2
//
// Tokens strictly increase per key, so the latest holder always wins.
func TokenFrom(ctx context.Context) (uint64, bool) {
	c, ok := ctx.Value(claimKey{}).(*claimCtx)
	if !ok {
		return 0, false
	}
	return c.token, true
}

type claimKey struct{}

// claimCtx is the context fn runs with. It carries the fencing token and is
// cancelled when the lease is lost or fn returns. It is a single
// allocation: its done channel is made only if fn asks for Done, and the
// link to the parent's cancellation only if fn asks for Done or derives a
// context (AfterFunc), once per claim.
//
// Err and Done agree at every moment: Err returns nil while Done is open,
// so a parent's cancellation, which reaches Done through a goroutine of the
// context package, closes Done as soon as Err sees it.
type claimCtx struct {
	context.Context
	token    uint64
	deadline time.Time // Guard.Timeout's, by the local clock (zero: none)

	mu     sync.Mutex
	done   chan struct{}
	ended  bool           // the lease was lost or fn returned: c is done whatever its parent
	err    error          // the first non-nil Err, kept: Err must not change after
	proven bool           // the store said so (ErrLeaseLost), not just the clock
	keep   keepclaim.Flag // set: fn ends without returning, the claim stays (atomic, not mu's)
	stopFn func() bool    // unlinks from the parent's cancellation (see linkLocked)
	afters []*afterCall   // functions to run when c is done
}

// AfterFunc arranges for f to run, in its own goroutine, once c is done:
// when its parent is done, the lease is lost or fn returns. The context
// package looks for this method: with it, a context derived from c
// (WithCancel, WithTimeout, as an HTTP transport makes for every request)
// links to c without a goroutine of its own waiting on c.Done.
//
// c links to its parent once, for all of them (see linkLocked), and finish
// unlinks it: a link per function would stay with the parent whenever c
// ended first, since a derived context that c cancelled is not unlinked
// by its own cancel function.
func (c *claimCtx) AfterFunc(f func()) (stop func() bool) {
	a := &afterCall{f: f}
	perr := c.Context.Err()
	c.mu.Lock()
	if c.setErrLocked(perr); c.err != nil {
		// c is done: it ended, or its parent is done.
		c.mu.Unlock()
		a.run()
		return a.stop
	}
	if len(c.afters) == cap(c.afters) {
		// Before the slice grows, forget the functions whose contexts were
		// stopped: a long fn deriving one context per call holds only those
		// under way.
		c.afters = slices.DeleteFunc(c.afters, func(a *afterCall) bool { return a.state.Load() != 0 })
	}
	c.afters = append(c.afters, a)
	c.linkLocked()
	c.mu.Unlock()
	return a.stop
}

// afterCall runs f at most once, unless stopped first.
type afterCall struct {
	f     func()
	state atomic.Int32 // 0 pending, 1 started, 2 stopped
}

func (a *afterCall) run() {
	if a.state.CompareAndSwap(0, 1) {
		go a.f()
	}
}

func (a *afterCall) stop() bool { return a.state.CompareAndSwap(0, 2) }

func (c *claimCtx) Value(key any) any {
	switch key {
	case claimKey{}:
		return c
	case keepclaim.Key{}:
		return &c.keep
	}
	return c.Context.Value(key)
}

// Deadline is the earlier of the parent's and Guard.Timeout's.
func (c *claimCtx) Deadline() (time.Time, bool) {
	d, ok := c.Context.Deadline()
	if c.deadline.IsZero() || ok && d.Before(c.deadline) {
		return d, ok
	}
	return c.deadline, true
}

func (c *claimCtx) Done() <-chan struct{} {
	c.mu.Lock()
	d := c.done
	c.mu.Unlock()
	if d != nil {
		return d
	}
	// The parent is asked before c is locked, as everywhere: its methods
	// may take locks of their own.
	perr := c.Context.Err()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		// Closed at once if c has an error (it ended, or its parent is
		// done), not from a goroutine later: Err already says so.
		c.setErrLocked(perr)
		c.linkLocked()
	}
	return c.done
}

// linkLocked makes the parent's cancellation reach c (its done channel and
// its AfterFunc functions) unless it is linked already, c is done, or the
// parent is never done (a detached request: linking would cost two
// allocations for nothing). The link lasts until finish. c is locked; the
// parent runs parentDone in a goroutine of its own, so linking under c's
// lock cannot deadlock.
func (c *claimCtx) linkLocked() {
	if c.stopFn == nil && c.err == nil && c.Context.Done() != nil {
		c.stopFn = context.AfterFunc(c.Context, c.parentDone)
	}
}

// parentDone passes the parent's cancellation on to c.
func (c *claimCtx) parentDone() {
	perr := c.Context.Err()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setErrLocked(perr)
	c.runAftersLocked()
}

// setErrLocked makes err c's error unless it has one, and closes done if
// c has an error now. c is locked.
func (c *claimCtx) setErrLocked(err error) {
	if c.err == nil {
		c.err = err
	}
	if c.err != nil && c.done != nil {
		select {
		case <-c.done:
		default:
			close(c.done)
		}
	}
}

func (c *claimCtx) Err() error {
	perr := c.Context.Err()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setErrLocked(perr)
	return c.err
}

// endLocked ends c whatever its parent: c is locked, perr is the parent's
// Err read before (a parent done first stays the reason).
func (c *claimCtx) endLocked(perr error) {
	c.ended = true
	if perr == nil {
		perr = context.Canceled
	}
	c.setErrLocked(perr)
	c.runAftersLocked()
}

// runAftersLocked runs the AfterFunc functions, once c is done, and forgets
// them. c is locked.
func (c *claimCtx) runAftersLocked() {
	for _, a := range c.afters {
		a.run()
	}
	c.afters = nil
}

// loseLease cancels fn's context. proven is true when the store rejected a
// renewal, false when the lease ran out while the store could not be reached.
func (c *claimCtx) loseLease(proven bool) {
	perr := c.Context.Err()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.proven = c.proven || proven
	c.endLocked(perr)
}

// timeOut cancels fn's context when Guard.Timeout has passed.
func (c *claimCtx) timeOut() {
	perr := c.Context.Err()
	c.mu.Lock()
	defer c.mu.Unlock()
	if perr == nil {
		perr = context.DeadlineExceeded
	}
	c.endLocked(perr)
}

// finish ends c once fn has returned and renewals have stopped, as net/http
// ends a request's context when its handler returns: what fn left running
// with c (a goroutine, a derived context) is told to stop, and c no longer
// waits on its parent (a long-lived parent would otherwise hold every
// claim that ever asked for Done). It reports whether the store rejected a
// renewal; a lease that only ran out on the clock is not reported:
// Complete's token check decides.
func (c *claimCtx) finish() (leaseLost bool) {
	perr := c.Context.Err()
	c.mu.Lock()
	stop := c.stopFn
	c.stopFn = nil
	leaseLost = c.proven
	c.endLocked(perr)
	c.mu.Unlock()
	if stop != nil {
		stop()
	}
	return leaseLost
}

// renewer extends a claim's lease from a timer while fn runs, and keeps
// Guard.Timeout on the same timer. Renewers are pooled with their timer, so
// a call whose fn finishes before the first renewal costs no allocation for
// it. A renewal runs under mu, and stop takes mu, so no renewal for a claim
// is running once stop has returned: nothing outlives the call of Do.
//
// The timer wakes for whichever comes first, the next renewal or the
// timeout; a firing before the renewal is due (or a stale one) only re-arms
// it, so the timeout never moves a renewal. While a renewal waits on the
// store under mu, the timer is armed for the timeout, which that firing
// keeps without mu (see timeOutWhileRenewing): a slow store does not delay
// it.
//
// Timers made inside a testing/synctest bubble belong to it and abort the
// program if touched from outside, so inside a bubble a renewer is made
// fresh and never pooled. A bubble's time.Now carries no monotonic reading,
// which is how the renewer tells.
type renewer struct {
	t      *time.Timer
	pooled bool

	// cancelMu guards the cancel function of a renewal under way, so that
	// stop can cut it short instead of waiting for it under mu (a wait that
	// synctest cannot see as blocked, and that costs Do up to RenewEvery),
	// and the claim it renews with its timeout, kept meanwhile.
	cancelMu  sync.Mutex
	cancel    context.CancelFunc
	stopping  bool
	renewing  *claimCtx // the claim whose renewal is under way (nil: none)
	renewStop time.Time // its Guard.Timeout deadline (zero: none or passed)

	mu       sync.Mutex
	g        *Guard
	cfg      config
	c        *claimCtx
	key      string
	deadline time.Time // when fn must stop by the local clock unless renewed; see leaseDeadline
	next     time.Time // when the next renewal attempt is due (zero: none, renewal off or over)
	stopAt   time.Time // Guard.Timeout's deadline (zero: none, or passed and kept)
}

var renewers = sync.Pool{New: func() any { return newRenewer(true) }}

func newRenewer(pooled bool) *renewer {
	r := &renewer{pooled: pooled}
	r.t = time.AfterFunc(time.Hour, r.fire)
	r.t.Stop()
	return r
}

// startRenewer starts renewing c's claim, and keeping Guard.Timeout; now is
// the local clock's reading at the claim (time.Now). With renewal off
// (cfg.renewEvery < 0) it keeps only the timeout.
//
// The first renewal is due RenewEvery after now. When now may be well in
// the past (remote: read before a Begin that took its time to answer), the
// timer is armed for what is left of that, and fires at once if nothing
// is: armed for a whole RenewEvery from here, it would first look at the
// lease after the store had let another holder take it over.
func startRenewer(g *Guard, cfg config, c *claimCtx, key string, now time.Time, remote bool) *renewer {
	var r *renewer
	if now == now.Round(0) {
		r = newRenewer(false) // inside a synctest bubble
	} else {
		r = renewers.Get().(*renewer)
	}
	r.mu.Lock()
	r.g, r.cfg, r.c, r.key = g, cfg, c, key
	r.deadline = leaseDeadline(now, cfg.lease)
	r.next = time.Time{}
	wait := cfg.renewEvery
	if cfg.renewEvery > 0 {
		r.next = now.Add(cfg.renewEvery)
		if remote {
			wait = max(time.Until(r.next), 0)
		}
	}
	r.stopAt = c.deadline
	wait = r.due(wait)
	r.mu.Unlock()
	r.t.Reset(wait)
	return r
}

// due bounds a wait of d (d < 0: no renewal due) by the time left before
// the timeout. r is locked.
func (r *renewer) due(d time.Duration) time.Duration {
	if r.stopAt.IsZero() {
		return d
	}
	left := max(time.Until(r.stopAt), 0)
	if d < 0 || left < d {
		return left
	}
	return d
}

// schedule sets the next renewal attempt d from now and arms the timer for
// it, or for the timeout if that comes first. r is locked.
func (r *renewer) schedule(d time.Duration) {
	r.next = time.Now().Add(d)
	r.t.Reset(r.due(d))
}

// timeOutIfDue ends fn's ctx if Guard.Timeout has passed. r is locked.
func (r *renewer) timeOutIfDue() {
	if !r.stopAt.IsZero() && !time.Now().Before(r.stopAt) {
		// Renewals go on while fn winds down: its result is still stored
		// if it comes.
		r.c.timeOut()
		r.stopAt = time.Time{}
	}
}

// timeOutWhileRenewing reports whether a renewal is waiting on the store
// (holding mu); if so it ends fn's ctx should Guard.Timeout have passed,
// and leaves the timer to that renewal, which re-arms it when it ends.
func (r *renewer) timeOutWhileRenewing() bool {
	r.cancelMu.Lock()
	c, stopAt := r.renewing, r.renewStop
	r.cancelMu.Unlock()
	if c == nil {
		return false
	}
	if !stopAt.IsZero() && !time.Now().Before(stopAt) {
		c.timeOut()
	}
	return true
}

// stop is idempotent: the first call returns the renewer to the pool.
func (r *renewer) stop() {
	r.t.Stop()
	r.cancelMu.Lock()
	r.stopping = true
	if r.cancel != nil {
		r.cancel()
	}
	r.cancelMu.Unlock()
	r.mu.Lock()
	// Again under mu: a renewal that was under way may have armed it for
	// the timeout.
	r.t.Stop()
	active := r.c != nil
	r.g, r.c, r.key, r.next, r.stopAt = nil, nil, "", time.Time{}, time.Time{}
	r.mu.Unlock()
	r.cancelMu.Lock()
	r.stopping = false
	r.cancelMu.Unlock()
	if active && r.pooled {
		renewers.Put(r)
	}
}

// leaseDeadline is when a holder whose last successful claim or renewal was
// sent at sent must stop fn if no renewal succeeds: a tenth of the lease
// before the store lets another holder take over, so that fn's ctx ends
// before the takeover rather than at the same moment, with room for clocks
// that run a little apart.
func leaseDeadline(sent time.Time, lease time.Duration) time.Time {
	return sent.Add(lease - lease/10)
}

func (r *renewer) fire() {
	if r.timeOutWhileRenewing() {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.c == nil {
		return // a stale firing after stop
	}
	g, c, cfg := r.g, r.c, r.cfg
	r.timeOutIfDue()
	if r.next.IsZero() {
		// Renewal is off, or over for this claim (its lease is lost): only
		// the timeout may be left to keep.
		if !r.stopAt.IsZero() {
			r.t.Reset(r.due(-1))
		}
		return
	}
	if wait := time.Until(r.next); wait > 0 {
		// Woken for the timeout, or by a stale firing, before the renewal
		// is due.
		r.t.Reset(r.due(wait))
		return
	}
	left := time.Until(r.deadline)
	if left <= 0 {
		// The lease has run out by the local clock without a renewal:
		// another holder may take over from now on, so fn must stop now,
		// not after one more attempt. Whether its result may still be
		// stored is decided by Complete's token check.
		c.loseLease(false)
		r.next, r.stopAt = time.Time{}, time.Time{}
		return
	}
	// An attempt never outlasts the lease it tries to save.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Context), min(cfg.renewEvery, left))
	r.cancelMu.Lock()
	if r.stopping {
		r.cancelMu.Unlock()
		cancel()
		return
	}
	r.cancel = cancel
	r.renewing, r.renewStop = c, r.stopAt
	r.cancelMu.Unlock()
	if !r.stopAt.IsZero() {
		// The timeout is kept while the store takes its time to answer.
		r.t.Reset(r.due(-1))
	}
	local := time.Now()
	at := local
	if g.Now != nil {
		at = g.Now()
	}
	err := g.Store.Extend(ctx, r.key, c.token, at, cfg.lease)
	r.cancelMu.Lock()
	r.cancel = nil
	stopping := r.stopping
	r.cancelMu.Unlock()
	cancel()
	if !stopping && g.OnRenew != nil {
		g.OnRenew(r.key, err) // still kept from the timer: it may be slow
	}
	r.cancelMu.Lock()
	r.renewing, r.renewStop = nil, time.Time{}
	r.cancelMu.Unlock()
	if stopping {
		return // fn has returned; this renewal no longer matters
	}
	r.timeOutIfDue()
	switch {
	case err == nil:
		r.deadline = leaseDeadline(local, cfg.lease)
		r.schedule(cfg.renewEvery)
	case errors.Is(err, ErrLeaseLost):
		c.loseLease(true)
		r.next, r.stopAt = time.Time{}, time.Time{}
	default:
		// Try again sooner, halving the time left each time, so that a
		// short outage is bridged before the deadline; when the halves get
		// small, wait for the deadline itself (then the check at the top
		// stops fn).
		left := time.Until(r.deadline)
		next := min(cfg.renewEvery, left/2)
		if next < cfg.renewEvery/8 {
			next = max(0, left)
		}
		r.schedule(next)
	}
}
