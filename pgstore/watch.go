package pgstore

import (
	"context"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/archlab/idempotency"
)

const (
	// maxIdentLen is PostgreSQL's identifier limit (NAMEDATALEN - 1),
	// which channel names share: pg_notify refuses a longer one, and
	// LISTEN truncates it.
	maxIdentLen = 63
	// maxAnnouncedKey is the longest key Delete announces by name: a
	// NOTIFY payload must be shorter than 8000 bytes, and a key goes as
	// hex (keys are bytes; a payload is text).
	maxAnnouncedKey = (8000 - 1) / 2
	// resetPayload announces the deletion of a longer key: the watcher
	// calls reset. It is not hex, so no key encodes to it.
	resetPayload = "*"
)

// announceExpr is Delete's payload for the deleted row's key.
var announceExpr = "CASE WHEN octet_length(key) <= " + strconv.Itoa(maxAnnouncedKey) +
	" THEN encode(key, 'hex') ELSE " + quoteLiteral(resetPayload) + " END"

// watchPing is how long WatchDeletes waits in silence before it pings the
// server; watchRetry is the pause before listening again after a failure.
// Variables for tests.
var (
	watchPing  = 15 * time.Second
	watchRetry = time.Second
)

// watchCloseTimeout bounds the goodbye sent on the listening connection
// when it is closed.
const watchCloseTimeout = time.Second

// deletesChannel is the NOTIFY channel of a store's deletions:
// "<schema>.<table>.deleted" (schema and table hold no dots, so distinct
// stores have distinct names), or, when that is longer than an identifier
// may be, its first bytes and a hash of the whole.
func deletesChannel(schema, table string) string {
	ch := schema + "." + table + ".deleted"
	if len(ch) <= maxIdentLen {
		return ch
	}
	h := fnv.New64a()
	h.Write([]byte(ch))
	suffix := fmt.Sprintf(".%016x", h.Sum64())
	return ch[:maxIdentLen-len(suffix)] + suffix
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// WatchDeletes calls forget with each key deleted through a Store of the
// same Schema and Table on the same database, in any process, until ctx
// ends; it then returns ctx.Err(). It is the feed that keeps an
// idempotency.ReplayCache in front of this store coherent across a fleet:
//
//	go store.WatchDeletes(ctx, cache.Forget, cache.ForgetAll, func(err error) {
//		log.Warn("deletion feed down; the cache's TTL bounds staleness", "err", err)
//	})
//
// Deletions are announced by NOTIFY in Delete's own statement, so a
// deletion is announced if and only if it commits, and WatchDeletes
// receives them by LISTEN on a connection of its own, taken from the pool
// and then kept out of it (Hijack): one connection per watcher beyond the
// pool's MaxConns. PostgreSQL keeps no notification for a session that is
// not listening, so reset is called each time LISTEN succeeds (the first
// time and after every reconnection): a cache must then drop what it
// holds, since it may have missed deletions. reset is also called for the
// deletion of a key longer than 3999 bytes, too long for a notification.
// report, unless nil, is called with an error wrapping
// idempotency.ErrUnavailable each time the connection is lost or cannot be
// made, about once a second while the server is down; it is tried again
// until ctx ends. While it is down (a broken connection is noticed at
// once, a silent one within 15 s plus OpTimeout, by a ping) deletions are
// seen only when the cache's TTL runs out, which stays the bound on
// staleness. forget, reset and report run on WatchDeletes's goroutine, one
// at a time. When ctx ends WatchDeletes closes its connection and returns
// at once.
func (s *Store) WatchDeletes(ctx context.Context, forget func(key string), reset func(), report func(error)) error {
	for {
		err := s.watchOnce(ctx, forget, reset)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if report != nil {
			report(fmt.Errorf("pgstore: watch deletes: %w: %w", idempotency.ErrUnavailable, err))
		}
		t := time.NewTimer(watchRetry)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// watchOnce listens on one connection until it fails or ctx ends; it
// never returns a nil error.
func (s *Store) watchOnce(ctx context.Context, forget func(string), reset func()) error {
	conn, err := s.listen(ctx)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), watchCloseTimeout)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	reset()
	for {
		// pgx ends a wait by a read deadline and leaves the connection
		// usable: a quiet one is pinged, so that a silently dead
		// connection (a host or a path gone without a reset) is noticed.
		wctx, cancel := context.WithTimeout(ctx, watchPing)
		n, err := conn.WaitForNotification(wctx)
		quiet := wctx.Err() != nil
		cancel()
		switch {
		case err == nil:
			if key, err := hex.DecodeString(n.Payload); err == nil {
				forget(string(key))
			} else {
				reset() // resetPayload: a key too long to announce
			}
		case ctx.Err() != nil:
			return ctx.Err()
		case quiet && !conn.IsClosed():
			pctx, cancel := context.WithTimeout(ctx, s.timeout)
			err := conn.Ping(pctx)
			cancel()
			if err != nil {
				return fmt.Errorf("ping: %w", err)
			}
		default:
			return err
		}
	}
}

// listen takes a connection out of the pool and listens on the channel,
// within OpTimeout. A connection that turns out dead (the pool still held
// it when the server restarted) is dropped for the next one at once: else
// each would cost a failure reported and a second more without the feed.
func (s *Store) listen(ctx context.Context) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	for {
		pc, err := s.pool.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		conn := pc.Hijack()
		_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.channel}.Sanitize())
		if err == nil {
			return conn, nil
		}
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), watchCloseTimeout)
		_ = conn.Close(cctx)
		ccancel()
		if ctx.Err() != nil || !pgconn.SafeToRetry(err) && !connLost(err) {
			return nil, fmt.Errorf("listen: %w", err)
		}
	}
}
