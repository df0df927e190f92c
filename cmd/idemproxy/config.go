package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/archlab/idempotency/internal/storeurl"
)

// config is the proxy's configuration, from flags, each of which may also
// be set as IDEMPROXY_<NAME> in the environment (a flag on the command line
// wins over the environment). A variable that is set counts even when it is
// empty: IDEMPROXY_ADMIN= turns the admin server off, and IDEMPROXY_STORE=
// is an error rather than the default store.
type config struct {
	listen     string
	upstream   *url.URL
	store      string
	migrate    bool
	lease      time.Duration
	retention  time.Duration
	requireKey bool
	maxBody    int64
	// maxResponse bounds a stored response body (larger: delivered, and
	// retries get 409 response-not-replayable).
	maxResponse int
	wait        time.Duration
	scopeHeader string
	admin       string
	logFormat   string
	logLevel    slog.Level
	shutdown    time.Duration
	// shutdownDelay: after SIGTERM, how long the proxy still serves (with
	// /readyz at 503) before it stops accepting.
	shutdownDelay time.Duration
	// upstreamTimeout bounds one upstream exchange (0: none).
	upstreamTimeout time.Duration
	// bodyTimeout bounds the arrival of a request's body, from the end of
	// its header; idleTimeout, a keep-alive connection's wait for its next
	// request (0: none).
	bodyTimeout, idleTimeout time.Duration
	// replayCache is how long a finished record is replayed from memory
	// before the store is asked again (0: no cache; auto: see
	// cacheTTL); replayCacheSize bounds the cache's memory.
	replayCache     cacheTTL
	replayCacheSize int64
	// storeSource names where store came from, -store or IDEMPROXY_STORE,
	// for an error that only opening the store finds.
	storeSource string
}

// cacheTTL is the -replay-cache flag: a duration, or auto.
type cacheTTL struct {
	ttl  time.Duration
	auto bool // on, for autoCacheTTL, with a store that announces deletions
}

// autoCacheTTL is the replay cache's TTL under -replay-cache auto: it only
// bounds what a broken deletion feed costs.
const autoCacheTTL = time.Second

func (c *cacheTTL) String() string {
	if c.auto {
		return "auto"
	}
	return c.ttl.String()
}

func (c *cacheTTL) Set(s string) error {
	if s == "auto" {
		*c = cacheTTL{auto: true}
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("want a duration (0: off) or auto")
	}
	*c = cacheTTL{ttl: d}
	return nil
}

// for reports the TTL to use in front of store (0: no cache).
func (c cacheTTL) forStore(announces bool) time.Duration {
	if c.auto {
		if announces {
			return autoCacheTTL
		}
		return 0
	}
	return c.ttl
}

// minReplayCacheSize is the smallest budget the replay cache accepts.
const minReplayCacheSize = 1 << 20

// errUsage marks configuration errors: the command exits 2.
var errUsage = errors.New("usage")

// envName is the environment variable that sets the flag name.
func envName(name string) string {
	return "IDEMPROXY_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

func parseConfig(args []string, lookupEnv func(string) (string, bool), stderr io.Writer) (*config, error) {
	c := &config{}
	fs := flag.NewFlagSet("idemproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: idemproxy -upstream URL [flags]
       idemproxy get|delete|release -store URL [-scope S] KEY

Every flag may also be set as IDEMPROXY_<NAME> (IDEMPROXY_STORE,
IDEMPROXY_UPSTREAM_TIMEOUT, ...); a flag on the command line wins.

`)
		fs.PrintDefaults()
	}
	var upstream, logLevel string
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8080", "address to serve the proxied API on")
	fs.StringVar(&upstream, "upstream", "", "URL of the service to protect (required), e.g. http://127.0.0.1:9000")
	fs.StringVar(&c.store, "store", "bolt:idempotency.db", "store URL: memory, bolt:PATH, redis://..., rediss://..., redis+cluster://host:port,host:port, redis+sentinel://host:port,host:port/master, postgres://...")
	fs.BoolVar(&c.migrate, "migrate", true, "create or upgrade the PostgreSQL schema at start (postgres stores)")
	fs.DurationVar(&c.lease, "lease", 30*time.Second, "how long a claim excludes retries while the upstream runs (renewed while it runs)")
	fs.DurationVar(&c.retention, "retention", 24*time.Hour, "dedup window: how long responses are replayed")
	fs.BoolVar(&c.requireKey, "require-key", false, "answer 400 to POST/PATCH requests without an Idempotency-Key")
	fs.Int64Var(&c.maxBody, "max-body", 1<<20, "largest request body, in bytes, that is fingerprinted (larger: 413)")
	fs.IntVar(&c.maxResponse, "max-response", 1<<20, "largest response body, in bytes, that is stored for replay; a larger one is delivered, and retries get 409 response-not-replayable instead of running again")
	fs.DurationVar(&c.wait, "wait", 0, "how long a duplicate waits for the original to finish before 409 (0: answer 409 at once)")
	fs.StringVar(&c.scopeHeader, "scope-header", "", "scope keys by this request header (e.g. a tenant id set by a trusted gateway) instead of the hashed Authorization header")
	fs.StringVar(&c.admin, "admin", "127.0.0.1:9090", "admin address: /healthz, /readyz, /metrics, /keys/ (empty: off)")
	fs.StringVar(&c.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.DurationVar(&c.upstreamTimeout, "upstream-timeout", time.Minute, "longest upstream exchange, the response body included (raise it for long streams); past it: 504, or a response cut off once begun, and the claim is kept until its lease ends (0: no limit)")
	fs.DurationVar(&c.bodyTimeout, "body-timeout", time.Minute, "longest time a guarded request's body may take to arrive, from the end of its header, and longest pause in any other request's body (0: no limit)")
	fs.DurationVar(&c.idleTimeout, "idle-timeout", 2*time.Minute, "how long a client's keep-alive connection may wait for its next request before the proxy closes it (0: no limit)")
	c.replayCache = cacheTTL{auto: true}
	fs.Var(&c.replayCache, "replay-cache", "replay finished keys from this process's memory, before asking the store again, for `auto|duration`: auto is 1s on Redis and PostgreSQL, which announce deletions, and off elsewhere; a duration is that long on every store but memory, which never has a cache (0: off). A key deleted through another instance, where the store does not announce deletions, may replay here that long")
	fs.Int64Var(&c.replayCacheSize, "replay-cache-size", 64<<20, fmt.Sprintf("most bytes the replay cache holds (keys, fingerprints, bodies, headers); at least %d, checked unless -replay-cache is 0 even on a store that gets no cache, so that a wrong size (64 meant as MiB) stops the proxy now rather than when it moves to a store that has one", minReplayCacheSize))
	fs.DurationVar(&c.shutdown, "shutdown-timeout", 30*time.Second, "on SIGTERM, how long in-flight requests may take to finish")
	fs.DurationVar(&c.shutdownDelay, "shutdown-delay", 0, "on SIGTERM, how long to go on accepting requests, with /readyz answering 503, before draining: time for load balancers (a Kubernetes Service's endpoints) to stop sending new ones (0: stop accepting at once)")

	// The command line first, then the environment for the flags it left
	// alone: a flag on the command line wins, also over a variable whose
	// value would not parse, and -h prints the usage whatever the
	// environment holds.
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	onCommandLine := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { onCommandLine[f.Name] = true })
	// fromEnv names each flag's variable where the environment set it, so
	// that an error names what the operator wrote.
	fromEnv := map[string]string{}
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if onCommandLine[f.Name] || envErr != nil {
			return
		}
		name := envName(f.Name)
		v, ok := lookupEnv(name)
		if !ok {
			return
		}
		if err := f.Value.Set(v); err != nil {
			envErr = fmt.Errorf("%w: %s=%q: %s", errUsage, name, v, wantOf(f, err))
			return
		}
		fromEnv[f.Name] = name
	})
	if envErr != nil {
		return nil, envErr
	}
	c.storeSource = "-store"
	if env, ok := fromEnv["store"]; ok {
		c.storeSource = env
	}
	// bad reports a bad value of flag name, naming it as the operator set
	// it: -name "value" or IDEMPROXY_NAME="value".
	bad := func(name, format string, args ...any) error {
		v := fs.Lookup(name).Value.String()
		if name == "upstream" || name == "store" {
			v = storeurl.Redact(v)
		}
		src := fmt.Sprintf("-%s %q", name, v)
		if env, ok := fromEnv[name]; ok {
			src = fmt.Sprintf("%s=%q", env, v)
		}
		return fmt.Errorf("%w: %s: "+format, append([]any{errUsage, src}, args...)...)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	if upstream == "" {
		if _, ok := fromEnv["upstream"]; ok {
			return nil, bad("upstream", "is empty; the URL of the service to protect is required")
		}
		return nil, fmt.Errorf("%w: -upstream is required (or IDEMPROXY_UPSTREAM)", errUsage)
	}
	u, err := url.Parse(upstream)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return nil, bad("upstream", "is not an http(s) URL")
	case u.User != nil:
		// ReverseProxy does not send a URL's user info: it would be
		// dropped without a word.
		return nil, bad("upstream", "has user info, which the proxy does not send upstream")
	}
	c.upstream = u
	if err := c.logLevel.UnmarshalText([]byte(logLevel)); err != nil {
		return nil, bad("log-level", "want debug, info, warn or error")
	}
	if c.store == "" {
		return nil, bad("store", "is empty")
	}
	if err := storeurl.Check(c.store); err != nil {
		if errors.Is(err, storeurl.ErrUnknownScheme) {
			// Not quoted: what is not a URL may be a key=value connection
			// string with a password in it, which Redact would not find.
			return nil, fmt.Errorf("%w: %s: %v", errUsage, c.storeSource, err)
		}
		return nil, bad("store", "%v", err)
	}
	if err := checkHeaderName(c.scopeHeader); err != nil {
		return nil, bad("scope-header", "%v", err)
	}
	if _, _, err := net.SplitHostPort(c.listen); err != nil {
		return nil, bad("listen", "want host:port (%v)", err)
	}
	if c.admin != "" {
		if _, _, err := net.SplitHostPort(c.admin); err != nil {
			return nil, bad("admin", "want host:port, or empty for no admin server (%v)", err)
		}
	}
	switch {
	case c.lease <= 0:
		return nil, bad("lease", "must be positive")
	case c.retention < c.lease:
		return nil, bad("retention", "must be at least the lease, %v", c.lease)
	case c.maxBody <= 0:
		return nil, bad("max-body", "must be positive")
	case c.maxResponse <= 0:
		return nil, bad("max-response", "must be positive")
	case c.bodyTimeout < 0:
		return nil, bad("body-timeout", "must not be negative")
	case c.idleTimeout < 0:
		return nil, bad("idle-timeout", "must not be negative")
	case c.upstreamTimeout < 0:
		return nil, bad("upstream-timeout", "must not be negative")
	case c.shutdown < 0:
		return nil, bad("shutdown-timeout", "must not be negative")
	case c.shutdownDelay < 0:
		return nil, bad("shutdown-delay", "must not be negative")
	case c.wait < 0:
		return nil, bad("wait", "must not be negative")
	case c.replayCache.ttl < 0:
		return nil, bad("replay-cache", "must not be negative")
	case (c.replayCache.ttl > 0 || c.replayCache.auto) && c.replayCacheSize < minReplayCacheSize:
		// Whatever the store: see the flag's usage.
		return nil, bad("replay-cache-size", "must be at least %d bytes (checked unless -replay-cache is 0, whatever the store)", minReplayCacheSize)
	case c.logFormat != "text" && c.logFormat != "json":
		return nil, bad("log-format", "want text or json")
	}
	return c, nil
}

// wantOf says what flag f takes, for a variable whose value err refused:
// the flag package's own errors for its types say only "parse error".
func wantOf(f *flag.Flag, err error) string {
	switch typ, _ := flag.UnquoteUsage(f); typ {
	case "duration":
		return "want a duration with its unit, such as 500ms, 30s, 5m or 24h"
	case "": // a bool flag
		return "want true or false"
	case "int":
		return "want a whole number"
	}
	return err.Error()
}

// checkHeaderName rejects a -scope-header that no request can carry (every
// request would share one scope) or that holds a credential (it would be
// written into the store's keys in clear). "" is the default scope.
func checkHeaderName(name string) error {
	if name == "" {
		return nil
	}
	for _, r := range name {
		if r >= 0x80 || !strings.ContainsRune("!#$%&'*+-.^_`|~", r) &&
			!('0' <= r && r <= '9' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z') {
			return fmt.Errorf("%q is not a header name (letters, digits and !#$%%&'*+-.^_`|~ only)", r)
		}
	}
	switch http.CanonicalHeaderKey(name) {
	case "Authorization", "Proxy-Authorization", "Cookie":
		return errors.New("holds credentials, which would be stored in clear in the keys; leave -scope-header empty to scope by the hashed Authorization header")
	}
	return nil
}
