package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"
)

// config is the proxy's configuration, from flags, each of which may also
// be set as IDEMPROXY_<NAME> in the environment (a flag on the command line
// wins over the environment).
type config struct {
	listen      string
	upstream    *url.URL
	store       string
	migrate     bool
	lease       time.Duration
	retention   time.Duration
	requireKey  bool
	maxBody     int64
	wait        time.Duration
	scopeHeader string
	admin       string
	logFormat   string
	logLevel    string
	shutdown    time.Duration
	// upstreamTimeout bounds one upstream exchange (0: none).
	upstreamTimeout time.Duration
}

// errUsage marks configuration errors: the command exits 2.
var errUsage = errors.New("usage")

func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (*config, error) {
	c := &config{}
	fs := flag.NewFlagSet("idemproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var upstream string
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8080", "address to serve the proxied API on")
	fs.StringVar(&upstream, "upstream", "", "URL of the service to protect (required), e.g. http://127.0.0.1:9000")
	fs.StringVar(&c.store, "store", "bolt:idempotency.db", "store URL: memory, bolt:PATH, redis://..., rediss://..., redis+cluster://host:port,host:port, postgres://...")
	fs.BoolVar(&c.migrate, "migrate", true, "create or upgrade the PostgreSQL schema at start (postgres stores)")
	fs.DurationVar(&c.lease, "lease", 30*time.Second, "how long a claim excludes retries while the upstream runs (renewed while it runs)")
	fs.DurationVar(&c.retention, "retention", 24*time.Hour, "dedup window: how long responses are replayed")
	fs.BoolVar(&c.requireKey, "require-key", false, "answer 400 to POST/PATCH requests without an Idempotency-Key")
	fs.Int64Var(&c.maxBody, "max-body", 1<<20, "largest request body, in bytes, that is fingerprinted (larger: 413)")
	fs.DurationVar(&c.wait, "wait", 0, "how long a duplicate waits for the original to finish before 409 (0: answer 409 at once)")
	fs.StringVar(&c.scopeHeader, "scope-header", "", "scope keys by this request header (e.g. a tenant id set by a trusted gateway) instead of the hashed Authorization header")
	fs.StringVar(&c.admin, "admin", "127.0.0.1:9090", "admin address: /healthz, /readyz, /metrics, /keys/ (empty: off)")
	fs.StringVar(&c.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&c.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.DurationVar(&c.upstreamTimeout, "upstream-timeout", time.Minute, "longest wait for the upstream's response; past it: 504 and the claim is kept until its lease ends (0: no limit)")
	fs.DurationVar(&c.shutdown, "shutdown-timeout", 30*time.Second, "on SIGTERM, how long in-flight requests may take to finish")

	// The environment first, so that flags on the command line override it.
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		name := "IDEMPROXY_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v := getenv(name); v != "" && envErr == nil {
			if err := f.Value.Set(v); err != nil {
				envErr = fmt.Errorf("%w: %s=%q: %v", errUsage, name, v, err)
			}
		}
	})
	if envErr != nil {
		return nil, envErr
	}
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	if upstream == "" {
		return nil, fmt.Errorf("%w: -upstream is required (or IDEMPROXY_UPSTREAM)", errUsage)
	}
	u, err := url.Parse(upstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: -upstream %q is not an http(s) URL", errUsage, upstream)
	}
	c.upstream = u
	switch {
	case c.lease <= 0:
		return nil, fmt.Errorf("%w: -lease must be positive", errUsage)
	case c.retention < c.lease:
		return nil, fmt.Errorf("%w: -retention must be at least -lease", errUsage)
	case c.maxBody <= 0:
		return nil, fmt.Errorf("%w: -max-body must be positive", errUsage)
	case c.upstreamTimeout < 0:
		return nil, fmt.Errorf("%w: -upstream-timeout must not be negative", errUsage)
	case c.shutdown < 0:
		return nil, fmt.Errorf("%w: -shutdown-timeout must not be negative", errUsage)
	case c.wait < 0:
		return nil, fmt.Errorf("%w: -wait must not be negative", errUsage)
	case c.logFormat != "text" && c.logFormat != "json":
		return nil, fmt.Errorf("%w: -log-format must be text or json", errUsage)
	}
	return c, nil
}
