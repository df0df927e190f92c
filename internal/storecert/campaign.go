package storecert

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/verdict"
)

// The campaign's checks.
const (
	checkFailClosed = "campaign: fail closed (fn runs only on a successful claim)"
	checkNoDouble   = "campaign: no double execution inside the lease"
	checkReplay     = "campaign: a replay is the stored result"
	checkLinearHist = "campaign: history linearizable"
	// checkCallsReturn: every store call of the campaign returned, without
	// a panic and within the recorder's bound (opTimeout+callGrace).
	checkCallsReturn = "campaign: every store call returns (no panic, no hang)"
	keysPerRound     = 3
	// roundLength is how long workers stay on one set of fresh keys; half
	// of the calls go to the keys of the ten rounds before, where
	// claims left behind by failed fns are taken over.
	roundLength      = 100 * time.Millisecond
	campaignLease    = 600 * time.Millisecond
	campaignOpTimout = 400 * time.Millisecond
	// historyKeyTimeout bounds the linearizability check of one key.
	historyKeyTimeout = 2 * time.Second
)

// phase is one stretch of the campaign: faults on (or healed) and a fresh
// set of keys.
type phase struct {
	name  string
	apply func() error
}

// execution is one run of fn.
type execution struct {
	key    string
	token  uint64
	worker int
	// beginOp is the index in the history of the Begin that claimed.
	beginOp int
	// stored: Do returned Executed without error, at doReturn (local wall
	// clock, Unix nanoseconds): the result was stored by then.
	stored   bool
	doReturn int64
}

type campaign struct {
	opts  Options
	runID string
	rec   *recorder
	guard *idempotency.Guard
	// stale is guard without lease renewal, for holders that outlive
	// their lease, are taken over and then complete with a stale token.
	stale  *idempotency.Guard
	rep    *verdict.Report
	lease  time.Duration
	phases []phase
	heal   func() error
	// historyDeadline is when the linearizability check stops deciding
	// keys (zero: historyBudget after it starts).
	historyDeadline time.Time

	start time.Time

	// helpers are the successors started by stale holders.
	helpers sync.WaitGroup

	mu    sync.Mutex
	execs map[string][]*execution // by key, in order of fn's start
	// outcomes counts Do's answers, for the progress line.
	outcomes map[string]int
}

func (c *campaign) keyOf(round, i int) string {
	return fmt.Sprintf("storecert:%s:campaign:r%d:k%d", c.runID, round, i)
}

// run drives the workers through the phases for opts.Duration, then checks
// what they saw.
func (c *campaign) run(ctx context.Context) {
	c.execs = map[string][]*execution{}
	c.outcomes = map[string]int{}
	c.rep.Declare(checkFailClosed, checkNoDouble, checkReplay, checkLinearHist, checkCallsReturn)
	ctx, cancel := context.WithTimeout(ctx, c.opts.Duration)
	defer cancel()
	c.start = time.Now()

	var wg sync.WaitGroup
	for w := range c.opts.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.worker(ctx, w)
		}()
	}
	// Phases alternate, healthy first and last, and last long enough for
	// leases to run out under a fault.
	n := max(3, int(c.opts.Duration/time.Second)) | 1
	per := c.opts.Duration / time.Duration(n)
	rng := rand.New(rand.NewPCG(uint64(c.opts.Seed), 0xfa))
	order := rng.Perm(len(c.phases))
	for i := range n {
		name := "healthy"
		var err error
		if i%2 == 1 && len(c.phases) > 0 {
			p := c.phases[order[(i/2)%len(order)]]
			name = p.name
			err = p.apply()
		} else if c.heal != nil {
			err = c.heal()
		}
		c.progress("campaign: phase %d/%d: %s", i+1, n, name)
		if err != nil {
			c.progress("campaign: phase %s: %v", name, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(per):
		}
	}
	cancel()
	wg.Wait()
	c.helpers.Wait()
	if c.heal != nil {
		if err := c.heal(); err != nil {
			c.progress("campaign: heal: %v", err)
		}
	}
	c.mu.Lock()
	c.progress("campaign: outcomes %v", c.outcomes)
	c.mu.Unlock()
	c.checkCalls()
	c.checkExecutions()
	c.checkLinearizable()
}

// checkCalls fails checkCallsReturn once for each store call that
// panicked or did not return, naming the method and the panic; each other
// call holds it.
func (c *campaign) checkCalls() {
	calls, faults := c.rec.callStats()
	for _, f := range faults {
		c.rep.Fail(checkCallsReturn, "%v", f)
	}
	for range calls - len(faults) {
		c.rep.Pass(checkCallsReturn)
	}
	if len(faults) > 0 {
		c.progress("campaign: %d of %d store calls did not return normally, e.g. %v", len(faults), calls, faults[0])
	}
}

func (c *campaign) progress(format string, args ...any) {
	if c.opts.Progress != nil {
		fmt.Fprintf(c.opts.Progress, "storecert: "+format+"\n", args...)
	}
}

func (c *campaign) worker(ctx context.Context, w int) {
	rng := rand.New(rand.NewPCG(uint64(c.opts.Seed), uint64(w)+1))
	for ctx.Err() == nil {
		round := int(time.Since(c.start) / roundLength)
		if back := min(round, 10); back > 0 && rng.IntN(2) == 0 {
			round -= 1 + rng.IntN(back)
		}
		key := c.keyOf(round, rng.IntN(keysPerRound))
		fp := "fp"
		if rng.IntN(25) == 0 {
			fp = "fp-other"
		}
		mode := rng.IntN(100)
		pause := time.Duration(rng.IntN(3)) * time.Millisecond
		c.one(ctx, w, key, fp, mode)
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
	}
}

var errAfterEffect = errors.New("storecert: fn failed after its side effect")

// modeStale: calls whose mode (0-99) is below it run on the stale Guard;
// modeSuccessor is the mode of the call that takes their key over: longer
// than the lease, renewed.
const (
	modeStale     = 16
	modeSuccessor = 25
)

// one runs one Guard.Do and checks what the Guard did with it.
func (c *campaign) one(ctx context.Context, w int, key, fp string, mode int) {
	tr := &doTrace{worker: w}
	dctx := context.WithValue(ctx, traceKey{}, tr)
	var ex *execution
	fn := func(fctx context.Context) (idempotency.Response, error) {
		tok, _ := idempotency.TokenFrom(fctx)
		tr.mu.Lock()
		ok := tr.begun && tr.beginErr == nil && tr.claimed && tr.token == tok
		beginOp := tr.beginOp
		tr.mu.Unlock()
		c.rep.Check(checkFailClosed, ok, "key %s: fn ran with token %d without a successful claim of it by this call's Begin", key, tok)
		ex = &execution{key: key, token: tok, worker: w, beginOp: beginOp}
		c.mu.Lock()
		c.execs[key] = append(c.execs[key], ex)
		c.mu.Unlock()
		switch {
		case mode < modeStale:
			// Unrenewed (the stale Guard) and longer than the lease: once
			// the lease has run out a successor takes the key over, and
			// this holder completes while the successor still runs. Its
			// Complete must be fenced off.
			time.Sleep(c.lease + c.lease/6)
			c.helpers.Add(1)
			go func() {
				defer c.helpers.Done()
				c.one(ctx, w+c.opts.Concurrency, key, fp, modeSuccessor)
			}()
			time.Sleep(c.lease / 3)
		case mode < 20:
			// Longer than the lease, and deaf to its loss: a holder that
			// goes on after a takeover, whose Complete must be fenced off.
			time.Sleep(2 * c.lease)
		case mode < 28: // longer than the lease: the Guard must renew it
			select {
			case <-fctx.Done():
			case <-time.After(c.lease + c.lease/3):
			}
		case mode < 38:
			return idempotency.Response{}, errAfterEffect // the claim stays until its lease ends
		case mode < 46:
			return idempotency.Response{}, idempotency.Retryable(errors.New("refused")) // released
		default:
			time.Sleep(time.Duration(mode%4) * time.Millisecond)
		}
		return idempotency.Response{Status: 200, Body: []byte(key + "#" + strconv.FormatUint(tok, 10))}, nil
	}
	g := c.guard
	if mode < modeStale && c.stale != nil {
		g = c.stale
	}
	resp, out, err := g.Do(dctx, key, fp, fn)
	done := time.Now().UnixNano()
	tr.mu.Lock()
	beginErr, completeLost, token := tr.beginErr, tr.completeLost, tr.token
	tr.mu.Unlock()
	if completeLost {
		c.probeStale(ctx, w, key, token)
	}
	if beginErr != nil {
		c.rep.Check(checkFailClosed, ex == nil, "key %s: fn ran although Begin failed: %v", key, beginErr)
	}
	if ex != nil && out == idempotency.Executed && err == nil {
		c.mu.Lock()
		ex.stored, ex.doReturn = true, done
		c.mu.Unlock()
	}
	if out == idempotency.Replayed {
		c.checkReplay(key, resp)
	}
	name := string(out)
	if err != nil && out == idempotency.Executed {
		name += "+error"
	}
	c.mu.Lock()
	c.outcomes[name]++
	c.mu.Unlock()
}

// probeStale renews, then releases, a claim whose Complete the store has
// just refused with ErrLeaseLost: both must be refused too, and change
// nothing (the history check judges them). The Guard never sends these
// after a lost Complete, and its holders renew only while their lease
// lives, so without the probe a store that let a stale holder renew, or
// release (wiping its successor's claim), would pass the campaign.
func (c *campaign) probeStale(ctx context.Context, w int, key string, token uint64) {
	// Not cut short by the campaign's end: the recorder bounds each call.
	pctx := context.WithValue(context.WithoutCancel(ctx), traceKey{}, &doTrace{worker: w})
	_ = c.rec.Extend(pctx, key, token, time.Now(), c.lease)
	_ = c.rec.Release(pctx, key, token)
}

// checkReplay checks that a replayed response is one that an execution of
// key produced.
func (c *campaign) checkReplay(key string, resp idempotency.Response) {
	body := string(resp.Body)
	tokText, ok := strings.CutPrefix(body, key+"#")
	tok, err := strconv.ParseUint(tokText, 10, 64)
	found := false
	if ok && err == nil && resp.Status == 200 {
		c.mu.Lock()
		for _, e := range c.execs[key] {
			found = found || e.token == tok
		}
		c.mu.Unlock()
	}
	c.rep.Check(checkReplay, found, "key %s: replayed status %d body %q, which no execution of the key produced", key, resp.Status, body)
}

// checkExecutions checks each execution against the ones of its key before
// it: none may follow a stored result, and none may start while the
// previous holder's lease was certainly live (its last successful claim or
// renewal, plus the lease, is after the new claim) unless that holder had
// released the key.
func (c *campaign) checkExecutions() {
	hist := c.rec.history()
	c.mu.Lock()
	defer c.mu.Unlock()
	for key, execs := range c.execs {
		for i, e2 := range execs {
			if e2.beginOp < 0 || e2.beginOp >= len(hist) {
				c.rep.Fail(checkNoDouble, "key %s: execution with token %d has no recorded claim", key, e2.token)
				continue
			}
			claim := hist[e2.beginOp]
			ok := true
			for _, e1 := range execs[:i] {
				if e1.stored && e1.doReturn < claim.wallCall {
					ok = false
					c.rep.Fail(checkNoDouble, "key %s: token %d ran although the result of token %d was stored %v before its Begin",
						key, e2.token, e1.token, time.Duration(claim.wallCall-e1.doReturn))
				}
			}
			if i > 0 && ok {
				e1 := execs[i-1]
				if held, until := c.leaseHeld(hist, key, e1, claim); held {
					ok = false
					c.rep.Fail(checkNoDouble, "key %s: token %d was claimed (clock ≤ %s) while token %d still held its lease until at least %s and had not released it",
						key, e2.token, time.Unix(0, claim.in.nowHi).Format(time.StampMicro), e1.token, time.Unix(0, until).Format(time.StampMicro))
				}
			}
			if ok {
				c.rep.Pass(checkNoDouble)
			}
		}
	}
}

// leaseHeld reports whether e1's lease was certainly live when claim (a
// later Begin of key) took effect, and until when.
func (c *campaign) leaseHeld(hist []op, key string, e1 *execution, claim op) (bool, int64) {
	if e1.beginOp < 0 || e1.beginOp >= len(hist) {
		return false, 0
	}
	from := hist[e1.beginOp].in.nowLo
	for _, o := range hist {
		if o.in.key != key || o.in.token != e1.token || o.wallCall > claim.wallRet {
			continue
		}
		switch {
		case o.in.kind == opRelease:
			return false, 0 // given back (or maybe: we cannot tell)
		case o.in.kind == opExtend && !o.out.unknown && o.out.err == errNone && o.wallRet < claim.wallCall:
			from = max(from, o.in.nowLo)
		}
	}
	until := addSat(from, c.lease) - tolerance
	return claim.in.nowHi < until, until
}

func (c *campaign) checkLinearizable() {
	hist := c.rec.history()
	deadline := c.historyDeadline
	if deadline.IsZero() {
		deadline = time.Now().Add(c.historyBudget())
	}
	results := checkHistory(hist, historyKeyTimeout, deadline, c.opts.Visualize)
	var unknown int
	for _, r := range results {
		switch r.result {
		case porcupine.Ok:
			c.rep.Pass(checkLinearHist)
		case porcupine.Illegal:
			where := "porcupine's visualization: " + r.viz
			switch {
			case r.vizErr != nil:
				where = fmt.Sprintf("porcupine's visualization could not be written: %v", r.vizErr)
			case r.viz == "":
				where = "no visualization asked for (idemcheck -visualize DIR draws one)"
			}
			c.rep.Fail(checkLinearHist, "key %s: its %d operations are not linearizable against the Store contract; %s", r.key, r.ops, where)
		default:
			// Not decided is not verified: an illegal history can take
			// the search longer than a legal one.
			unknown++
			c.rep.Fail(checkLinearHist, "key %s: its %d operations were not decided within the time limit (%v a key, %v in all), "+
				"so they are not verified; a shorter campaign or fewer workers make smaller histories",
				r.key, r.ops, historyKeyTimeout, c.historyBudget())
		}
	}
	c.progress("campaign: %d operations on %d keys checked for linearizability (%d undecided within the time limit)", len(hist), len(results), unknown)
}

// historyBudget is how long the linearizability check may take in all.
func (c *campaign) historyBudget() time.Duration { return max(10*time.Second, c.opts.Duration) }
