// Package demo is idemcheck's self-contained campaign: the seed's ledger
// served as an HTTP orders API behind idemhttp, in a child process that the
// campaign pauses (its store), kills with SIGKILL and restarts, while
// clients retry with seeded jitter, send concurrent duplicates, drop
// responses on the floor and outlast the lease. At the end the ledger, a
// bbolt file the server keeps apart from the idempotency store, is counted.
package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/archlab/idempotency/idemhttp"
	"github.com/archlab/idempotency/internal/verdict"
)

// The checks of the demo, as they appear in the report.
const (
	CheckCharged     = "each key charged at most once"
	CheckRuns        = "one execution per key per server lifetime"
	CheckStock       = "stock consistent with reservations"
	CheckReplay      = "every replay equal to the first answer"
	CheckInFlight    = "409 while the key is in flight"
	CheckConflict    = "422 for the same key with another payload"
	CheckMalformed   = "400 for malformed keys, nothing charged"
	CheckFailClosed  = "fail closed while the store is down (503, no charge)"
	CheckSlow        = "handler slower than the lease runs once"
	CheckLost        = "lost response: the retry does not run again"
	CheckAcked       = "every acknowledged order in the ledger after SIGKILL+restart"
	CheckAnswered    = "every order answered within its retries"
	checkServerStart = "server restarted after SIGKILL"
)

// Checks lists the demo's checks in report order.
var Checks = []string{CheckCharged, CheckRuns, CheckStock, CheckReplay, CheckInFlight, CheckConflict,
	CheckMalformed, CheckFailClosed, CheckSlow, CheckLost, CheckAcked, CheckAnswered}

// Lease is the server's lease: short, so that slow handlers outlast it.
const Lease = time.Second

// Options configure Run.
type Options struct {
	// Seed drives every random choice of the clients.
	Seed int64
	// Duration is how long clients send new orders (0: 20s). Verification
	// and shutdown add a few seconds.
	Duration time.Duration
	// Concurrency is the number of client workers (0: 8).
	Concurrency int
	// StoreURL is the server's idempotency store (see internal/storeurl;
	// "": a bbolt file in Dir).
	StoreURL string
	// Dir holds the ledger (and the default store); "": a temporary
	// directory removed at the end.
	Dir string
	// Command is the argv that starts the server: a program that runs
	// Serve for its arguments (nil: this executable with ServeCommand).
	Command []string
	// Unsafe starts the server without the idempotency middleware: a
	// broken server the campaign must catch.
	Unsafe bool
	// ServerLog receives the server's log (nil: discarded).
	ServerLog io.Writer
	// Progress, if set, is called a few times a second.
	Progress func(Progress)
	// Log, if set, is told of the campaign's events (pause, kill, restart).
	Log func(format string, args ...any)
}

// Progress is a snapshot of a running campaign.
type Progress struct {
	Phase            string
	Elapsed, Total   time.Duration
	Orders, Requests int64
	Retries          int64
	Epoch            int
}

type answer struct {
	status   int
	body     []byte
	replayed bool
	inFlight bool
}

type keyState struct {
	kind    string
	body    []byte
	first   *answer
	crossed bool // the server was restarted while the order was under way
	// lostSent: the request was written on a connection closed at once.
	lostSent bool
}

type campaign struct {
	opts   Options
	rep    *verdict.Report
	runID  string
	ledger string
	client *http.Client

	api   atomic.Pointer[string]
	ctl   atomic.Pointer[string]
	epoch atomic.Int64
	phase atomic.Pointer[string]

	srvMu sync.Mutex
	srv   *child

	// gate quiesces the workers: each order holds it shared, the pause
	// takes it exclusively.
	gate sync.RWMutex

	mu        sync.Mutex
	keys      map[string]*keyState
	markers   []string // malformed keys' unique parts
	pausedNew []string // fresh keys sent while the store was paused

	seq                       atomic.Int64
	orders, requests, retries atomic.Int64
}

// Run runs the campaign and records its checks in rep. It returns an error
// only when the campaign itself could not run (the server did not start);
// violated properties are in rep.
func Run(ctx context.Context, opts Options, rep *verdict.Report) error {
	if opts.Duration <= 0 {
		opts.Duration = 20 * time.Second
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = 8
	}
	if opts.Dir == "" {
		dir, err := os.MkdirTemp("", "idemcheck-demo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		opts.Dir = dir
	}
	if opts.StoreURL == "" {
		opts.StoreURL = "bolt:" + filepath.Join(opts.Dir, "idempotency.db")
	}
	if opts.Command == nil {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		opts.Command = []string{exe, ServeCommand}
	}
	rng := rand.New(rand.NewPCG(uint64(opts.Seed), 0x1de))
	c := &campaign{
		opts: opts,
		rep:  rep,
		// Keys are unique to the run, not to the seed: a shared store may
		// hold an earlier run's keys (with the same seed) for its window.
		runID:  fmt.Sprintf("r%08x", rng.Uint32()^rand.Uint32()^uint32(time.Now().UnixNano())),
		ledger: filepath.Join(opts.Dir, "ledger.db"),
		keys:   map[string]*keyState{},
		client: &http.Client{
			Timeout:   15 * time.Second,
			Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true},
		},
	}
	defer c.client.CloseIdleConnections()
	rep.Declare(Checks...)
	c.setPhase("starting server")
	if err := c.startServer(); err != nil {
		return err
	}
	defer func() {
		c.srvMu.Lock()
		if c.srv != nil {
			c.srv.kill()
		}
		c.srvMu.Unlock()
	}()

	start := time.Now()
	stopProgress := c.reportProgress(start)
	defer stopProgress()

	end := start.Add(opts.Duration)
	var wg sync.WaitGroup
	for w := range opts.Concurrency {
		wrng := rand.New(rand.NewPCG(uint64(opts.Seed), uint64(w)+1))
		wg.Go(func() { c.worker(ctx, wrng, w, end) })
	}
	c.setPhase("orders")
	var events sync.WaitGroup
	events.Go(func() {
		if sleepCtx(ctx, time.Until(start.Add(opts.Duration*3/10))) {
			c.pauseStore(ctx, rand.New(rand.NewPCG(uint64(opts.Seed), 0x9a05e)))
		}
		if sleepCtx(ctx, time.Until(start.Add(opts.Duration*6/10))) {
			c.killAndRestart(ctx)
		}
	})
	events.Wait()
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}

	c.setPhase("verifying replays")
	c.verifyReplays(ctx)

	c.setPhase("stopping server")
	c.srvMu.Lock()
	srv := c.srv
	c.srv = nil
	c.srvMu.Unlock()
	if err := srv.stop(15 * time.Second); err != nil {
		return fmt.Errorf("stop server: %w", err)
	}
	c.setPhase("counting the ledger")
	st, err := readLedger(c.ledger)
	if err != nil {
		return err
	}
	c.verifyLedger(st)
	c.setPhase("done")
	return nil
}

func (c *campaign) setPhase(p string) { c.phase.Store(&p) }

func (c *campaign) logf(format string, args ...any) {
	if c.opts.Log != nil {
		c.opts.Log(format, args...)
	}
}

func (c *campaign) reportProgress(start time.Time) func() {
	if c.opts.Progress == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	snap := func() Progress {
		return Progress{Phase: *c.phase.Load(), Elapsed: time.Since(start), Total: c.opts.Duration,
			Orders: c.orders.Load(), Requests: c.requests.Load(), Retries: c.retries.Load(), Epoch: int(c.epoch.Load())}
	}
	wg.Go(func() {
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				c.opts.Progress(snap())
				return
			case <-t.C:
				c.opts.Progress(snap())
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

func (c *campaign) startServer() error {
	argv := append([]string{}, c.opts.Command...)
	argv = append(argv, "-store", c.opts.StoreURL, "-ledger", c.ledger, "-lease", Lease.String())
	if c.opts.Unsafe {
		argv = append(argv, "-unsafe")
	}
	srv, err := startChild(argv, c.opts.ServerLog)
	if err != nil {
		return err
	}
	c.srvMu.Lock()
	c.srv = srv
	c.srvMu.Unlock()
	c.api.Store(&srv.api)
	c.ctl.Store(&srv.ctl)
	c.epoch.Store(int64(srv.epoch))
	return nil
}

// worker sends orders until end. Its first order's kind is fixed by w so
// that every kind runs even in a short campaign.
func (c *campaign) worker(ctx context.Context, rng *rand.Rand, w int, end time.Time) {
	kinds := []func(context.Context, *rand.Rand){c.slowOrder, c.duplicates, c.lostResponse, c.conflict, c.malformed, c.normal}
	for i := 0; time.Now().Before(end) && ctx.Err() == nil; i++ {
		var kind func(context.Context, *rand.Rand)
		switch p := rng.IntN(100); {
		case i == 0:
			kind = kinds[w%len(kinds)]
		case p < 40:
			kind = c.normal
		case p < 60:
			kind = c.duplicates
		case p < 72:
			kind = c.lostResponse
		case p < 80:
			kind = c.slowOrder
		case p < 92:
			kind = c.conflict
		default:
			kind = c.malformed
		}
		c.gate.RLock()
		kind(ctx, rng)
		c.gate.RUnlock()
		c.orders.Add(1)
	}
}

func (c *campaign) newKey(kind string, rng *rand.Rand, delay int) (string, *keyState) {
	key := fmt.Sprintf("%s-%s%d", c.runID, kind[:1], c.seq.Add(1))
	body, _ := json.Marshal(order{SKU: fmt.Sprintf("sku-%d", rng.IntN(5)), Qty: 1 + rng.IntN(3),
		Cents: 100 * (1 + rng.IntN(50)), DelayMS: delay})
	ks := &keyState{kind: kind, body: body}
	c.mu.Lock()
	c.keys[key] = ks
	c.mu.Unlock()
	return key, ks
}

// post sends one attempt.
func (c *campaign) post(ctx context.Context, keys []string, body []byte) (answer, error) {
	c.requests.Add(1)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+*c.api.Load()+"/orders", bytes.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header["Idempotency-Key"] = keys
	resp, err := c.client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	return answer{
		status:   resp.StatusCode,
		body:     b,
		replayed: resp.Header.Get(idemhttp.ReplayedHeader) == "true",
		inFlight: resp.StatusCode == http.StatusConflict && bytes.Contains(b, []byte(idemhttp.ProblemInFlight.Type)),
	}, nil
}

// settle sends until it gets a final answer: anything but a network error,
// a 5xx or 409 in-flight. Retries wait a seeded, jittered, growing delay.
func (c *campaign) settle(ctx context.Context, rng *rand.Rand, keys []string, body []byte) (answer, bool) {
	deadline := time.Now().Add(30 * time.Second)
	for attempt := 0; ; attempt++ {
		a, err := c.post(ctx, keys, body)
		if err == nil && a.status < 500 && !a.inFlight {
			return a, true
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return a, false
		}
		c.retries.Add(1)
		base := min(20*time.Millisecond<<min(attempt, 5), 400*time.Millisecond)
		sleepCtx(ctx, 10*time.Millisecond+time.Duration(rng.Int64N(int64(base))))
	}
}

// settleKey settles an order of ks and records the answer.
func (c *campaign) settleKey(ctx context.Context, rng *rand.Rand, key string, ks *keyState) (answer, bool) {
	epoch := c.epoch.Load()
	a, ok := c.settle(ctx, rng, []string{key}, ks.body)
	if c.epoch.Load() != epoch {
		c.mu.Lock()
		ks.crossed = true
		c.mu.Unlock()
	}
	if !c.rep.Check(CheckAnswered, ok && a.status == http.StatusCreated, "key %s: last answer %d %q", key, a.status, a.body) {
		return a, false
	}
	c.record(key, ks, a)
	return a, true
}

// record compares a 2xx answer with the key's first one.
func (c *campaign) record(key string, ks *keyState, a answer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ks.first == nil {
		ks.first = &a
		return
	}
	f := ks.first
	c.rep.Check(CheckReplay, a.status == f.status && bytes.Equal(a.body, f.body),
		"key %s: first answer %d %q, later %d %q", key, f.status, f.body, a.status, a.body)
}

func (c *campaign) normal(ctx context.Context, rng *rand.Rand) {
	key, ks := c.newKey("normal", rng, 0)
	if _, ok := c.settleKey(ctx, rng, key, ks); ok {
		c.settleKey(ctx, rng, key, ks) // a retry after the answer arrived
	}
}

// duplicates sends 3 to 5 identical requests at once, each retrying.
func (c *campaign) duplicates(ctx context.Context, rng *rand.Rand) {
	key, ks := c.newKey("dup", rng, 0)
	n := 3 + rng.IntN(3)
	var wg sync.WaitGroup
	for range n {
		r := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
		wg.Go(func() { c.settleKey(ctx, r, key, ks) })
	}
	wg.Wait()
}

// lostResponse sends the request on a raw connection and closes it at once,
// as a client whose response is lost; then it retries, which must replay.
func (c *campaign) lostResponse(ctx context.Context, rng *rand.Rand) {
	key, ks := c.newKey("lost", rng, 0)
	epoch := c.epoch.Load()
	sent := c.sendAndHangUp(key, ks.body)
	sleepCtx(ctx, time.Duration(100+rng.IntN(150))*time.Millisecond)
	c.mu.Lock()
	ks.lostSent = sent
	ks.crossed = ks.crossed || c.epoch.Load() != epoch
	c.mu.Unlock()
	// Judged from the ledger at the end: the lost request and its retries
	// must have run once. (Which of them ran, and so whether the retry's
	// answer is marked replayed, depends on which reached the server first.)
	c.settleKey(ctx, rng, key, ks)
}

func (c *campaign) sendAndHangUp(key string, body []byte) bool {
	conn, err := net.DialTimeout("tcp", *c.api.Load(), 2*time.Second)
	if err != nil {
		return false
	}
	defer conn.Close()
	c.requests.Add(1)
	_ = conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
	_, err = fmt.Fprintf(conn, "POST /orders HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"+
		"Idempotency-Key: %s\r\nContent-Length: %d\r\n\r\n%s", *c.api.Load(), key, len(body), body)
	return err == nil
}

// slowOrder runs a handler for 2-2.6s, past the 1s lease. A duplicate sent
// after the lease would have run out must still find it in flight (the
// Guard renews it), and the handler must run once.
func (c *campaign) slowOrder(ctx context.Context, rng *rand.Rand) {
	key, ks := c.newKey("slow", rng, 2000+rng.IntN(600))
	epoch := c.epoch.Load()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.settleKey(ctx, rand.New(rand.NewPCG(rng.Uint64(), 1)), key, ks)
	}()
	if sleepCtx(ctx, Lease+300*time.Millisecond) {
		a, err := c.post(ctx, []string{key}, ks.body)
		if err == nil && c.epoch.Load() == epoch {
			c.rep.Check(CheckInFlight, a.inFlight,
				"key %s: a duplicate %v into a %v handler got %d %q", key, Lease+300*time.Millisecond, Lease, a.status, a.body)
			if a.status == http.StatusCreated {
				c.record(key, ks, a)
			}
		}
	}
	<-done
}

// conflict completes an order, then reuses its key with another quantity.
func (c *campaign) conflict(ctx context.Context, rng *rand.Rand) {
	key, ks := c.newKey("conflict", rng, 0)
	if _, ok := c.settleKey(ctx, rng, key, ks); !ok {
		return
	}
	var o order
	_ = json.Unmarshal(ks.body, &o)
	o.Qty++
	other, _ := json.Marshal(o)
	a, ok := c.settle(ctx, rng, []string{key}, other)
	if !ok {
		return
	}
	c.rep.Check(CheckConflict, a.status == http.StatusUnprocessableEntity && bytes.Contains(a.body, []byte(idemhttp.ProblemKeyReused.Type)),
		"key %s reused with another payload: %d %q", key, a.status, a.body)
}

// malformed sends a key the draft rejects. Each carries a unique marker so
// that the ledger can be searched for it.
func (c *campaign) malformed(ctx context.Context, rng *rand.Rand) {
	marker := fmt.Sprintf("%s-bad%d", c.runID, c.seq.Add(1))
	forms := [][]string{
		{`"` + marker},    // an sf-string never closed
		{marker + ";p=1"}, // parameters
		{"a," + marker},   // a list
		{strings.Repeat("k", idemhttp.MaxKeyLen) + marker}, // too long
		{marker + "-1", marker + "-2"},                     // two fields
		{"with space " + marker},                           // not a token
	}
	keys := forms[rng.IntN(len(forms))]
	c.mu.Lock()
	c.markers = append(c.markers, marker)
	c.mu.Unlock()
	body, _ := json.Marshal(order{SKU: "sku-bad", Qty: 1, Cents: 100})
	a, ok := c.settle(ctx, rng, keys, body)
	if !ok {
		return
	}
	c.rep.Check(CheckMalformed, a.status == http.StatusBadRequest && bytes.Contains(a.body, []byte(idemhttp.ProblemInvalidKey.Type)),
		"Idempotency-Key %q: %d %q", keys, a.status, a.body)
}

// pauseStore quiesces the workers, makes every store operation of the
// server hang and fail, and sends fresh orders and replays: each must get
// 503, and none may run.
func (c *campaign) pauseStore(ctx context.Context, rng *rand.Rand) {
	c.setPhase("quiescing for the store pause")
	c.gate.Lock()
	defer c.gate.Unlock()
	sleepCtx(ctx, 300*time.Millisecond) // let the last Completes land
	pause := min(max(c.opts.Duration/8, time.Second), 3*time.Second)
	c.setPhase("store paused")
	resp, err := c.client.Post("http://"+*c.ctl.Load()+"/pause?for="+pause.String(), "text/plain", nil)
	if err != nil {
		c.rep.Fail(CheckFailClosed, "could not pause the store: %v", err)
		return
	}
	resp.Body.Close()
	until := time.Now().Add(pause)

	var probes [][]string
	var bodies [][]byte
	for range 4 {
		key, ks := c.newKey("paused", rng, 0)
		c.mu.Lock()
		c.pausedNew = append(c.pausedNew, key)
		c.mu.Unlock()
		probes, bodies = append(probes, []string{key}), append(bodies, ks.body)
	}
	c.mu.Lock()
	for key, ks := range c.keys {
		if ks.first != nil && len(probes) < 6 {
			probes, bodies = append(probes, []string{key}), append(bodies, ks.body)
		}
	}
	c.mu.Unlock()
	var wg sync.WaitGroup
	for i := range probes {
		wg.Go(func() {
			sent := time.Now()
			a, err := c.post(ctx, probes[i], bodies[i])
			switch {
			case err != nil:
				c.rep.Fail(CheckFailClosed, "key %s during the pause: %v", probes[i][0], err)
			case sent.After(until.Add(-200 * time.Millisecond)):
				// Sent too close to the end of the pause to judge.
			default:
				c.rep.Check(CheckFailClosed, a.status == http.StatusServiceUnavailable,
					"key %s while the store was paused: %d %q", probes[i][0], a.status, a.body)
			}
		})
	}
	wg.Wait()
	c.logf("store paused for %v: %d requests sent meanwhile", pause, len(probes))
	sleepCtx(ctx, time.Until(until)+100*time.Millisecond)
	c.setPhase("orders")
}

// killAndRestart SIGKILLs the server while orders, one of them slow, are
// under way, and starts it again on the same store and ledger.
func (c *campaign) killAndRestart(ctx context.Context) {
	witness, ks := c.newKey("slow", rand.New(rand.NewPCG(uint64(c.opts.Seed), 0xdead)), 1500)
	var wg sync.WaitGroup
	wg.Go(func() { c.settleKey(ctx, rand.New(rand.NewPCG(uint64(c.opts.Seed), 0xbeef)), witness, ks) })
	sleepCtx(ctx, 300*time.Millisecond)
	c.setPhase("server killed")
	c.srvMu.Lock()
	old := c.srv
	c.srv = nil
	c.srvMu.Unlock()
	killed := time.Now()
	old.kill()
	c.epoch.Add(1) // clients judge "crossed a restart" from here on
	if err := c.startServer(); err != nil {
		c.rep.Fail(checkServerStart, "restart after SIGKILL: %v", err)
		c.logf("server #%d killed with SIGKILL; the restart failed: %v", old.epoch, err)
	} else {
		c.rep.Pass(checkServerStart)
		c.logf("server #%d killed with SIGKILL mid-request, restarted as #%d in %v",
			old.epoch, c.epoch.Load(), time.Since(killed).Round(time.Millisecond))
	}
	c.setPhase("orders")
	wg.Wait()
}

// verifyReplays asks every acknowledged key once more, after the restart:
// the answer must be the first one, replayed.
func (c *campaign) verifyReplays(ctx context.Context) {
	type item struct {
		key string
		ks  *keyState
	}
	var items []item
	c.mu.Lock()
	for k, ks := range c.keys {
		if ks.first != nil {
			items = append(items, item{k, ks})
		}
	}
	c.mu.Unlock()
	ch := make(chan item)
	var wg sync.WaitGroup
	for w := range c.opts.Concurrency {
		rng := rand.New(rand.NewPCG(uint64(c.opts.Seed), 0xf1+uint64(w)))
		wg.Go(func() {
			for it := range ch {
				a, ok := c.settle(ctx, rng, []string{it.key}, it.ks.body)
				if !ok {
					c.rep.Fail(CheckAnswered, "final replay of %s: %d %q", it.key, a.status, a.body)
					continue
				}
				c.mu.Lock()
				f := it.ks.first
				c.mu.Unlock()
				c.rep.Check(CheckReplay, a.replayed && a.status == f.status && bytes.Equal(a.body, f.body),
					"key %s after the campaign: first answer %d %q, now %d %q (replayed: %v)",
					it.key, f.status, f.body, a.status, a.body, a.replayed)
			}
		})
	}
	for _, it := range items {
		if ctx.Err() != nil {
			break
		}
		ch <- it
	}
	close(ch)
	wg.Wait()
}

// verifyLedger counts the ledger.
func (c *campaign) verifyLedger(st *ledgerState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	charges := map[string][]chargeRow{}
	var qty uint64
	for _, ch := range st.Charges {
		charges[ch.Key] = append(charges[ch.Key], ch)
		qty += uint64(ch.Qty)
	}
	for key, rows := range charges {
		ids := make([]string, len(rows))
		for i, r := range rows {
			ids[i] = fmt.Sprintf("%s (epoch %d, token %d)", r.ChargeID, r.Epoch, r.Token)
		}
		c.rep.Check(CheckCharged, len(rows) == 1, "key %s charged %d times: %s", key, len(rows), strings.Join(ids, ", "))
		var sum uint64
		for _, r := range rows {
			sum += uint64(r.Qty)
		}
		c.rep.Check(CheckStock, st.Reservations[key] == sum,
			"key %s: %d reserved, %d charged", key, st.Reservations[key], sum)
	}
	c.rep.Check(CheckStock, st.Initial-st.Stock == qty,
		"stock %d of %d, but %d units charged", st.Stock, st.Initial, qty)

	runs := map[string]map[uint64]int{}
	for _, r := range st.Runs {
		if runs[r.Key] == nil {
			runs[r.Key] = map[uint64]int{}
		}
		runs[r.Key][r.Epoch]++
	}
	for key, byEpoch := range runs {
		for epoch, n := range byEpoch {
			c.rep.Check(CheckRuns, n == 1, "key %s ran %d times in server epoch %d", key, n, epoch)
		}
	}

	for key, ks := range c.keys {
		n := 0
		for _, k := range runs[key] {
			n += k
		}
		if ks.kind == "lost" && ks.lostSent && !ks.crossed && ks.first != nil {
			c.rep.Check(CheckLost, n == 1 && len(charges[key]) == 1,
				"key %s: a request whose response was lost, then its retries, ran %d times and charged %d times",
				key, n, len(charges[key]))
		}
		if ks.kind == "slow" && !ks.crossed && ks.first != nil {
			c.rep.Check(CheckSlow, n == 1, "slow key %s ran %d times", key, n)
		}
		if ks.first != nil {
			var rc receipt
			_ = json.Unmarshal(ks.first.body, &rc)
			rows := charges[key]
			ids := make([]string, len(rows))
			for i, r := range rows {
				ids[i] = r.ChargeID
			}
			c.rep.Check(CheckAcked, len(rows) > 0 && rows[0].ChargeID == rc.ChargeID,
				"key %s was answered %d %q; the ledger holds charges %v", key, ks.first.status, ks.first.body, ids)
		}
	}
	for _, key := range c.pausedNew {
		c.rep.Check(CheckFailClosed, len(runs[key]) == 0, "key %s, sent while the store was paused, ran %d time(s)", key, len(runs[key]))
	}
	for _, m := range c.markers {
		ran := 0
		for key := range runs {
			if strings.Contains(key, m) {
				ran++
			}
		}
		c.rep.Check(CheckMalformed, ran == 0, "a malformed key with %s ran", m)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
