package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/wire"
)

// Clock says whose clock judges leases and windows.
type Clock int

const (
	// ServerClock (the default) judges by the Redis server's TIME, read
	// inside each script; the now arguments are ignored. One clock per key
	// for the whole fleet.
	ServerClock Clock = iota
	// CallerClock judges by the now each method is given, as the Store
	// contract describes. Use it for tests that move time, or when the
	// application hosts' clocks are trusted more than the server's.
	CallerClock
)

// String names the clock.
func (c Clock) String() string {
	switch c {
	case ServerClock:
		return "ServerClock"
	case CallerClock:
		return "CallerClock"
	}
	return "Clock(" + strconv.Itoa(int(c)) + ")"
}

// DefaultPrefix and DefaultOpTimeout are the zero values' meanings.
const (
	DefaultPrefix    = "idem:"
	DefaultOpTimeout = 2 * time.Second
)

// Options configure New; nil means all defaults.
type Options struct {
	// Prefix is put before every key ("": DefaultPrefix).
	Prefix string
	// OpTimeout bounds each operation, retries included (0:
	// DefaultOpTimeout). An operation that runs out fails with
	// ErrUnavailable; its write may or may not have been applied.
	OpTimeout time.Duration
	// Clock judges leases and windows (zero: ServerClock).
	Clock Clock
	// Logger receives New's warnings (nil: slog.Default()): about an
	// evicting maxmemory-policy, or a policy that could not be read, and
	// about a client without ContextTimeoutEnabled, which loses batching
	// and lets a call cut short hold its pooled connection until
	// ReadTimeout.
	Logger *slog.Logger
	// RequireNoEviction makes New fail with ErrInvalidConfig when a server
	// reports a maxmemory-policy other than noeviction, instead of warning.
	// A server that does not answer CONFIG GET only gets a warning.
	RequireNoEviction bool
	// NoBatch sends every operation on its own. By default operations that
	// arrive while another is on the wire are sent together, as one
	// pipeline (see batch.go); that needs a client with
	// ContextTimeoutEnabled, without which there is no batching anyway.
	NoBatch bool
}

// Store is an idempotency.Store on Redis. It is safe for concurrent use;
// it holds nothing but the caller's client, which the caller closes, and
// starts no goroutine that outlives a call, except that a call cut short
// on a client without ContextTimeoutEnabled leaves one waiting until the
// client's ReadTimeout (see the package documentation).
type Store struct {
	c          redis.UniversalClient
	prefix     string
	timeout    time.Duration
	server     bool
	ctxHonored bool // the client bounds its I/O by the context's deadline
	noBatch    bool

	ring       *ringHome // a Ring's shards as built, to find each key's own
	batch      batcher
	nodes      sync.Map      // Cluster or Ring: *redis.Client of a node -> *batcher (see sweep)
	sweeping   atomic.Bool   // a sweep of nodes is under way
	batches    atomic.Uint64 // pipelines sent by the batcher, for tests
	batchedOps atomic.Uint64 // operations in them
}

var _ idempotency.Store = (*Store)(nil)

// New returns a Store on client: a *redis.Client (single node or, from
// NewFailoverClient, Sentinel), a *redis.ClusterClient, a *redis.Ring (each
// key kept on its own shard, see the package documentation) or any other
// UniversalClient. It checks each server's maxmemory-policy (see the
// package documentation), waiting at most OpTimeout for the answers; an
// unreachable server is not an error here (a warning is logged after that
// wait, or sooner if the dial fails at once), the store fails closed when
// used.
func New(client redis.UniversalClient, opts *Options) (*Store, error) {
	if opts == nil {
		opts = &Options{}
	}
	if client == nil {
		return nil, fmt.Errorf("redisstore: %w: nil client", idempotency.ErrInvalidConfig)
	}
	s := &Store{c: client, prefix: opts.Prefix, timeout: opts.OpTimeout, ctxHonored: honorsContext(client), noBatch: opts.NoBatch}
	s.batch.c = client
	if r, ok := client.(*redis.Ring); ok {
		s.ring = newRingHome(r.Options())
	}
	if s.prefix == "" {
		s.prefix = DefaultPrefix
	}
	switch {
	case s.timeout == 0:
		s.timeout = DefaultOpTimeout
	case s.timeout < 0:
		return nil, fmt.Errorf("redisstore: %w: OpTimeout %v is negative", idempotency.ErrInvalidConfig, s.timeout)
	}
	switch opts.Clock {
	case ServerClock:
		s.server = true
	case CallerClock:
	default:
		return nil, fmt.Errorf("redisstore: %w: unknown %v", idempotency.ErrInvalidConfig, opts.Clock)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	if !s.ctxHonored {
		// Nothing fails, so without a word the cost goes unnoticed.
		log.Warn("redisstore: the client does not have ContextTimeoutEnabled (or is of a type whose options New cannot read): "+
			"operations are not batched, and one cut short by OpTimeout or its ctx holds its pooled connection until ReadTimeout; "+
			"set ContextTimeoutEnabled: true in the client's options", "client", fmt.Sprintf("%T", client))
	}
	if err := s.checkEviction(log, opts.RequireNoEviction); err != nil {
		return nil, err
	}
	return s, nil
}

// honorsContext reports whether client's I/O stops at a context deadline.
// Without it (ContextTimeoutEnabled false) only ReadTimeout would bound a
// call to a paused server, so the store waits for its result apart.
func honorsContext(client redis.UniversalClient) bool {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

func (s *Store) checkEviction(log *slog.Logger, require bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	check := func(ctx context.Context, c redis.UniversalClient, addr string) error {
		v, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
		policy, ok := v["maxmemory-policy"]
		switch {
		case err != nil || !ok:
			log.Warn("redisstore: could not read maxmemory-policy; make sure it is noeviction",
				"addr", addr, "err", err)
		case policy != "noeviction":
			if require {
				return fmt.Errorf("redisstore: %w: %s has maxmemory-policy %s, not noeviction: live records can be evicted",
					idempotency.ErrInvalidConfig, addr, policy)
			}
			log.Warn("redisstore: maxmemory-policy evicts records; a retry may run twice (set noeviction)",
				"addr", addr, "policy", policy)
		}
		return nil
	}
	each := func(ctx context.Context, c *redis.Client) error { return check(ctx, c, c.Options().Addr) }
	switch c := s.c.(type) {
	case *redis.ClusterClient:
		// The masters are known once a node answers. An unreachable
		// cluster is no error here, as an unreachable node is not: the
		// store fails closed when used.
		err := c.ForEachMaster(ctx, each)
		if err != nil && !errors.Is(err, idempotency.ErrInvalidConfig) {
			log.Warn("redisstore: could not read maxmemory-policy; make sure it is noeviction", "err", err)
			return nil
		}
		return err
	case *redis.Ring:
		// A keyless command goes to one shard at random: ask each.
		return c.ForEachShard(ctx, each)
	case *redis.Client:
		return each(ctx, c)
	}
	return check(ctx, s.c, "the server")
}

// call runs script on key within OpTimeout.
func (s *Store) call(ctx context.Context, op string, sc *script, key string, args ...any) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("redisstore: %s: %w", op, err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	keys := []string{s.prefix + key}
	c, err := s.client(keys[0])
	if err != nil {
		return nil, unavailable(op, err)
	}
	var v any
	switch {
	case s.ctxHonored && !s.noBatch:
		v, err = s.batched(ctx, c, sc, keys, args)
	case s.ctxHonored:
		v, err = sc.run(ctx, c, keys, args)
	default:
		v, err = s.detached(ctx, func(ctx context.Context) (any, error) {
			return sc.run(ctx, c, keys, args)
		})
	}
	if err != nil {
		cerr := ctx.Err()
		if dl, ok := ctx.Deadline(); cerr == nil && ok && !time.Now().Before(dl) {
			// The socket's deadline (set from ctx's) can fire a moment
			// before ctx's own timer marks it done.
			cerr = context.DeadlineExceeded
		}
		if cerr != nil && !errors.Is(err, cerr) {
			// A send cut short by the deadline fails with the socket's
			// timeout; say why the deadline was there too.
			err = fmt.Errorf("%w (%w)", err, cerr)
		}
		return nil, unavailable(op, err)
	}
	return v, nil
}

// script is a Lua script with its source, for the EVAL fallback.
type script struct {
	*redis.Script
	src string
	// writes: the script changes the record, so it is sent at most once.
	writes bool
}

func newScript(src string, writes bool) *script {
	return &script{Script: redis.NewScript(src), src: src, writes: writes}
}

// run is redis.Script.Run (EVALSHA, then EVAL on NOSCRIPT), except that a
// script that writes is sent at most once. go-redis sends a command again
// after a read timeout or a connection closed while waiting for the reply
// (MaxRetries), by which time the first send may have been applied: a
// claim re-sent so finds itself and answers "in flight", a Complete or
// Release finds its own work done and answers ErrLeaseLost, which says
// nothing changed. Both would be false answers. Sent once, the call fails
// with ErrUnavailable instead, whose "may have been applied" is the truth.
// A NOSCRIPT reply means nothing ran, so the EVAL that follows it is the
// script's first run.
func (sc *script) run(ctx context.Context, c redis.UniversalClient, keys []string, args []any) (any, error) {
	if !sc.writes {
		return sc.Run(ctx, c, keys, args...).Result()
	}
	v, err := sendOnce(ctx, c, "evalsha", sc.Hash(), keys, args)
	if err != nil && isNoScript(err) {
		v, err = sendOnce(ctx, c, "eval", sc.src, keys, args)
	}
	return v, err
}

func sendOnce(ctx context.Context, c redis.UniversalClient, name, payload string, keys []string, args []any) (any, error) {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, name, payload, len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	a = append(a, args...)
	cmd := redis.NewCmd(ctx, a...)
	cmd.SetFirstKeyPos(3) // Cluster routes by KEYS[1]
	_ = c.Process(ctx, onceCmd{cmd})
	return cmd.Result()
}

// onceCmd is a command that go-redis must not send a second time: its
// NoRetry, part of the redis.Cmder interface, stops the client's retries
// (single node and Cluster alike) once the command may have reached the
// server. Commands that never left (a failed dial) are still retried.
type onceCmd struct{ *redis.Cmd }

func (onceCmd) NoRetry() bool { return true }

// detached runs f and returns when it does or ctx ends, whichever is first.
// f goes on until the client's own timeouts stop it.
func (s *Store) detached(ctx context.Context, f func(context.Context) (any, error)) (any, error) {
	type result struct {
		v   any
		err error
	}
	ch := make(chan result, 1)
	go func() {
		v, err := f(ctx)
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func unavailable(op string, err error) error {
	return fmt.Errorf("redisstore: %s: %w: %w", op, idempotency.ErrUnavailable, err)
}

func leaseLost(op string) error {
	return fmt.Errorf("redisstore: %s: %w", op, idempotency.ErrLeaseLost)
}

// clockArgs returns the time arguments of a script: empty for ServerClock.
func (s *Store) clockArgs(now time.Time) (any, any) {
	if s.server {
		return "", ""
	}
	sec := now.Unix()
	if sec < 0 {
		return int64(0), 0
	}
	return sec, now.Nanosecond()
}

// durArgs splits d (negative counts as 0) into seconds and nanoseconds.
func durArgs(d time.Duration) (int64, int64) {
	d = max(d, 0)
	return int64(d / time.Second), int64(d % time.Second)
}

// Begin implements idempotency.Store.
func (s *Store) Begin(ctx context.Context, key, fingerprint string, now time.Time, lease, retention time.Duration) (idempotency.Record, bool, error) {
	ns, nn := s.clockArgs(now)
	ls, ln := durArgs(lease)
	rs, rn := durArgs(retention)
	v, err := s.call(ctx, "begin", beginScript, key, fingerprint, ns, nn, ls, ln, rs, rn)
	if err != nil {
		return idempotency.Record{}, false, err
	}
	reply, ok := v.([]any)
	if !ok || len(reply) < 6 {
		return idempotency.Record{}, false, badReply("begin", v)
	}
	rec, err := parseRecord(reply)
	if err != nil {
		return idempotency.Record{}, false, unavailable("begin", err)
	}
	code, _ := reply[0].(int64)
	switch code {
	case 1:
		return rec, true, nil
	case 2:
		rec.State = idempotency.Conflict
		rec.Token = 0
		rec.LeaseUntil = time.Time{}
	}
	return rec, false, nil
}

// parseRecord reads fingerprint, state, token, lease end, window end and,
// when present, status, header and body from a script's reply.
func parseRecord(r []any) (idempotency.Record, error) {
	str := func(i int) string {
		if i < len(r) {
			if s, ok := r[i].(string); ok {
				return s
			}
		}
		return ""
	}
	var rec idempotency.Record
	var err error
	rec.Fingerprint = str(1)
	switch str(2) {
	case "P":
		rec.State = idempotency.Processing
	case "D":
		rec.State = idempotency.Done
	}
	if t := str(3); t != "" {
		if rec.Token, err = strconv.ParseUint(t, 10, 64); err != nil {
			return rec, err
		}
	}
	if rec.LeaseUntil, err = parseTime(str(4)); err != nil {
		return rec, err
	}
	if rec.ExpiresAt, err = parseTime(str(5)); err != nil {
		return rec, err
	}
	if rec.State != idempotency.Done {
		return rec, nil
	}
	if rec.Response.Status, err = strconv.Atoi(str(6)); err != nil {
		return rec, err
	}
	if len(r) > 7 && r[7] != nil {
		if rec.Response.Header, err = wire.DecodeHeader([]byte(str(7))); err != nil {
			return rec, err
		}
	}
	if len(r) > 8 && r[8] != nil {
		rec.Response.Body = []byte(str(8))
	}
	return rec, nil
}

// parseTime reads the 20-digit form the scripts compare ("" is the zero
// time).
func parseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if len(s) != 20 {
		return time.Time{}, fmt.Errorf("bad time %q", s)
	}
	sec, err1 := strconv.ParseInt(s[:11], 10, 64)
	nsec, err2 := strconv.ParseInt(s[11:], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return time.Time{}, fmt.Errorf("bad time %q: %w", s, err)
	}
	return time.Unix(sec, nsec), nil
}

func badReply(op string, v any) error {
	return unavailable(op, fmt.Errorf("unexpected script reply %T %v", v, v))
}

// Complete implements idempotency.Store.
func (s *Store) Complete(ctx context.Context, key string, token uint64, resp idempotency.Response, now time.Time, retention time.Duration) error {
	header := wire.EncodeHeader(resp.Header)
	hasBody := "0"
	if resp.Body != nil {
		hasBody = "1"
	}
	ns, nn := s.clockArgs(now)
	rs, rn := durArgs(retention)
	v, err := s.call(ctx, "complete", completeScript, key,
		strconv.FormatUint(token, 10), ns, nn, rs, rn, resp.Status, header, hasBody, resp.Body)
	return s.checkDone("complete", v, err)
}

func (s *Store) checkDone(op string, v any, err error) error {
	if err != nil {
		return err
	}
	switch v {
	case int64(1):
		return nil
	case int64(0):
		return leaseLost(op)
	}
	return badReply(op, v)
}

// Extend implements idempotency.Store.
func (s *Store) Extend(ctx context.Context, key string, token uint64, now time.Time, lease time.Duration) error {
	ns, nn := s.clockArgs(now)
	ls, ln := durArgs(lease)
	v, err := s.call(ctx, "extend", extendScript, key, strconv.FormatUint(token, 10), ns, nn, ls, ln)
	return s.checkDone("extend", v, err)
}

// Release implements idempotency.Store. It leaves a tombstone holding the
// token, so that the next claim of key gets a larger one.
func (s *Store) Release(ctx context.Context, key string, token uint64) error {
	v, err := s.call(ctx, "release", releaseScript, key, strconv.FormatUint(token, 10))
	return s.checkDone("release", v, err)
}

// Get implements idempotency.Store.
func (s *Store) Get(ctx context.Context, key string, now time.Time) (idempotency.Record, error) {
	ns, nn := s.clockArgs(now)
	v, err := s.call(ctx, "get", getScript, key, ns, nn)
	if err != nil {
		return idempotency.Record{}, err
	}
	reply, ok := v.([]any)
	if !ok {
		return idempotency.Record{}, badReply("get", v)
	}
	if len(reply) == 0 {
		return idempotency.Record{}, fmt.Errorf("redisstore: get %q: %w", key, idempotency.ErrNotFound)
	}
	rec, err := parseRecord(reply)
	if err != nil {
		return idempotency.Record{}, unavailable("get", err)
	}
	return rec, nil
}

// Delete implements idempotency.Store. Like Release it keeps the token as a
// tombstone; the key's TTL stays. The deletion is then announced for
// WatchDeletes, within ctx's deadline even if ctx is cancelled meanwhile.
//
// A Delete that fails with ErrUnavailable may have been applied, and may
// still be applied after it returned: one that timed out (OpTimeout, a
// paused or overloaded server, a slow network) can wait in the server's
// socket and run when the server gets to it, with nothing but the server
// to bound how late. Until then the record is still there, and a retry of
// the request replays it; afterwards it is gone, and the next retry runs
// the operation again. A late Delete also removes whatever the key holds
// by then: a claim made meanwhile (after the record expired or was
// released) loses its lease, its holder's Complete fails with
// ErrLeaseLost, and a retry may run the operation alongside it. And a
// late Delete is not announced (its caller had given up), so other
// processes' replay caches keep the record until their TTL. So a failed
// Delete settles nothing, and a replay seen after it does not mean the
// record stays: call Delete again until it succeeds (deleting twice is
// deleting once) before acting on the key. The store does not make a late
// Delete a no-op: Redis has no deadline per command, and a deadline
// checked by the script would compare the caller's clock with the
// server's (a host whose clock lags by more than OpTimeout could delete
// nothing).
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("redisstore: delete: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	k := s.prefix + key
	c, err := s.client(k)
	if err != nil {
		return unavailable("delete", err)
	}
	// Sent once, like the scripts: re-sent after its reply was lost, it
	// would remove a claim made meanwhile, whose holder's result would then
	// never be stored.
	hdel := func(ctx context.Context) (any, error) {
		a := make([]any, 0, 2+len(recordFields))
		a = append(a, "hdel", k)
		for _, f := range recordFields {
			a = append(a, f)
		}
		cmd := redis.NewCmd(ctx, a...)
		cmd.SetFirstKeyPos(1)
		_ = c.Process(ctx, onceCmd{cmd})
		return nil, cmd.Err()
	}
	if _, err := s.bounded(ctx, hdel); err != nil {
		return unavailable("delete", err)
	}
	// Announced for the replay caches of other processes (WatchDeletes).
	// The record is gone either way: a lost announcement only leaves
	// those caches to their TTL. A caller that stops waiting now does not
	// take the announcement with it; the deadline still bounds it, and
	// without ContextTimeoutEnabled it is waited for apart, as the HDEL is.
	dl, _ := ctx.Deadline()
	pctx, pcancel := context.WithDeadline(context.WithoutCancel(ctx), dl)
	defer pcancel()
	_, _ = s.bounded(pctx, func(ctx context.Context) (any, error) {
		return nil, s.announcer(ctx, c, k).Publish(ctx, s.deletesChannel(), key).Err()
	})
	return nil
}

// announcer returns the client that announces the deletion of the Redis
// key k, whose HDEL went through c: on a Cluster or a Ring, the node that
// holds k, which has just answered the HDEL. WatchDeletes listens on each
// of them (see watchNodes), so it hears the announcement from the node it
// was made on: a Cluster passes a PUBLISH on to its other nodes over its
// bus, but not reliably (a node unreachable for a while misses what the
// others published meanwhile, and its subscribers would never know), and
// a Ring's shards share nothing. A Cluster's client would send the
// keyless PUBLISH to any master, maybe one that is down or failing over
// while k's is not. Where the master cannot be told (no slot map yet),
// the client routes the PUBLISH itself.
func (s *Store) announcer(ctx context.Context, c redis.UniversalClient, k string) redis.UniversalClient {
	if cc, ok := c.(*redis.ClusterClient); ok {
		if n, err := cc.MasterForKey(ctx, k); err == nil {
			return n
		}
	}
	return c
}

// client returns the client that commands on the Redis key k go through:
// the store's, except on a Ring, where it is k's own shard. A Ring whose
// heartbeat has marked a shard down sends that shard's keys to the other
// shards, where their records are not: claimed there, a key done or in
// flight on the paused shard would run a second time, a Get would answer
// "not found" and a Delete would delete nothing. So k goes to its own
// shard, the one the ring's consistent hash picks among all its shards as
// built (RingOptions.Addrs), and while that one is down its calls fail
// with ErrUnavailable. Once SetAddrs has changed the ring's shards, a key
// whose shard is live elsewhere, or whose shard is gone while as many
// shards as were built are live, goes where the ring sends it.
func (s *Store) client(k string) (redis.UniversalClient, error) {
	r, ok := s.c.(*redis.Ring)
	if !ok {
		return s.c, nil
	}
	c, err := r.GetShardClientForKey(k)
	if err != nil || s.ring == nil {
		return c, err
	}
	home := s.ring.addrs[s.ring.hash.Get(hashTag(k))]
	addr := c.Options().Addr
	if addr == home {
		return c, nil
	}
	live := r.GetShardClients()
	if len(live) >= len(s.ring.addrs) || slices.ContainsFunc(live, func(c *redis.Client) bool { return c.Options().Addr == home }) {
		return c, nil
	}
	return nil, fmt.Errorf("the key's shard %s is down (its record is there; the ring would send it to %s)", home, addr)
}

// ringHome is a Ring's consistent hash over all its shards as built, live
// or not.
type ringHome struct {
	hash  redis.ConsistentHash
	addrs map[string]string // shard name -> address
}

func newRingHome(o *redis.RingOptions) *ringHome {
	if len(o.Addrs) == 0 || o.NewConsistentHash == nil {
		return nil
	}
	return &ringHome{hash: o.NewConsistentHash(slices.Sorted(maps.Keys(o.Addrs))), addrs: maps.Clone(o.Addrs)}
}

// hashTag is the part of k that a Ring (and a Cluster) hashes: the first
// {...} with something inside, else all of k.
func hashTag(k string) string {
	if i := strings.IndexByte(k, '{'); i >= 0 {
		if j := strings.IndexByte(k[i+1:], '}'); j > 0 {
			return k[i+1 : i+1+j]
		}
	}
	return k
}

// bounded runs f, returning by ctx's deadline: on the caller's goroutine
// when the client bounds its I/O by ctx, apart otherwise (detached).
func (s *Store) bounded(ctx context.Context, f func(context.Context) (any, error)) (any, error) {
	if s.ctxHonored {
		return f(ctx)
	}
	return s.detached(ctx, f)
}

// deletesChannel is the pub/sub channel on which Delete announces the keys
// it deleted.
func (s *Store) deletesChannel() string { return s.prefix + "deleted" }

// watchPing is how long WatchDeletes waits in silence before it pings the
// server; a ping not answered within as long again ends the subscription.
// watchRetry is the pause before subscribing again. Variables for tests.
var (
	watchPing  = 15 * time.Second
	watchRetry = time.Second
)

// WatchDeletes calls forget with each key deleted through a Store of the
// same prefix, in any process, until ctx ends; it then returns ctx.Err().
// It is the feed that keeps an idempotency.ReplayCache in front of this
// store coherent across a fleet:
//
//	go store.WatchDeletes(ctx, cache.Forget, cache.ForgetAll, func(err error) {
//		slog.Warn("deletion feed down; the cache's TTL bounds staleness", "err", err)
//	})
//
// Deletions are announced by Redis pub/sub, which does not keep messages
// for a subscriber that is away. So reset is called each time the
// subscription is made (the first time and after every reconnection): a
// cache must then drop what it holds, since it may have missed deletions.
// report, unless nil, is called with the error each time the subscription
// is lost or cannot be made, about once a second while the server is down
// or refuses it (an ACL user without the channel: NOPERM); it is tried
// again until ctx ends. While it is down (a broken connection is noticed
// at once, a silent one within 2 × 15 s) deletions are seen only when the
// cache's TTL runs out, which stays the bound on staleness. forget, reset
// and report run on WatchDeletes's goroutine, one at a time.
//
// Delete announces through the node that holds the key, which has just
// answered its HDEL. On a single node WatchDeletes holds one connection of
// its own (a pub/sub subscription). On a Ring, whose shards share nothing,
// it holds one on each live shard, all made again (with a reset, since
// announcements on a shard it did not listen on were missed) when the
// ring marks a shard down or up or its addresses change. On a Cluster it
// holds one on each master, so that it hears each announcement from the
// master it was made on: the cluster's bus passes a PUBLISH on to every
// node, but a node that was unreachable for a while (paused, cut off)
// misses some of what the others published meanwhile, and a subscriber
// connected to it all along would never know. The bus's copies arrive
// too, so on a Cluster forget may be called for a key once per master.
// The masters are looked up again (CLUSTER SLOTS) every 15 s and after a
// subscription fails; when they change (failover, resharding) the
// subscriptions are made again, with a reset. Where there are several
// subscriptions, each is reported and made again on its own when it
// fails, and reset is called when it is back (what its node announced
// meanwhile was missed), while the others go on.
//
// An ACL user needs SUBSCRIBE and PUBLISH on the channel Prefix+"deleted"
// (for example &idem:deleted); a Delete whose announcement is refused
// still succeeds, and says nothing. When ctx ends WatchDeletes
// returns at once, or, while it is connecting to or pinging a server that
// does not answer, when that exchange times out: within OpTimeout with a
// client whose ContextTimeoutEnabled is set (15 s for the connection
// go-redis makes again by itself after a broken receive), else within the
// client's ReadTimeout.
func (s *Store) WatchDeletes(ctx context.Context, forget func(key string), reset func(), report func(error)) error {
	rep := func(err error) {
		if report != nil {
			report(fmt.Errorf("redisstore: watch deletes: %w", err))
		}
	}
	for {
		err := s.watchOnce(ctx, forget, reset, rep)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, errShardsChanged) {
			continue // nothing failed: listen on the new nodes at once
		}
		rep(err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(watchRetry):
		}
	}
}

// errShardsChanged ends the subscriptions on a Ring's live shards or a
// Cluster's masters when those are no longer the ones listened on.
var errShardsChanged = errors.New("the nodes to listen on changed")

// watchOnce runs one subscription (or one on each node) until it fails,
// the nodes to listen on change, or ctx ends; it never returns a nil
// error.
func (s *Store) watchOnce(ctx context.Context, forget func(string), reset func(), report func(error)) error {
	switch c := s.c.(type) {
	case *redis.Ring:
		return s.watchRing(ctx, c, forget, reset, report)
	case *redis.ClusterClient:
		return s.watchCluster(ctx, c, forget, reset, report)
	}
	return s.receive(ctx, s.c, reset, forget)
}

// watchRing listens on each live shard of ring until the live shards
// change (one is marked down or up again, or SetAddrs); the ring's
// heartbeat decides which are live, so it looks as often.
func (s *Store) watchRing(ctx context.Context, ring *redis.Ring, forget func(string), reset func(), report func(error)) error {
	shards := ring.GetShardClients()
	if len(shards) == 0 {
		return errors.New("no live shard in the ring")
	}
	changed := func() bool { return !sameShards(shards, ring.GetShardClients()) }
	return s.watchNodes(ctx, shards, ring.Options().HeartbeatFrequency, changed, forget, reset, report)
}

// watchCluster listens on each master of cc until the masters change.
// Delete announces on the key's master, and a subscriber there hears it
// from that node itself: the cluster's bus passes a PUBLISH on to the
// other nodes, but not reliably (a node unreachable for longer than half
// the node timeout, paused or cut off, misses some of what the others
// published meanwhile, and its subscribers, still connected, would never
// know). The masters are looked up again (a CLUSTER SLOTS, see masters)
// each watchPing, for those that a resharding adds, and after a
// subscription fails, for a failover.
func (s *Store) watchCluster(ctx context.Context, cc *redis.ClusterClient, forget func(string), reset func(), report func(error)) error {
	masters, err := s.masters(ctx, cc)
	if err != nil {
		return err
	}
	changed := func() bool {
		now, err := s.masters(ctx, cc)
		return err == nil && !sameShards(masters, now)
	}
	return s.watchNodes(ctx, masters, watchPing, changed, forget, reset, report)
}

// masters returns cc's masters, from its slot map loaded anew, within
// OpTimeout.
func (s *Store) masters(ctx context.Context, cc *redis.ClusterClient) ([]*redis.Client, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var mu sync.Mutex
	var masters []*redis.Client
	err := cc.ForEachMaster(ctx, func(_ context.Context, n *redis.Client) error {
		mu.Lock()
		masters = append(masters, n)
		mu.Unlock()
		return nil
	})
	if err == nil && len(masters) == 0 {
		err = errors.New("no master in the cluster's slot map")
	}
	return masters, err
}

// watchNodes subscribes on each of nodes, each on a goroutine of its own,
// and passes on what they receive until changed (asked every interval,
// and after a subscription fails) says the nodes to listen on are others,
// or ctx ends; it then returns errShardsChanged or ctx's error. A node's
// subscription that fails is reported and made again watchRetry later,
// on its own: the others' go on, since each node's announcements come
// from that node. reset is called once every node has confirmed its
// subscription, and then each time one of them confirms it again (what
// its node announced meanwhile was missed).
func (s *Store) watchNodes(ctx context.Context, nodes []*redis.Client, every time.Duration, changed func() bool,
	forget func(string), reset func(), report func(error)) error {
	type event struct {
		node int
		key  string
		sub  bool // the node's subscription is made
		err  error
	}
	events := make(chan event)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for i, c := range nodes {
		send := func(e event) {
			e.node = i
			select {
			case events <- e:
			case <-ctx.Done():
			}
		}
		wg.Go(func() {
			for {
				err := s.receive(ctx, c, func() { send(event{sub: true}) }, func(k string) { send(event{key: k}) })
				if ctx.Err() != nil {
					return
				}
				send(event{err: fmt.Errorf("%s: %w", c.Options().Addr, err)})
				select {
				case <-ctx.Done():
					return
				case <-time.After(watchRetry):
				}
			}
		})
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	subscribed := make([]bool, len(nodes))
	pending := len(nodes)
	for {
		select {
		case e := <-events:
			switch {
			case e.err != nil:
				report(e.err)
				if changed() {
					return errShardsChanged
				}
			case e.sub:
				// The first reset waits for every node; a node that
				// subscribes again after its subscription broke resets at
				// once, whatever the others do: what it announced in
				// between was missed.
				again := subscribed[e.node]
				if !again {
					subscribed[e.node] = true
					pending--
				}
				if pending == 0 || again {
					reset()
				}
			default:
				forget(e.key)
			}
		case <-tick.C:
			if changed() {
				return errShardsChanged
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// sameShards reports whether a and b list the same shard clients, in any
// order: SetAddrs with the ring's own addresses keeps its shards but lists
// them anew, from a map.
func sameShards(a, b []*redis.Client) bool {
	return len(a) == len(b) && !slices.ContainsFunc(b, func(c *redis.Client) bool { return !slices.Contains(a, c) })
}

// receive subscribes through c and passes on what comes, calling
// subscribed each time the subscription is made, until it fails or ctx
// ends; it never returns a nil error.
func (s *Store) receive(ctx context.Context, c redis.UniversalClient, subscribed func(), forget func(string)) error {
	// Without channels, no connection is made yet: the AfterFunc below is
	// in place before the first exchange.
	sub := c.Subscribe(ctx)
	defer sub.Close()
	// go-redis bounds I/O by deadlines, not by ctx: closing the
	// subscription is what ends a receive under way. Close waits for an
	// exchange that holds the subscription's lock (making the connection,
	// making it again after a failed receive, a ping), so every call gets
	// a deadline of its own.
	stop := context.AfterFunc(ctx, func() { _ = sub.Close() })
	defer stop()
	bounded := func(d time.Duration, f func(context.Context) error) error {
		ctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		return f(ctx)
	}
	err := bounded(s.timeout, func(ctx context.Context) error { return sub.Subscribe(ctx, s.deletesChannel()) })
	if err != nil {
		return err
	}
	pinged := false
	for {
		var msg any
		err := bounded(watchPing, func(ctx context.Context) (err error) {
			msg, err = sub.ReceiveTimeout(ctx, watchPing)
			return err
		})
		if err != nil {
			var ne net.Error
			if ctx.Err() != nil || !errors.As(err, &ne) || !ne.Timeout() {
				return err
			}
			if pinged {
				return fmt.Errorf("no answer to a ping within %v: %w", watchPing, err)
			}
			pinged = true
			if err := bounded(s.timeout, func(ctx context.Context) error { return sub.Ping(ctx) }); err != nil {
				return err
			}
			continue
		}
		pinged = false
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				subscribed()
			}
		case *redis.Message:
			forget(m.Payload)
		}
	}
}

// Key returns the Redis key that holds key's record, for operators.
func (s *Store) Key(key string) string { return s.prefix + key }

// String describes the store for logs.
func (s *Store) String() string {
	var b strings.Builder
	b.WriteString("redisstore(prefix=")
	b.WriteString(strconv.Quote(s.prefix))
	if s.server {
		b.WriteString(", ServerClock)")
	} else {
		b.WriteString(", CallerClock)")
	}
	return b.String()
}
