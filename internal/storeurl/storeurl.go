// Package storeurl opens an idempotency.Store named by a URL, for commands
// that take the store as a flag (cmd/idemproxy, cmd/idemcheck -store).
//
// The forms:
//
//	memory                          idempotency.NewMemoryStore (lost on exit)
//	bolt:PATH                       boltstore.Open(PATH): the embedded default
//	redis://[user:pass@]host:port/db[?opts]   one Redis node (go-redis ParseURL
//	rediss://...                              syntax; rediss is TLS)
//	redis+cluster://[user:pass@]host:port,host:port[/][?opts]
//	rediss+cluster://...            a Redis Cluster, seeded by any of its nodes
//	                                (go-redis ParseClusterURL options)
//	redis+sentinel://[user:pass@]host:port,host:port/mastername[/db][?opts]
//	rediss+sentinel://...           a master found through its Sentinels
//	                                (go-redis ParseFailoverURL options)
//	postgres://... postgresql://... a pgxpool (pgx connection string syntax)
//
// The hosts of a sentinel URL are the sentinels' (port 26379 when left
// out); the path names the master as the sentinels monitor it (sentinel
// monitor NAME ...), which is required, and then the database (default 0).
// A path of one all-digit segment (/0) is refused as a database number
// without a master name; a master whose name is all digits is written
// with its database (/007/0). The user info is the master's and its
// replicas' user, as in the other forms; sentinels that ask for a
// password of their own get it from sentinel_password= (and
// sentinel_username= for an ACL user). go-redis's master_name=, addr=, db=, username= and password= are
// refused (the URL's parts say these), and so are its options that route
// commands to replicas (replica_only=, route_by_latency=, route_randomly=):
// the store writes. go-redis's other options (dial_timeout=,
// read_timeout=, pool_size=, ...) pass through.
//
// The master and its replicas are dialled at the addresses the sentinels
// announce (usually IPs); over rediss+sentinel each one's certificate must
// name that host or the URL's first host, as for a cluster's nodes, and
// the sentinels' certificates their own host or the URL's first host.
//
// The nodes of a rediss+cluster store are found from the seeds, and each
// node's certificate must name that node's own host as the cluster
// announces it (a name, or an IP), or the first seed's host (for a cluster
// that announces IPs behind one certificate). A rediss store's certificate
// must name the URL's host.
//
// Certificates are checked against the system's roots (SSL_CERT_FILE,
// SSL_CERT_DIR), or against the CAs of tls_ca_file= alone. rediss://,
// rediss+cluster:// and rediss+sentinel:// take the same TLS parameters
// (redis://, redis+cluster:// and redis+sentinel:// refuse them):
//
//	tls_ca_file=PATH     trust the CA certificates in this PEM file instead of
//	                     the system's roots (a private CA); relative to the
//	                     working directory; percent-encode & + # % in PATH.
//	                     A file that cannot be read, holds no certificate
//	                     or one that does not parse is refused.
//	skip_verify=true     verify no certificate at all (go-redis's option, for
//	                     tests only: anyone on the path can read and change
//	                     the traffic); true, false, 1 or 0; true (or 1) is
//	                     refused together with tls_ca_file
//
// Both ask for TLS 1.2 at least.
//
// A user name or password with / ? # @ or % in it must be percent-encoded;
// Open refuses a URL whose password ends its authority early, without
// quoting it.
//
// Besides the driver's own query options, each form accepts these, which are
// removed before the URL reaches go-redis or pgx (each at most once, and
// never empty):
//
//	prefix=P       redis: the key prefix (redisstore.Options.Prefix); give each
//	               application, or each test, its own
//	clock=server|caller   redis and postgres: whose clock judges leases
//	               (default: redis server, postgres caller; see the engines)
//	schema=S, table=T     postgres: where the records live (pgstore.Options)
//	tls_ca_file=PATH, skip_verify=true|false   rediss: TLS, above
//	sentinel_username=U, sentinel_password=P    redis+sentinel: the
//	               sentinels' credentials, above
//
// For example redis://127.0.0.1:6379/0?prefix=orders:&clock=server or
// postgres://app@db/app?sslmode=require&schema=idem.
//
// The other query parameters of a postgres URL go to pgx: its own options
// (sslmode, connect_timeout, pool_max_conns, ...) and, for any name pgx
// does not know, a server setting sent when connecting (application_name,
// statement_timeout, search_path, an extension's ext.name). Which settings
// exist depends on the server, so Open lets them through, except that it
// refuses, naming it, prefix and any name without a dot within two typos
// of schema, table or clock (Schema, tabel, shema, clocks). The server
// refuses a setting it does not know, or a bad value, when Open connects;
// Open reports that as a configuration error too. (search_path does not
// place the store: schema= does.)
//
// Check refuses what Open would refuse of a URL before it connects, for
// commands that take a store URL among other arguments and should refuse a
// bad one before they start any work.
//
// A postgres Open always connects: with Options.Migrate it migrates the
// schema, without it checks that the schema is at the version this build
// needs (pgstore's CheckSchema).
package storeurl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/boltstore"
	"github.com/archlab/idempotency/pgstore"
	"github.com/archlab/idempotency/redisstore"
)

// Options configure Open. The zero value is usable.
type Options struct {
	// Migrate runs pgstore's Migrate after opening a postgres store. False:
	// the schema must be migrated already, and Open fails with
	// ErrInvalidConfig unless it is at the version this build needs (never
	// migrated or older: migrate it; newer: a newer build migrated it).
	// Other stores ignore it.
	Migrate bool
	// Logger receives the engines' warnings, such as redisstore's about an
	// evicting maxmemory-policy (nil: slog.Default()).
	Logger *slog.Logger
}

// ErrUnknownScheme is returned (wrapped) for a URL that names no store.
var ErrUnknownScheme = errors.New("storeurl: unknown store URL scheme")

// Open opens the store named by rawURL. The io.Closer releases what Open
// acquired (a file, a connection pool); close it after the last use of the
// store. A configuration error wraps idempotency.ErrInvalidConfig (or
// ErrUnknownScheme); a bolt file that cannot be opened (locked, a missing
// directory) and a postgres server that cannot be reached wrap
// idempotency.ErrUnavailable. The redis forms do not fail for a server
// that does not answer: Open asks it for its maxmemory-policy, warns
// through Options.Logger when it cannot, and returns the store, each call
// of which fails with ErrUnavailable until the server answers.
func Open(ctx context.Context, rawURL string, opts Options) (idempotency.Store, io.Closer, error) {
	open, err := parse(rawURL)
	if err != nil {
		return nil, nil, err
	}
	return open(ctx, opts)
}

// Check returns the configuration error Open would return for rawURL
// before it makes the store: the scheme, the URL's syntax, our own query
// parameters (each given once and not empty; clock=, skip_verify=,
// tls_ca_file= and the file it names) and the driver's options, as go-redis
// and pgx parse them. It connects to nothing and opens no store, so that a
// command can refuse a bad URL while it reads its arguments. Left to Open:
// what the engine judges as it makes the store (pgstore's rules for
// schema= and table= names) and what only the store can (a bolt file's
// lock, the server's settings, the schema's version).
func Check(rawURL string) error {
	_, err := parse(rawURL)
	return err
}

// opener opens a store whose URL parse has checked.
type opener func(ctx context.Context, opts Options) (idempotency.Store, io.Closer, error)

// parse checks rawURL as Check documents and returns what opens it.
func parse(rawURL string) (opener, error) {
	rawURL = strings.TrimSpace(rawURL)
	scheme, rest, ok := strings.Cut(rawURL, ":")
	if !ok {
		scheme, rest = rawURL, ""
	}
	switch strings.ToLower(scheme) {
	case "memory", "mem":
		if rest != "" && rest != "//" {
			return nil, invalid("memory takes no arguments: %q", rawURL)
		}
		return func(context.Context, Options) (idempotency.Store, io.Closer, error) {
			return idempotency.NewMemoryStore(), nopCloser{}, nil
		}, nil
	case "bolt", "boltdb":
		path := strings.TrimPrefix(rest, "//")
		if path == "" {
			return nil, invalid("bolt needs a path: bolt:PATH")
		}
		return func(context.Context, Options) (idempotency.Store, io.Closer, error) { return openBolt(path) }, nil
	case "redis", "rediss":
		ro, p, err := redisOptions(rawURL)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context, opts Options) (idempotency.Store, io.Closer, error) {
			return newRedis(ctx, redis.NewClient(ro), p, opts)
		}, nil
	case "redis+cluster", "rediss+cluster":
		co, p, err := clusterOptions(scheme, rest)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context, opts Options) (idempotency.Store, io.Closer, error) {
			return newRedis(ctx, redis.NewClusterClient(co), p, opts)
		}, nil
	case "redis+sentinel", "rediss+sentinel":
		fo, p, err := sentinelOptions(scheme, rest)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context, opts Options) (idempotency.Store, io.Closer, error) {
			return newRedis(ctx, redis.NewFailoverClient(fo), p, opts)
		}, nil
	case "postgres", "postgresql":
		return postgresOpener(rawURL)
	case "":
		return nil, fmt.Errorf("%w: empty store URL (want memory, bolt:PATH, redis://, redis+cluster://, redis+sentinel://, postgres://)", ErrUnknownScheme)
	}
	if !isScheme(scheme) {
		// Not quoted: it may be a key=value connection string with a
		// password in it.
		return nil, fmt.Errorf("%w: the store URL does not start with a scheme (want memory, bolt:PATH, redis://, rediss://, redis+cluster://, redis+sentinel://, postgres://; a key=value connection string is not accepted)", ErrUnknownScheme)
	}
	return nil, fmt.Errorf("%w: %q (want memory, bolt:PATH, redis://, rediss://, redis+cluster://, redis+sentinel://, postgres://)", ErrUnknownScheme, scheme)
}

func openBolt(path string) (idempotency.Store, io.Closer, error) {
	s, err := boltstore.Open(path, nil)
	if errors.Is(err, bolterrors.ErrTimeout) {
		// bbolt's own word for it is just "timeout".
		return nil, nil, fmt.Errorf("storeurl: %w (the file is locked: another process, such as a running idemproxy, has it open, and a bolt file serves one process at a time)", err)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("storeurl: %w", err)
	}
	return s, s, nil
}

// isScheme reports whether s is a URL scheme as RFC 3986 writes one.
func isScheme(s string) bool {
	for i, r := range s {
		letter := 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z'
		if !letter && (i == 0 || !('0' <= r && r <= '9' || r == '+' || r == '-' || r == '.')) {
			return false
		}
	}
	return s != ""
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: storeurl: "+format, append([]any{idempotency.ErrInvalidConfig}, args...)...)
}

type nopCloser struct{}

func (nopCloser) Close() error { return nil }

type closeFunc func() error

func (f closeFunc) Close() error { return f() }

// takeParams removes our own query parameters from u and returns them.
// Each may appear once, with a value. A malformed query is an error:
// u.Query would drop the malformed pairs, and with them, unseen, options
// such as sslmode.
func takeParams(u *url.URL, names ...string) (map[string]string, error) {
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		var esc url.EscapeError
		if errors.As(err, &esc) {
			// Not quoted: the text around the '%' may be a password.
			return nil, invalid("the query has a %% not followed by two hex digits (write a literal %% as %%25)")
		}
		return nil, invalid("the query is malformed (%v); separate parameters with &", err)
	}
	out := make(map[string]string, len(names))
	for _, n := range names {
		vs, ok := q[n]
		if !ok {
			continue
		}
		if len(vs) != 1 {
			return nil, invalid("query parameter %q given %d times", n, len(vs))
		}
		if vs[0] == "" {
			// Most likely a template's unset variable: the default in its
			// place would share a prefix or table with other applications.
			return nil, invalid("query parameter %q is empty (leave it out for the default)", n)
		}
		out[n] = vs[0]
		q.Del(n)
	}
	u.RawQuery = q.Encode()
	return out, nil
}

func redisClock(v string) (redisstore.Clock, error) {
	switch v {
	case "", "server":
		return redisstore.ServerClock, nil
	case "caller":
		return redisstore.CallerClock, nil
	}
	return 0, invalid("clock=%q: want server or caller", v)
}

// ownRedisParams are the query parameters of the redis forms that Open
// takes for itself, before go-redis parses the rest.
var ownRedisParams = []string{"prefix", "clock", paramSkipVerify, paramCAFile}

// redisOptions parses a redis:// or rediss:// URL: the client's options
// and our own parameters.
func redisOptions(rawURL string) (*redis.Options, map[string]string, error) {
	u, err := parseURL(rawURL)
	if err != nil {
		return nil, nil, err
	}
	p, err := takeParams(u, ownRedisParams...)
	if err != nil {
		return nil, nil, err
	}
	if _, err := redisClock(p["clock"]); err != nil {
		return nil, nil, err
	}
	ro, err := redis.ParseURL(u.String())
	if err != nil {
		return nil, nil, invalid("%v", err)
	}
	if err := applyTLSParams(ro.TLSConfig, u.Scheme, p); err != nil {
		return nil, nil, err
	}
	// The store's per-operation deadline then reaches the socket, and no
	// goroutine is left waiting on a server that does not answer (see
	// redisstore's doc on ContextTimeoutEnabled).
	ro.ContextTimeoutEnabled = true
	return ro, p, nil
}

// clusterOptions parses redis+cluster://[user:pass@]h1:p1,h2:p2[/][?opts]
// (rest is what follows the scheme's colon) by rewriting it into go-redis's
// cluster URL form (the first address as the host, the others as addr=
// parameters): the client's options and our own parameters.
func clusterOptions(scheme, rest string) (*redis.ClusterOptions, map[string]string, error) {
	if !strings.HasPrefix(rest, "//") {
		return nil, nil, invalid("%s URL must look like %s://host:port,host:port", scheme, scheme)
	}
	rest = rest[2:]
	authority, query, _ := strings.Cut(rest, "?")
	authority = strings.TrimSuffix(authority, "/")
	var userinfo string
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		// Split first: an unencoded / in the password is the password's
		// problem (parseURL says so), not a path.
		userinfo, authority = authority[:i+1], authority[i+1:]
	}
	if strings.Contains(authority, "/") {
		return nil, nil, invalid("%s URL takes no path or database (Cluster has database 0 only)", scheme)
	}
	var addrs []string
	for _, a := range strings.Split(authority, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		return nil, nil, invalid("%s URL names no node", scheme)
	}
	base := strings.TrimSuffix(strings.ToLower(scheme), "+cluster")
	u, err := parseURL(base + "://" + userinfo + addrs[0] + "?" + query)
	if err != nil {
		return nil, nil, err
	}
	p, err := takeParams(u, ownRedisParams...)
	if err != nil {
		return nil, nil, err
	}
	if _, err := redisClock(p["clock"]); err != nil {
		return nil, nil, err
	}
	q := u.Query()
	for _, a := range addrs[1:] {
		q.Add("addr", a)
	}
	u.RawQuery = q.Encode()
	co, err := redis.ParseClusterURL(u.String())
	if err != nil {
		return nil, nil, invalid("%v", err)
	}
	if err := applyTLSParams(co.TLSConfig, u.Scheme, p); err != nil {
		return nil, nil, err
	}
	co.ContextTimeoutEnabled = true
	dialNodesByName(co)
	return co, p, nil
}

func newRedis(_ context.Context, client redis.UniversalClient, p map[string]string, opts Options) (idempotency.Store, io.Closer, error) {
	clock, err := redisClock(p["clock"])
	if err != nil {
		_ = client.Close()
		return nil, nil, err
	}
	s, err := redisstore.New(client, &redisstore.Options{Prefix: p["prefix"], Clock: clock, Logger: opts.Logger})
	if err != nil {
		_ = client.Close()
		if !errors.Is(err, idempotency.ErrInvalidConfig) && !errors.Is(err, idempotency.ErrUnavailable) {
			// On Cluster, New asks the nodes for the masters' settings.
			err = fmt.Errorf("%w: %w", idempotency.ErrUnavailable, err)
		}
		return nil, nil, fmt.Errorf("storeurl: %w", err)
	}
	return s, client, nil
}

// postgresOpener checks a postgres:// URL and returns what opens it.
func postgresOpener(rawURL string) (opener, error) {
	u, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	p, err := takeParams(u, ownPostgresParams...)
	if err != nil {
		return nil, err
	}
	var clock pgstore.Clock
	switch p["clock"] {
	case "", "caller":
		clock = pgstore.CallerClock
	case "server":
		clock = pgstore.ServerClock
	default:
		return nil, invalid("clock=%q: want caller or server", p["clock"])
	}
	if err := checkPostgresParams(u); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		return nil, invalid("%v", err)
	}
	return func(ctx context.Context, opts Options) (idempotency.Store, io.Closer, error) {
		return openPostgres(ctx, cfg, &pgstore.Options{Schema: p["schema"], Table: p["table"], Clock: clock}, opts)
	}, nil
}

func openPostgres(ctx context.Context, cfg *pgxpool.Config, po *pgstore.Options, opts Options) (idempotency.Store, io.Closer, error) {
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("storeurl: %w: %w", idempotency.ErrUnavailable, err)
	}
	closer := closeFunc(func() error { pool.Close(); return nil })
	s, err := pgstore.New(pool, po)
	if err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("storeurl: %w", err)
	}
	// Either way Open connects, so that an unreachable server, a refused
	// parameter or a schema this build cannot use stops the caller at
	// startup rather than at its first request.
	check, what := s.CheckSchema, "without Options.Migrate (idemproxy -migrate=false)"
	if opts.Migrate {
		check, what = s.Migrate, "migrate"
	}
	if err := check(ctx); err != nil {
		pool.Close()
		if pe := refusedParam(err); pe != nil {
			return nil, nil, fmt.Errorf("storeurl: %w: the server refused a query parameter of the store URL: %w",
				idempotency.ErrInvalidConfig, pe)
		}
		return nil, nil, fmt.Errorf("storeurl: %s: %w", what, err)
	}
	return s, closer, nil
}

// ownPostgresParams are the query parameters of the postgres form that
// Open takes for itself.
var ownPostgresParams = []string{"schema", "table", "clock"}

// checkPostgresParams refuses, by name, a query parameter that is a near
// miss of one of ownPostgresParams or is the redis form's prefix.
//
// Every other name is left to pgx, which passes each one it does not know
// to the server as a setting (application_name, search_path,
// statement_timeout, an extension's pg_stat_statements.track, ...). Which
// settings exist depends on the server's version and extensions, and any
// name with a dot is a valid custom setting, so no list here could refuse
// the rest without refusing some good ones; the server refuses an unknown
// setting at connect, which Open does (see refusedParam). A near miss is
// no server's setting (TestNearMissSparesKnownNames checks pg_settings),
// only a mistake that would otherwise surface as a failed connection.
func checkPostgresParams(u *url.URL) error {
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return invalid("the query is malformed (%v)", err) // takeParams parsed it already
	}
	for name := range q {
		if strings.Contains(name, ".") {
			continue // a custom setting: ext.name
		}
		lower := strings.ToLower(name)
		if lower == "prefix" {
			return invalid("query parameter %q is for redis stores; a postgres store is placed by schema= and table=", name)
		}
		for _, own := range ownPostgresParams {
			if editDistance(lower, own) <= 2 {
				return invalid("unknown query parameter %q: did you mean %q?", name, own)
			}
		}
	}
	return nil
}

// editDistance is the number of single-byte insertions, deletions,
// substitutions and transpositions of adjacent bytes that turn a into b
// (optimal string alignment).
func editDistance(a, b string) int {
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

// refusedParam returns the server's error when it refused to start a
// session because of a setting the URL passed through pgx: an unknown one
// (SQLSTATE 42704, "unrecognized configuration parameter") or a bad value
// (22023). It names the parameter; a configuration error, not an outage.
func refusedParam(err error) *pgconn.PgError {
	var (
		ce *pgconn.ConnectError
		pe *pgconn.PgError
	)
	if !errors.As(err, &ce) || !errors.As(ce, &pe) || pe.Code != "42704" && pe.Code != "22023" {
		return nil
	}
	return pe
}

// encodeHint is what to do about a password that ends the authority early.
const encodeHint = "if the user name or password holds any of / ? # @ %, percent-encode it (%2F %3F %23 %40 %25)"

// parseURL parses rawURL without quoting a password in its errors.
//
// url.Parse's error quotes the URL, and its cause may quote a piece of the
// password: one with an unencoded / ? or # ends the authority there, so
// "u:S3CR/ETX@host" reads as host u, port S3CR. Only what follows the last
// @ is sure to hold no credentials, so the error of that part alone is
// reported, or if that parses, the hint to percent-encode. A URL that
// parses can still have been cut: an @ in its path, fragment or the name
// of a query parameter (never in a value: prefix=a@b is fine) is the rest
// of a password, which go-redis and pgx would quote or take for a
// database, and is refused the same way.
func parseURL(rawURL string) (*url.URL, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		at := strings.LastIndex(rawURL, "@")
		if at < 0 {
			return nil, invalid("%v", redactErr(err))
		}
		scheme, _, _ := strings.Cut(rawURL, ":")
		if _, err := url.Parse(scheme + "://user" + rawURL[at:]); err != nil {
			return nil, invalid("%v", redactErr(err))
		}
		return nil, invalid("the URL does not parse: %s", encodeHint)
	}
	cut := strings.Contains(u.EscapedPath(), "@") || strings.Contains(u.Fragment, "@")
	for _, pair := range strings.Split(u.RawQuery, "&") {
		name, _, _ := strings.Cut(pair, "=")
		cut = cut || strings.Contains(name, "@")
	}
	if cut {
		return nil, invalid("the URL has an @ after its host: %s", encodeHint)
	}
	return u, nil
}

// redactErr drops the URL that url.Parse's error quotes.
func redactErr(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("%s: %w", ue.Op, ue.Err)
	}
	return err
}
