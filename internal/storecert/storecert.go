// Package storecert certifies a live idempotency.Store named by a URL, for
// idemcheck's store mode (idemcheck -store URL). Run does four things and
// puts every property it checks into a verdict.Report:
//
//  1. The conformance contract: each clause of idemtest, run through
//     idemtest.Clause.Check on the live store with keys under a random run
//     id, is a check named "contract: <clause>". A clause is given up after
//     a minute; once the store has hung, later clauses do not wait on it
//     again (see maxHungClauses).
//  2. A concurrency and fault campaign: workers run Guard.Do over a small
//     set of keys (fresh keys every phase) for Options.Duration, counting
//     every run of fn, while faults come and go in phases. For redis:// and
//     postgres:// URLs the faults are TCP faults of an in-process toxiproxy
//     put between the store and its server (latency, connection resets,
//     black holes); for memory, bolt: and Redis Cluster URLs they are
//     faultstore injectors (latency, errors, replies lost after the write
//     was applied).
//  3. Every store call of the campaign is recorded (invocation and return,
//     arguments, answer) and each key's history is checked for
//     linearizability by porcupine against a sequential model of the Store
//     contract. A call that failed with ErrUnavailable may or may not have
//     been applied: it is given an open-ended return, and the model lets it
//     have happened or not. Tokens are checked for fencing (each claim's
//     token exceeds every token the key had), not for exact values. A key
//     whose history porcupine does not decide in time (2s a key, and
//     the larger of 10s and Options.Duration in all) fails the check: it
//     was not verified, and an illegal history can take the search
//     longer than a legal one. With Options.Visualize, porcupine's
//     drawing of each history that is not linearizable is written there,
//     and the report names the file; without, nothing is written.
//  4. Every store call of the campaign returns: one that panics (on a
//     worker or on one of the Guard's renewal goroutines) or ends its
//     goroutine fails the check "campaign: every store call returns",
//     naming the method and the panic value, instead of ending the
//     process. Each call gets a ctx of 400ms; one that has not returned
//     10s after that fails the check as hung and is left running (its
//     goroutine stays until the store lets it go). Either way the Guard
//     sees an ErrUnavailable, and the history an outcome unknown.
//
// # Clocks
//
// The contract's clauses move time through the now arguments, so they run
// on a store that judges leases by the caller's clock: for every Redis URL
// (redis://, rediss://, redis+cluster://, rediss+cluster://) and for
// postgres:// Run opens a second handle with clock=caller (the engines'
// test mode; the stored records are the same) whatever the URL says. The
// campaign runs on the store as the URL configures it, clock
// included: for a store on its server's clock the model only knows that a
// call was judged between its invocation and its return, widened by 50ms of
// clock skew, and checks leases as intervals.
//
// # What Run leaves behind
//
// For postgres:// Run applies pgstore's Migrate (versioned and idempotent)
// before it starts. Records are left to expire: the contract's after an
// hour of the store's clock, the campaign's after its retention (an hour,
// or ten times Options.Duration if longer); use a dedicated prefix= or
// schema= to keep them apart.
package storecert

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/faultstore"
	"github.com/archlab/idempotency/idemtest"
	"github.com/archlab/idempotency/internal/storeurl"
	"github.com/archlab/idempotency/internal/verdict"
)

// Options configure Run. The zero value of each field is documented.
type Options struct {
	// Seed drives the choice of faults, keys and fn's behaviour; the same
	// seed makes the same choices (timing still varies).
	Seed int64
	// Duration is the length of the campaign (0: DefaultDuration).
	Duration time.Duration
	// Concurrency is the number of campaign workers (0: DefaultConcurrency).
	Concurrency int
	// Progress receives a line per step (nil: none).
	Progress io.Writer
	// Visualize is a directory in which porcupine's visualization of each
	// key history that is not linearizable is written, an HTML file named
	// in the report ("": none is written). It must exist.
	Visualize string

	// clauseTimeout bounds each contract clause (0: clauseTimeout), for
	// tests.
	clauseTimeout time.Duration
}

// Defaults for the zero Options.
const (
	DefaultDuration    = 10 * time.Second
	DefaultConcurrency = 8
)

// clauseTimeout bounds one contract clause on the live store.
const clauseTimeout = time.Minute

// Run certifies the store named by storeURL (internal/storeurl's forms) and
// records each property in rep. It returns an error only when the store
// cannot be opened; every finding about the store is in rep.
func Run(ctx context.Context, storeURL string, opts Options, rep *verdict.Report) error {
	tgt, err := resolve(ctx, storeURL)
	if err != nil {
		return err
	}
	defer tgt.close()
	return certify(ctx, tgt, opts, rep)
}

// target is a store to certify, opened.
type target struct {
	desc string
	// contract is the store the clauses run on (caller's clock).
	contract idempotency.Store
	// campaign opens the campaign's store and its fault phases.
	campaign func(ctx context.Context, seed int64) (*faulty, error)
	// serverClock: the campaign's store judges leases by its server's clock.
	serverClock bool
	closers     []func()
}

func (t *target) close() {
	for i := len(t.closers) - 1; i >= 0; i-- {
		t.closers[i]()
	}
}

// faulty is the campaign's store with the faults that can be put on it.
type faulty struct {
	store  idempotency.Store
	phases []phase
	heal   func() error
	// cut makes the store's backend unreachable, for the Unavailable
	// clauses at the end (nil: they are skipped).
	cut   func() error
	close func()
}

func certify(ctx context.Context, tgt *target, opts Options, rep *verdict.Report) error {
	if opts.Duration <= 0 {
		opts.Duration = DefaultDuration
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = DefaultConcurrency
	}
	if opts.clauseTimeout <= 0 {
		opts.clauseTimeout = clauseTimeout
	}
	c := &campaign{opts: opts, runID: newRunID(), rep: rep, lease: campaignLease}
	c.progress("certifying %s (seed %d, campaign %v with %d workers)", tgt.desc, opts.Seed, opts.Duration, opts.Concurrency)

	k := &contract{timeout: opts.clauseTimeout, hung: map[string]string{}}
	failed := 0
	for _, cl := range idemtest.Clauses() {
		if !k.record(rep, cl, k.run(ctx, cl, tgt.contract)) {
			failed++
		}
	}
	c.progress("contract: %d clauses, %d failed", len(idemtest.Clauses()), failed)
	if len(k.waited) > 0 {
		c.progress("contract: the store hung in clauses %s", strings.Join(k.waited, " and "))
	}

	f, err := tgt.campaign(ctx, opts.Seed)
	if err != nil {
		return fmt.Errorf("storecert: opening the campaign's store: %w", err)
	}
	defer f.close()
	c.rec = newRecorder(f.store, campaignOpTimout, tgt.serverClock)
	gopts := idempotency.Options{Lease: campaignLease, Retention: max(time.Hour, 10*opts.Duration)}
	if c.guard, err = idempotency.NewGuard(c.rec, &gopts); err != nil {
		return err
	}
	gopts.RenewEvery = -1
	if c.stale, err = idempotency.NewGuard(c.rec, &gopts); err != nil {
		return err
	}
	c.phases, c.heal = f.phases, f.heal
	c.run(ctx)

	const unavailable = "contract: Unavailable"
	if f.cut == nil {
		rep.Skip(unavailable, tgt.desc+" has no backend to cut off")
		return nil
	}
	if err := f.cut(); err != nil {
		rep.Skip(unavailable, "cutting the store off failed: "+err.Error())
		return nil
	}
	// In parallel, as in idemtest.Run: each waits on a dead backend. The
	// methods that hung in the contract are refused here too.
	clauses := idemtest.UnavailableClauses()
	runs := make([]clauseRun, len(clauses))
	var wg sync.WaitGroup
	for i, cl := range clauses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runs[i] = k.run(ctx, cl, f.store)
		}()
	}
	wg.Wait()
	for i, cl := range clauses {
		k.record(rep, cl, runs[i])
	}
	return nil
}

func newRunID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// resolve opens the store named by rawURL for the contract and says how to
// open it for the campaign.
func resolve(ctx context.Context, rawURL string) (*target, error) {
	rawURL = strings.TrimSpace(rawURL)
	scheme, _, _ := strings.Cut(rawURL, ":")
	switch s := strings.ToLower(scheme); s {
	case "redis", "rediss", "postgres", "postgresql":
		return resolveRemote(ctx, rawURL, s)
	case "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel":
		// Several hosts, which toxiproxy cannot stand in front of: faults
		// are injected in process, and the contract runs on the caller's
		// clock (see resolveCluster).
		return resolveCluster(ctx, rawURL)
	}
	s, closer, err := storeurl.Open(ctx, rawURL, storeurl.Options{})
	if err != nil {
		return nil, fmt.Errorf("storecert: %w", err)
	}
	tgt := &target{desc: rawURL, contract: s, closers: []func(){func() { _ = closer.Close() }}}
	tgt.campaign = func(_ context.Context, seed int64) (*faulty, error) {
		return injected(s, closer, seed, !strings.HasPrefix(strings.ToLower(scheme), "mem")), nil
	}
	return tgt, nil
}

// injected is the campaign on an in-process store: faultstore injectors in
// phases. With cuttable, closing the store (a closed bolt file) cuts it off.
func injected(s idempotency.Store, closer io.Closer, seed int64, cuttable bool) *faulty {
	fs := faultstore.New(s, nil)
	u := uint64(seed)
	renew := campaignLease / 3
	set := func(inj faultstore.Injector) func() error {
		return func() error { fs.SetInjector(inj); return nil }
	}
	f := &faulty{
		store: fs,
		phases: []phase{
			{"latency (renewals time out)", set(faultstore.Any(
				faultstore.OnOps(faultstore.Latency(u, renew, 2*renew), faultstore.OpExtend),
				faultstore.Latency(u+1, 0, renew/4)))},
			{"errors (nothing applied)", set(faultstore.Random(u, 0.3, faultstore.Error(nil)))},
			{"lost acknowledgements (applied)", set(faultstore.Random(u, 0.3, faultstore.LostAck(nil)))},
			{"slow, then acknowledgement lost", set(faultstore.Random(u, 0.3,
				faultstore.Chain(faultstore.Latency(u, time.Millisecond, 50*time.Millisecond), faultstore.LostAck(nil))))},
		},
		heal:  set(nil),
		close: func() {},
	}
	if cuttable {
		f.cut = closer.Close
	}
	return f
}

func withParam(u *url.URL, name, value string, replace bool) {
	q := u.Query()
	if replace || !q.Has(name) {
		q.Set(name, value)
	}
	u.RawQuery = q.Encode()
}

// resolveRemote opens a Redis or PostgreSQL store: with clock=caller for the
// contract, and through a toxiproxy as the URL says for the campaign.
func resolveRemote(ctx context.Context, rawURL, scheme string) (*target, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("storecert: %w: %s URL does not parse", idempotency.ErrInvalidConfig, scheme)
	}
	desc := u.Redacted()
	isRedis := strings.HasPrefix(scheme, "redis")
	clock := u.Query().Get("clock")
	serverClock := clock == "server" || (isRedis && clock == "")

	cu := *u
	withParam(&cu, "clock", "caller", true)
	s, closer, err := storeurl.Open(ctx, cu.String(), storeurl.Options{Migrate: !isRedis})
	if err != nil {
		return nil, fmt.Errorf("storecert: open %s: %w", desc, err)
	}
	tgt := &target{desc: desc, contract: s, serverClock: serverClock,
		closers: []func(){func() { _ = closer.Close() }}}

	tgt.campaign = func(ctx context.Context, seed int64) (*faulty, error) {
		upstream := u.Host
		if upstream == "" || strings.Contains(upstream, ",") {
			return nil, fmt.Errorf("%s names no single host:port to put a proxy in front of", desc)
		}
		if u.Port() == "" {
			port := "6379"
			if !isRedis {
				port = "5432"
			}
			upstream = net.JoinHostPort(u.Hostname(), port)
		}
		api := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
		proxy := toxiproxy.NewProxy(api, "storecert", "127.0.0.1:0", upstream)
		if err := proxy.Start(); err != nil {
			return nil, fmt.Errorf("starting toxiproxy: %w", err)
		}
		pu := *u
		pu.Host = proxy.Listen
		if isRedis {
			// Bound each round trip, so that a black-holed connection is
			// given up quickly and not reused.
			for _, p := range []string{"dial_timeout", "read_timeout", "write_timeout"} {
				withParam(&pu, p, campaignOpTimout.String(), false)
			}
		} else {
			withParam(&pu, "connect_timeout", "2", false)
		}
		ps, pcloser, err := storeurl.Open(ctx, pu.String(), storeurl.Options{})
		if err != nil {
			proxy.Stop()
			return nil, fmt.Errorf("open %s through toxiproxy: %w", desc, err)
		}
		f := proxied(ps, pcloser, proxy, seed)
		if isRedis {
			// A black hole for requests, not a stopped proxy: every
			// refused dial makes go-redis's pool print a line to its
			// process-wide logger, which only redis.SetLogger (for the
			// whole process) could silence. Requests that vanish fail the
			// same way for the store: ErrUnavailable, nothing applied.
			f.cut = func() error {
				if err := f.heal(); err != nil {
					return err
				}
				_, err := proxy.Toxics.AddToxicJson(strings.NewReader(
					`{"name":"cut","type":"timeout","stream":"upstream","toxicity":1,"attributes":{"timeout":0}}`))
				return err
			}
		}
		return f, nil
	}
	return tgt, nil
}

// resolveCluster opens a Redis Cluster or Sentinel store: with clock=caller for the
// contract, as the URL says for the campaign. The campaign's faults are
// faultstore injectors: a proxy would have to stand in for every node the
// cluster announces, and cutting the store off closes its client.
func resolveCluster(ctx context.Context, rawURL string) (*target, error) {
	desc := storeurl.Redact(rawURL)
	contractURL, clock, err := clusterCallerClock(rawURL)
	if err != nil {
		return nil, fmt.Errorf("storecert: %w: %s: %w", idempotency.ErrInvalidConfig, desc, err)
	}
	s, closer, err := storeurl.Open(ctx, contractURL, storeurl.Options{})
	if err != nil {
		return nil, fmt.Errorf("storecert: open %s: %w", desc, err)
	}
	tgt := &target{desc: desc, contract: s, serverClock: clock == "" || clock == "server",
		closers: []func(){func() { _ = closer.Close() }}}
	tgt.campaign = func(ctx context.Context, seed int64) (*faulty, error) {
		cs, ccloser, err := storeurl.Open(ctx, rawURL, storeurl.Options{})
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", desc, err)
		}
		f := injected(cs, ccloser, seed, true)
		f.close = func() { _ = ccloser.Close() }
		return f, nil
	}
	return tgt, nil
}

// clusterCallerClock returns the cluster URL rawURL with clock=caller, and
// the clock it named ("" for none). A cluster URL lists several hosts, which
// net/url need not parse (IPv6 seeds); its query is everything after the
// first '?', as storeurl reads it.
func clusterCallerClock(rawURL string) (callerURL, clock string, err error) {
	base, query, _ := strings.Cut(rawURL, "?")
	q, err := url.ParseQuery(query)
	if err != nil {
		return "", "", fmt.Errorf("the query does not parse: %w", err)
	}
	clock = q.Get("clock")
	q.Set("clock", "caller")
	return base + "?" + q.Encode(), clock, nil
}

// proxied is the campaign on a network store: toxiproxy toxics in phases.
func proxied(s idempotency.Store, closer io.Closer, proxy *toxiproxy.Proxy, seed int64) *faulty {
	stream := "downstream"
	if seed%2 != 0 {
		stream = "upstream"
	}
	heal := func() error {
		err := proxy.Toxics.RemoveToxic(context.Background(), "t")
		if err != nil && !strings.Contains(err.Error(), "not found") {
			return err
		}
		return nil
	}
	toxic := func(json string) func() error {
		return func() error {
			if err := heal(); err != nil {
				return err
			}
			_, err := proxy.Toxics.AddToxicJson(strings.NewReader(json))
			return err
		}
	}
	renew := int((campaignLease / 3).Milliseconds())
	return &faulty{
		store: s,
		phases: []phase{
			{"latency (renewals time out)", toxic(fmt.Sprintf(
				`{"name":"t","type":"latency","stream":"downstream","attributes":{"latency":%d,"jitter":%d}}`, renew, renew/2))},
			{"reset_peer " + stream, toxic(
				`{"name":"t","type":"reset_peer","stream":"` + stream + `","toxicity":0.5,"attributes":{"timeout":0}}`)},
			{"timeout (black hole) " + stream, toxic(
				`{"name":"t","type":"timeout","stream":"` + stream + `","toxicity":0.5,"attributes":{"timeout":0}}`)},
		},
		heal: heal,
		cut:  func() error { proxy.Stop(); return nil },
		close: func() {
			_ = closer.Close()
			proxy.Stop()
		},
	}
}
