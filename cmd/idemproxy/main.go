// Command idemproxy is a sidecar that gives any HTTP API idempotency keys:
// an httputil.ReverseProxy behind the idemhttp middleware. A POST or PATCH
// with an Idempotency-Key runs once upstream; its retries within the window
// get the stored response, marked Idempotent-Replayed: true.
//
//	idemproxy -upstream http://127.0.0.1:9000               # bolt:idempotency.db
//	idemproxy -upstream http://app:9000 -store redis://redis:6379/0?prefix=orders:
//
// Every flag may be set as IDEMPROXY_<NAME> (IDEMPROXY_STORE, ...); see
// README.md for the store URLs and the metrics.
//
// # Scopes and trust
//
// A key is scoped so that one caller's response is never replayed to
// another. By default the scope is a hash of the request's Authorization
// header: callers with different credentials never share a key, and the
// credential never reaches the store or the logs. The proxy does not check
// credentials; it only keeps them apart. With -scope-header NAME the scope
// is that header's value as it arrives. Use it only behind a gateway that
// authenticates callers and sets NAME itself, removing any value a client
// sent: a client that can choose NAME can read another tenant's stored
// responses by guessing its keys. Requests without the header share the
// empty scope.
//
// # Upstream failures
//
// The upstream call is not cancelled when the client goes away, not even
// while the response is being copied to it: it finishes, its response is
// stored and the client's retry replays it (idemhttp's Options.Detach). When
// the upstream cannot be dialled, or the TLS handshake with it fails, nothing
// was sent: the proxy answers 502 (application/problem+json) and releases the
// key, so the retry runs at once. When the request was sent and no complete
// response came back (a timeout, -upstream-timeout, a reset, a body cut
// short) the operation may have taken effect: the proxy answers 504 or 502 (or aborts a response
// already under way) and keeps the claim until its lease ends, so a retry
// gets 409 until then and runs again only afterwards.
//
// # Operator commands
//
//	idemproxy get     -store URL [-scope S] KEY   print a key's record (no body)
//	idemproxy delete  -store URL [-scope S] KEY   evict a key in any state
//	idemproxy release -store URL [-scope S] KEY   give an in-flight claim back
//
// S is the scope as the proxy derives it: the -scope-header value, or
// "auth:" and the first 32 hex digits of the SHA-256 of the Authorization
// value followed by a newline (empty for requests without one; see the
// README for a shell line that computes it). The admin address offers the same as /keys/{key}.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemhttp"
	"github.com/archlab/idempotency/internal/storeurl"
)

func main() {
	ctx, stop := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case <-sigs:
			// The first signal starts the shutdown; the next one, no
			// longer caught, stops the process at once (an operator
			// pressing Ctrl-C again), as kill -9 would: what was in
			// flight keeps its claim until its lease ends. The signals
			// go back to their default before the shutdown shows
			// (/readyz), so that a second one sent once it shows is
			// never swallowed.
			signal.Stop(sigs)
			stop()
		case <-ctx.Done():
		}
	}()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.LookupEnv)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return // -h: the usage is printed
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "idemproxy:", err)
		if errors.Is(err, errUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// run is the whole command; it returns when ctx is done (SIGTERM) and the
// proxy has drained, or at once for an operator command. lookupEnv is
// os.LookupEnv or a stand-in.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) error {
	if len(args) > 0 {
		switch args[0] {
		case "get", "delete", "release":
			return operate(ctx, args[0], args[1:], stdout, stderr, lookupEnv)
		}
	}
	cfg, err := parseConfig(args, lookupEnv, stderr)
	if err != nil {
		return err
	}
	log := newLogger(cfg, stderr)
	return serve(ctx, cfg, log)
}

func newLogger(cfg *config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.logLevel}
	if cfg.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// testHookListener, when set (by tests), wraps the proxy's listener.
var testHookListener func(net.Listener) net.Listener

func serve(ctx context.Context, cfg *config, log *slog.Logger) error {
	redis.SetLogger(redisLog{log})
	openCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	store, closer, err := storeurl.Open(openCtx, cfg.store, storeurl.Options{Migrate: cfg.migrate, Logger: log})
	cancel()
	if errors.Is(err, idempotency.ErrInvalidConfig) {
		// What only the store judges (a setting the server refuses, a
		// schema -migrate=false finds unmigrated) is a bad value too.
		return fmt.Errorf("%w: %s: %w", errUsage, cfg.storeSource, err)
	}
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	defer func() {
		if err := closer.Close(); err != nil {
			log.Error("closing the store", "error", err)
		}
	}()
	if sw, ok := store.(sweeper); ok {
		// Stopped before the store is closed (defers run last first).
		defer startSweeper(sw, sweepEvery(cfg.retention), sweepLimit, log)()
	}
	m := newMetrics()
	var guarded idempotency.Store = timedStore{Store: store, m: m}
	watcher, announces := store.(deleteWatcher)
	if _, inMemory := store.(*idempotency.MemoryStore); cfg.replayCache.forStore(announces) > 0 && !inMemory {
		ttl := cfg.replayCache.forStore(announces)
		cache, err := idempotency.NewReplayCache(guarded, &idempotency.CacheOptions{TTL: ttl, MaxBytes: cfg.replayCacheSize})
		if err != nil {
			return fmt.Errorf("%w: %w", errUsage, err)
		}
		m.watchCache(cache)
		// The admin API deletes through the cache, which forgets the key
		// at once; other instances' caches forget it when the store
		// announces the deletion (Redis, PostgreSQL), or within the TTL.
		guarded = cache
		if announces {
			// Stopped before the store is closed (defers run last first).
			defer watchDeletes(watcher, cache, ttl, log)()
		}
	}
	guard, err := idempotency.NewGuard(guarded, &idempotency.Options{
		Lease: cfg.lease, Retention: cfg.retention, OnRenew: m.onRenew,
		// Bounds a guarded upstream exchange on the claim's own renewal
		// timer, cheaper than a context.WithTimeout per request.
		Timeout: cfg.upstreamTimeout,
	})
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	var scope func(*http.Request) string
	if cfg.scopeHeader != "" {
		name := http.CanonicalHeaderKey(cfg.scopeHeader)
		scope = func(r *http.Request) string { return r.Header.Get(name) }
	}
	mw, err := idemhttp.New(guard, &idemhttp.Options{
		Required: cfg.requireKey, Scope: scope, MaxBody: cfg.maxBody, MaxStoredResponse: cfg.maxResponse, Wait: cfg.wait,
		// The upstream call is not cut short by the client going away: it
		// finishes and its response is stored for the client's retry.
		Detach:   true,
		Observer: logObserver{m: m, log: log},
	})
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	proxy := newReverseProxy(cfg.upstream, cfg.upstreamTimeout, log, nil)
	runScope := scope
	if runScope == nil {
		runScope = idemhttp.DefaultScope
	}
	running := newRunningSet(runScope)
	protected := mw.Handler(running.track(proxy))
	handler := m.countInFlight(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		streamed := (r.Method != http.MethodPost && r.Method != http.MethodPatch) ||
			(len(r.Header["Idempotency-Key"]) == 0 && !cfg.requireKey)
		if streamed {
			m.passedThru.Inc()
		}
		if cfg.upstreamTimeout > 0 {
			// Every response, a replay's included, is written within
			// -upstream-timeout and cutGrace of its first byte: a client
			// that stops reading cannot hold the handler, and the shutdown,
			// for longer. (Without -upstream-timeout, the exchange's end
			// cuts a blocked write instead: writeCutter.)
			w = &budgetWriter{ResponseWriter: w, budget: cfg.upstreamTimeout + cutGrace}
		}
		switch {
		case cfg.bodyTimeout <= 0 || r.Body == nil || r.Body == http.NoBody:
		case !streamed:
			// The middleware reads a guarded body whole before anything
			// else, and the server lifts the deadline when it has read
			// the body to its end: one deadline, nothing to wrap. (A body
			// cut short is idemhttp's 400, its key not taken.)
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(cfg.bodyTimeout))
		default:
			b := newDeadlineBody(w, r.Body, cfg.bodyTimeout)
			defer b.handlerDone()
			// On a copy: the server looks at its own request's Body after
			// the handler (an unread Expect: 100-continue body closes the
			// connection instead of being waited for).
			r = r.WithContext(context.WithValue(r.Context(), deadlineBodyKey{}, b))
			r.Body = b
		}
		protected.ServeHTTP(w, r)
	}))

	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return fmt.Errorf("-listen: %w", err)
	}
	// No ReadTimeout or WriteTimeout: the first would bound a streamed
	// upload as a whole, the second every response, a slow upstream's and
	// a long stream's included. The body's arrival is bounded per request
	// instead (newDeadlineBody), and a write to a client that stopped
	// reading -upstream-timeout + cutGrace after the response's first byte
	// (budgetWriter) or, with no -upstream-timeout, by the end of the
	// upstream exchange (writeCutter).
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: readHeaderTimeout, IdleTimeout: cfg.idleTimeout,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	if testHookListener != nil {
		ln = testHookListener(ln)
	}
	var (
		adminSrv *http.Server
		adminLn  net.Listener
		draining atomic.Bool // SIGTERM came: /readyz answers 503
	)
	if cfg.admin != "" {
		adminLn, err = net.Listen("tcp", cfg.admin)
		if err != nil {
			ln.Close()
			return fmt.Errorf("-admin: %w", err)
		}
		adminSrv = &http.Server{Handler: adminHandler(guarded, store, m, idemhttp.StoreKey, time.Now, running, &draining),
			ReadHeaderTimeout: readHeaderTimeout, ReadTimeout: time.Minute, IdleTimeout: time.Minute}
	}
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	attrs := []any{"proxy", ln.Addr().String(), "upstream", cfg.upstream.Redacted(), "store", storeurl.Redact(cfg.store)}
	if adminSrv != nil {
		go func() { errc <- adminSrv.Serve(adminLn) }()
		attrs = append(attrs, "admin", adminLn.Addr().String())
	}
	log.Info("listening", attrs...)

	select {
	case <-ctx.Done():
	case err := <-errc:
		srv.Close()
		if adminSrv != nil {
			adminSrv.Close()
		}
		return fmt.Errorf("serve: %w", err)
	}
	draining.Store(true)
	if cfg.shutdownDelay > 0 {
		// Load balancers learn from /readyz (or from the pod's deletion)
		// that this instance is going; until they do, they still send
		// requests, which a closed listener would refuse.
		log.Info("shutting down: still accepting requests, /readyz answers 503 (signal again to stop at once)", "delay", cfg.shutdownDelay)
		t := time.NewTimer(cfg.shutdownDelay)
		select {
		case <-t.C:
		case err := <-errc:
			t.Stop()
			srv.Close()
			if adminSrv != nil {
				adminSrv.Close()
			}
			return fmt.Errorf("serve: %w", err)
		}
	}
	log.Info("shutting down: draining in-flight requests", "timeout", cfg.shutdown)
	sctx, cancel := context.WithTimeout(context.Background(), cfg.shutdown)
	defer cancel()
	err = srv.Shutdown(sctx)
	if err != nil {
		log.Warn("in-flight requests did not finish in time; closing", "error", err)
		srv.Close()
	}
	if adminSrv != nil {
		_ = adminSrv.Shutdown(sctx)
		adminSrv.Close()
	}
	log.Info("stopped")
	return nil
}

// readHeaderTimeout bounds the arrival of a request's header, on the proxy
// and the admin server alike.
const readHeaderTimeout = 10 * time.Second

// sweeper is a store whose expired records stay until Sweep deletes them
// (pgstore: nothing else ever does; boltstore: only writes sweep a few).
type sweeper interface {
	Sweep(ctx context.Context, now time.Time, limit int) (int, error)
}

// sweepEvery is how often the sweeper runs: often enough that records do
// not outlive the retention by much, at most once a second.
func sweepEvery(retention time.Duration) time.Duration {
	return min(max(retention/4, time.Second), time.Minute)
}

// sweepLimit bounds one round of the sweeper; sweepPause separates the
// rounds of one backlog.
const (
	sweepLimit = 10000
	sweepPause = 100 * time.Millisecond
)

// startSweeper sweeps s every interval, in rounds of at most limit records,
// until the returned function is called; that function returns once no
// Sweep is under way.
func startSweeper(s sweeper, every time.Duration, limit int, log *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			// Rounds of limit until the backlog is gone, so that a window
			// filling faster than limit records per interval is kept
			// up with; each round is a few short transactions.
			for {
				sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
				n, err := s.Sweep(sctx, time.Now(), limit)
				scancel()
				if err != nil && ctx.Err() == nil {
					log.Warn("sweeping expired records", "removed", n, "error", err)
				}
				if err != nil || n < limit {
					break
				}
				// A pause between rounds leaves the store to the requests
				// while a large backlog (an upgrade from a version that
				// never swept) is worked off.
				select {
				case <-ctx.Done():
					return
				case <-time.After(sweepPause):
				}
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// operate runs an operator command on a store.
func operate(ctx context.Context, cmd string, args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) error {
	fs := flag.NewFlagSet("idemproxy "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	// The usage shows the default, so the environment's URL, which may
	// hold a password, is not made the flag's default.
	storeURL := fs.String("store", "", "store URL (as for the proxy; default: $IDEMPROXY_STORE, else bolt:idempotency.db)")
	scope := fs.String("scope", "", "the key's scope as the proxy derives it (see the package doc)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: idemproxy %s -store URL [-scope S] KEY\n", cmd)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	storeSet := false
	fs.Visit(func(f *flag.Flag) { storeSet = storeSet || f.Name == "store" })
	storeSource := "-store"
	if !storeSet {
		*storeURL = "bolt:idempotency.db"
		if v, ok := lookupEnv("IDEMPROXY_STORE"); ok {
			*storeURL, storeSource = v, "IDEMPROXY_STORE"
		}
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return fmt.Errorf("%w: %s needs exactly one KEY", errUsage, cmd)
	}
	k, err := idemhttp.ParseKey([]string{fs.Arg(0)})
	if err != nil {
		return fmt.Errorf("%w: KEY: %v", errUsage, err)
	}
	if err := storeurl.Check(*storeURL); err != nil {
		// The URL is not repeated: it may hold a password.
		return fmt.Errorf("%w: %s: %w", errUsage, storeSource, err)
	}
	key := idemhttp.StoreKey(*scope, k)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	store, closer, err := storeurl.Open(ctx, *storeURL, storeurl.Options{})
	if errors.Is(err, idempotency.ErrInvalidConfig) {
		return fmt.Errorf("%w: %s: %w", errUsage, storeSource, err)
	}
	if err != nil {
		return err
	}
	defer closer.Close()
	// notFound names the key as the operator gave it: the store's own
	// error shows its internal form (scope, NUL, key).
	notFound := func(err error) error {
		if errors.Is(err, idempotency.ErrNotFound) {
			return fmt.Errorf("%w: no live record of key %q in scope %q (a request with an Authorization header has the scope auth:..., see -scope)",
				idempotency.ErrNotFound, k, *scope)
		}
		return err
	}
	switch cmd {
	case "get":
		rec, err := store.Get(ctx, key, time.Now())
		if err != nil {
			return notFound(err)
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(recordView(rec))
	case "delete":
		if err := deleteKey(ctx, store, key, time.Now()); err != nil {
			return notFound(err)
		}
		fmt.Fprintln(stdout, "deleted")
	case "release":
		// The command cannot know whether a proxy is running the key's
		// request: that check is the admin API's.
		if err := releaseKey(ctx, store, key, time.Now(), nil, true); err != nil {
			return notFound(err)
		}
		fmt.Fprintln(stdout, "released")
	}
	return nil
}
