package pgstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/wire"
)

// Clock says whose clock judges leases and windows.
type Clock int

const (
	// CallerClock judges by the now passed to each method (the default).
	CallerClock Clock = iota
	// ServerClock judges by the database server's statement_timestamp()
	// and ignores every now argument.
	ServerClock
)

// Options configure New; nil means defaults.
type Options struct {
	// Schema holds the table ("": "public"). It is created by Migrate if
	// missing.
	Schema string
	// Table is the records table ("": "idempotency_keys"). The sequence
	// <Table>_token_seq, the table <Table>_schema_version and the index
	// <Table>_expires_at_idx go with it. Schema and Table must be
	// lower-case SQL identifiers ([a-z_][a-z0-9_]*), Table at most 40 bytes
	// so the derived names fit. Stores sharing a Schema need Tables that
	// are not each other's derived names ("a" and "a_token_seq" clash):
	// Migrate refuses a name that is taken, with ErrInvalidConfig.
	Table string
	// Clock is CallerClock (zero) or ServerClock; see the package doc.
	Clock Clock
	// SweepBatch is the number of rows one Sweep statement deletes at most
	// (0: 1000).
	SweepBatch int
	// OpTimeout bounds each operation, retries included, and each Sweep
	// statement (0: DefaultOpTimeout), whatever ctx's deadline: the Guard
	// stores a result with a ctx that is never cancelled, and a request's
	// ctx often has no deadline, so without it a server that stopped
	// answering would hold the call for good. An operation that runs out
	// fails with ErrUnavailable; its write may or may not have been applied.
	// SchemaVersion and CheckSchema are bounded by it too; Migrate is
	// bounded by its ctx only (a migration may take long), but for the
	// ROLLBACK of a migration that failed, which gets OpTimeout.
	OpTimeout time.Duration
}

// DefaultOpTimeout is the zero OpTimeout's meaning. It leaves room for a
// statement that waits on a row lock held by a short transaction.
const DefaultOpTimeout = 5 * time.Second

// Store is an idempotency.Store on PostgreSQL. It is safe for concurrent
// use; it holds no connection of its own (but WatchDeletes, while it runs)
// and starts no goroutine.
type Store struct {
	pool    *pgxpool.Pool
	clock   Clock
	batch   int
	timeout time.Duration

	schema, table string // validated, unquoted
	channel       string // of Delete's notifications; see deletesChannel
	lockKey       int64  // advisory lock of Migrate

	retries atomic.Int64 // statements run again (serialization, deadlock, stale snapshot, lost connection), for tests

	beginSQL, tokenSQL, completeSQL, extendSQL, releaseSQL, getSQL, deleteSQL, sweepSQL string
	names                                                                               *strings.Replacer
}

var _ idempotency.Store = (*Store)(nil)

const (
	defaultSchema = "public"
	defaultTable  = "idempotency_keys"
	defaultBatch  = 1000
	maxTableLen   = 40
	// maxBackoff bounds the pause before a statement is run again after a
	// retryable failure; the pauses double from a millisecond up to it.
	maxBackoff = 32 * time.Millisecond
)

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// New returns a Store using pool. It validates opts and prepares the SQL;
// it does not touch the database (see Migrate).
func New(pool *pgxpool.Pool, opts *Options) (*Store, error) {
	if pool == nil {
		return nil, fmt.Errorf("pgstore: %w: pool is nil", idempotency.ErrInvalidConfig)
	}
	if opts == nil {
		opts = &Options{}
	}
	s := &Store{pool: pool, clock: opts.Clock, batch: opts.SweepBatch, timeout: opts.OpTimeout, schema: opts.Schema, table: opts.Table}
	if s.schema == "" {
		s.schema = defaultSchema
	}
	if s.table == "" {
		s.table = defaultTable
	}
	if s.batch == 0 {
		s.batch = defaultBatch
	}
	if s.timeout == 0 {
		s.timeout = DefaultOpTimeout
	}
	switch {
	case !identRE.MatchString(s.schema) || len(s.schema) > 63:
		return nil, fmt.Errorf("pgstore: %w: Schema %q is not a lower-case identifier of at most 63 bytes", idempotency.ErrInvalidConfig, s.schema)
	case !identRE.MatchString(s.table) || len(s.table) > maxTableLen:
		return nil, fmt.Errorf("pgstore: %w: Table %q is not a lower-case identifier of at most %d bytes", idempotency.ErrInvalidConfig, s.table, maxTableLen)
	case s.clock != CallerClock && s.clock != ServerClock:
		return nil, fmt.Errorf("pgstore: %w: unknown Clock %d", idempotency.ErrInvalidConfig, s.clock)
	case s.batch < 0:
		return nil, fmt.Errorf("pgstore: %w: SweepBatch %d is negative", idempotency.ErrInvalidConfig, s.batch)
	case s.timeout < 0:
		return nil, fmt.Errorf("pgstore: %w: OpTimeout %v is negative", idempotency.ErrInvalidConfig, s.timeout)
	}
	s.lockKey = advisoryKey(s.schema, s.table)
	s.channel = deletesChannel(s.schema, s.table)
	s.names = strings.NewReplacer(
		"{{schema}}", pgx.Identifier{s.schema}.Sanitize(),
		"{{table}}", pgx.Identifier{s.schema, s.table}.Sanitize(),
		"{{seq}}", pgx.Identifier{s.schema, s.table + "_token_seq"}.Sanitize(),
		"{{versions}}", pgx.Identifier{s.schema, s.table + "_schema_version"}.Sanitize(),
		"{{expires_index}}", pgx.Identifier{s.table + "_expires_at_idx"}.Sanitize(),
	)
	s.prepareSQL()
	return s, nil
}

// prepareSQL writes the statements for the table and the clock. {{now}} is
// the last parameter in caller mode, the server's statement time otherwise,
// so that server mode simply passes one argument fewer.
func (s *Store) prepareSQL() {
	const serverNow = "(extract(epoch FROM statement_timestamp()) * 1000000)::bigint * 1000"
	sql := func(q string, nowParam int) string {
		now := fmt.Sprintf("$%d::bigint", nowParam)
		if s.clock == ServerClock {
			now = serverNow
		}
		return strings.ReplaceAll(s.names.Replace(q), "{{now}}", "("+now+")")
	}
	// $1 key, $2 fingerprint, $3 lease, $4 retention, $5 now.
	//
	// cur reads the row in the statement's snapshot. When it is live and
	// not claimable (a replay, in flight, a conflict) that is the answer,
	// and the INSERT does not run: no row lock, no transaction id, no WAL
	// flush at commit. Otherwise the INSERT ... ON CONFLICT claims the key,
	// judging the latest committed row under its lock. If a concurrent
	// writer got there first, the claim is empty and cur is stale (absent or
	// claimable): Begin sees that and runs the statement again, with a new
	// snapshot.
	//
	// The token is drawn under the key's row lock, after every earlier row
	// of the key has ended, so that it is larger than all their tokens:
	// by DO UPDATE, under the lock of the row it replaces, and for a new
	// row by tokenSQL, the next statement of the same transaction, since
	// the inserted row holds 0 (no token) until then. An INSERT computes its
	// row, nextval included, before it meets the key's unique index; a
	// token drawn there was smaller than that of a claim made, ended and
	// swept while the INSERT waited (on a row lock, or paused), and the
	// INSERT then found no row and kept it (idemcheck's store mode caught
	// it with Release deleting the row, TestLateBeginAfterReleaseGetsLargerToken
	// with Sweep deleting an expired one).
	s.beginSQL = sql(`WITH cur AS (
	SELECT fingerprint, state, token, lease_until, expires_at, status, headers, body,
		expires_at <= {{now}} OR (state = 'PROCESSING' AND fingerprint = $2::bytea AND lease_until <= {{now}}) AS claimable
	FROM {{table}} WHERE key = $1::bytea
), claim AS (
	INSERT INTO {{table}} AS r (key, fingerprint, state, token, lease_until, expires_at)
	SELECT $1::bytea, $2::bytea, 'PROCESSING', 0, {{now}} + $3::bigint, {{now}} + $4::bigint
	WHERE NOT EXISTS (SELECT FROM cur WHERE NOT claimable)
	ON CONFLICT (key) DO UPDATE SET
		fingerprint = excluded.fingerprint,
		state = 'PROCESSING',
		token = nextval('{{seq}}'),
		lease_until = excluded.lease_until,
		expires_at = CASE WHEN r.expires_at <= {{now}} THEN excluded.expires_at
			ELSE greatest(r.expires_at, excluded.lease_until) END,
		status = NULL, headers = NULL, body = NULL
	WHERE r.expires_at <= {{now}}
		OR (r.state = 'PROCESSING' AND r.fingerprint = excluded.fingerprint AND r.lease_until <= {{now}})
	RETURNING r.fingerprint, r.state, r.token, r.lease_until, r.expires_at, r.status, r.headers, r.body,
		true AS claimed, false AS claimable
)
SELECT * FROM claim
UNION ALL
SELECT fingerprint, state, token, lease_until, expires_at, status, headers, body, false, claimable
FROM cur WHERE NOT EXISTS (SELECT FROM claim)`, 5)
	// $1 key. It finds a row only after beginSQL inserted one, in the same
	// transaction: other transactions never see a token of 0.
	s.tokenSQL = sql(`UPDATE {{table}} SET token = nextval('{{seq}}') WHERE key = $1::bytea AND token = 0 RETURNING token`, 0)
	// $1 key, $2 token, $3 status, $4 headers, $5 body, $6 retention, $7 now.
	s.completeSQL = sql(`UPDATE {{table}} SET state = 'DONE', status = $3, headers = $4, body = $5,
	lease_until = NULL, expires_at = {{now}} + $6::bigint
WHERE key = $1 AND token = $2 AND state = 'PROCESSING'`, 7)
	// $1 key, $2 token, $3 lease, $4 now.
	s.extendSQL = sql(`UPDATE {{table}} SET lease_until = {{now}} + $3::bigint,
	expires_at = greatest(expires_at, {{now}} + $3::bigint)
WHERE key = $1 AND token = $2 AND state = 'PROCESSING'`, 4)
	// Release and Delete leave a tombstone: the row stays, done and
	// already expired, with the claim's token, until Sweep removes it. A
	// Release run again after its connection broke finds it and knows it
	// was applied (see Release).
	s.releaseSQL = sql(`UPDATE {{table}} SET state = 'DONE', lease_until = NULL, expires_at = 0,
	status = NULL, headers = NULL, body = NULL
WHERE key = $1 AND token = $2 AND state = 'PROCESSING'`, 0)
	// Delete announces the key for WatchDeletes in the same statement:
	// NOTIFY is delivered when the transaction commits, and not at all if
	// it rolls back. An absent key changes no row and announces nothing.
	s.deleteSQL = sql(`WITH d AS (
	UPDATE {{table}} SET state = 'DONE', lease_until = NULL, expires_at = 0,
		status = NULL, headers = NULL, body = NULL
	WHERE key = $1
	RETURNING key
)
SELECT pg_notify(`+quoteLiteral(s.channel)+`, `+announceExpr+`) FROM d`, 0)
	// $1 key, $2 now.
	s.getSQL = sql(`SELECT fingerprint, state, token, lease_until, expires_at, status, headers, body
FROM {{table}} WHERE key = $1 AND expires_at > {{now}}`, 2)
	// $1 batch, $2 now. The TID scan deletes exactly the rows locked by the
	// subquery; rows locked by a writer are left for the next sweep.
	s.sweepSQL = sql(`DELETE FROM {{table}} WHERE ctid = ANY (ARRAY(
	SELECT ctid FROM {{table}} WHERE expires_at <= {{now}}
	LIMIT $1 FOR UPDATE SKIP LOCKED))`, 2)
}

// args appends now to the statement's arguments in caller mode.
func (s *Store) args(now time.Time, args ...any) []any {
	if s.clock == CallerClock {
		args = append(args, now.UnixNano())
	}
	return args
}

// errBeginRace: Begin did not claim the key, because a transaction that
// committed after the statement's snapshot changed or inserted its row,
// and the snapshot's row is no answer. A new statement sees the change.
var errBeginRace = errors.New("pgstore: begin raced with a concurrent insert")

// rerun says when run may run an operation's statement again after a
// failure of its connection.
type rerun int

const (
	// rerunUnsent: only when pgx reports that nothing was sent
	// (pgconn.SafeToRetry). For Delete, whose second run could delete a
	// claim made after the first had applied.
	rerunUnsent rerun = iota
	// rerunLost: also when the connection broke once the statement was
	// sent, so that it may have been applied: running it again does no harm
	// (Get, Sweep; Begin, which then meets its own claim and answers in
	// flight, as a second request would; Extend, which sets the same lease
	// again), or f tells the two cases apart (Complete, Release).
	rerunLost
)

// run calls f until it succeeds, fails for good or OpTimeout has passed,
// and wraps failures of the database with ErrUnavailable. f's argument
// again says that an earlier call may have been applied.
//
// A serialization failure, a deadlock or errBeginRace applied nothing (the
// statement's transaction was rolled back, or Begin claimed nothing), so f
// runs again, after a pause that doubles and is jittered: under
// SERIALIZABLE many statements on distinct keys fail together (predicate
// locks cover index pages, not keys), and a few quick tries in step were
// not enough for 64 concurrent callers, which lost Complete's result to a
// serialization failure.
//
// A statement whose connection had broken (see connLost) runs again at
// once, as policy allows: the pool's next connection may be sound. After a
// restart of the server every connection the pool held is dead, and each
// failed one call; they now fail one try each, and the pool drops them. A
// failure to connect is not retried, so that a server that is down fails
// calls at once.
func (s *Store) run(ctx context.Context, op string, policy rerun, f func(ctx context.Context, again bool) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pgstore: %s: %w", op, err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	backoff := time.Millisecond
	again := false
	for {
		err := f(ctx, again)
		if err == nil || errors.Is(err, idempotency.ErrLeaseLost) || errors.Is(err, idempotency.ErrNotFound) {
			return err
		}
		if ctx.Err() != nil {
			return s.unavailable(op, err)
		}
		switch {
		case pgconn.SafeToRetry(err):
			s.retries.Add(1)
			continue
		case policy == rerunLost && connLost(err):
			s.retries.Add(1)
			again = true
			continue
		case !retryable(err):
			return s.unavailable(op, err)
		}
		s.retries.Add(1)
		t := time.NewTimer(backoff/2 + rand.N(backoff/2+1))
		backoff = min(2*backoff, maxBackoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return s.unavailable(op, errors.Join(err, ctx.Err()))
		case <-t.C:
		}
	}
}

// unavailable wraps a failure of op with ErrUnavailable. A store used
// before Migrate created its table and sequence fails the same way, closed,
// but says what to do: a bare "relation does not exist" sends the reader
// looking for a bug.
func (s *Store) unavailable(op string, err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "3F000") { // undefined_table, invalid_schema_name
		return fmt.Errorf("pgstore: %s: %w: table %s.%s or its token sequence does not exist: run Store.Migrate (or idemproxy -migrate): %w",
			op, idempotency.ErrUnavailable, s.schema, s.table, err)
	}
	return fmt.Errorf("pgstore: %s: %w: %w", op, idempotency.ErrUnavailable, err)
}

// retryable reports the failures that applied nothing and may pass if the
// statement runs again a little later.
func retryable(err error) bool {
	if errors.Is(err, errBeginRace) {
		return true
	}
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
}

// connLost reports a failure of the connection that a sent statement was
// on (its end of file, a reset, a network error, or the server's FATAL
// notice before it closes the session, as a server that shuts down sends):
// the statement may or may not have been applied. pgx does not mark these
// SafeToRetry, even when, as after a restart of the server, the connection
// was dead before the statement was written. A failure to connect is not
// one (nothing was sent, but the server is likely down).
func connLost(err error) bool {
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		// The unlocalized severity (PostgreSQL 9.6 and later): Severity
		// is in the server's lc_messages.
		sev := pe.SeverityUnlocalized
		if sev == "" {
			sev = pe.Severity
		}
		return sev == "FATAL" || sev == "PANIC"
	}
	var ne net.Error
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, pgconn.ErrConnClosed) ||
		errors.As(err, &ne)
}

// Begin implements idempotency.Store.
func (s *Store) Begin(ctx context.Context, key, fingerprint string, now time.Time, lease, retention time.Duration) (idempotency.Record, bool, error) {
	var (
		rec     idempotency.Record
		claimed bool
	)
	err := s.run(ctx, "begin", rerunLost, func(ctx context.Context, _ bool) error {
		var (
			row       recordRow
			claimable bool
		)
		// One round trip, one implicit transaction.
		var b pgx.Batch
		b.Queue(s.beginSQL, s.args(now, []byte(key), []byte(fingerprint), span(lease), span(retention))...)
		b.Queue(s.tokenSQL, []byte(key))
		br := s.pool.SendBatch(ctx, &b)
		err := br.QueryRow().Scan(append(row.dest(), &claimed, &claimable)...)
		if err == nil {
			var token int64
			switch err = br.QueryRow().Scan(&token); {
			case err == nil:
				row.token = token
			case errors.Is(err, pgx.ErrNoRows): // no row inserted
				err = nil
			}
		}
		// Close waits for the commit, which may fail too (SERIALIZABLE).
		if cerr := br.Close(); err == nil || errors.Is(err, pgx.ErrNoRows) && cerr != nil {
			err = cerr
		}
		if errors.Is(err, pgx.ErrNoRows) || err == nil && !claimed && claimable {
			return errBeginRace
		}
		if err != nil {
			return err
		}
		rec, err = row.record()
		return err
	})
	if err != nil {
		return idempotency.Record{}, false, err
	}
	if !claimed && rec.Fingerprint != fingerprint {
		return idempotency.Record{State: idempotency.Conflict, Fingerprint: rec.Fingerprint, ExpiresAt: rec.ExpiresAt}, false, nil
	}
	return rec, claimed, nil
}

// Complete implements idempotency.Store.
func (s *Store) Complete(ctx context.Context, key string, token uint64, resp idempotency.Response, now time.Time, retention time.Duration) error {
	args := s.completeArgs(key, token, resp, now, retention)
	return s.run(ctx, "complete", rerunLost, func(ctx context.Context, again bool) error {
		err := s.affected(s.pool.Exec(ctx, s.completeSQL, args...))
		if again && errors.Is(err, idempotency.ErrLeaseLost) {
			// Only this claim's Complete makes a record Done with its
			// token and a window (a tombstone's is over).
			return s.appliedBefore(ctx, err, key, token,
				"EXISTS (SELECT FROM {{table}} WHERE key = $1 AND token = $2 AND state = 'DONE' AND expires_at <> 0)")
		}
		return err
	})
}

// CompleteTx is Complete inside the caller's transaction: the result is
// stored if and only if tx commits. It is not retried (a failed statement
// aborts tx); an error wraps ErrLeaseLost, ErrUnavailable or ctx's error.
// After ErrLeaseLost tx is still usable, and the caller should roll it back:
// another holder owns the key.
func (s *Store) CompleteTx(ctx context.Context, tx pgx.Tx, key string, token uint64, resp idempotency.Response, now time.Time, retention time.Duration) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pgstore: complete tx: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	err := s.affected(tx.Exec(ctx, s.completeSQL, s.completeArgs(key, token, resp, now, retention)...))
	if err != nil && !errors.Is(err, idempotency.ErrLeaseLost) {
		return s.unavailable("complete tx", err)
	}
	return err
}

func (s *Store) completeArgs(key string, token uint64, resp idempotency.Response, now time.Time, retention time.Duration) []any {
	return s.args(now, []byte(key), int64(token), int64(resp.Status), wire.EncodeHeader(resp.Header), resp.Body, span(retention))
}

// affected turns an UPDATE or DELETE that changed no row into ErrLeaseLost.
func (s *Store) affected(tag pgconn.CommandTag, err error) error {
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgstore: %w", idempotency.ErrLeaseLost)
	}
	return nil
}

// Extend implements idempotency.Store.
func (s *Store) Extend(ctx context.Context, key string, token uint64, now time.Time, lease time.Duration) error {
	return s.run(ctx, "extend", rerunLost, func(ctx context.Context, _ bool) error {
		return s.affected(s.pool.Exec(ctx, s.extendSQL, s.args(now, []byte(key), int64(token), span(lease))...))
	})
}

// Release implements idempotency.Store.
func (s *Store) Release(ctx context.Context, key string, token uint64) error {
	return s.run(ctx, "release", rerunLost, func(ctx context.Context, again bool) error {
		err := s.affected(s.pool.Exec(ctx, s.releaseSQL, []byte(key), int64(token)))
		if again && errors.Is(err, idempotency.ErrLeaseLost) {
			// A tombstone with the claim's token (released, by the
			// earlier try or by a Delete), or no row (a tombstone swept
			// since): the key is free.
			return s.appliedBefore(ctx, err, key, token,
				"NOT EXISTS (SELECT FROM {{table}} WHERE key = $1 AND NOT (token = $2 AND state = 'DONE' AND expires_at = 0))")
		}
		return err
	})
}

// appliedBefore is the answer of a token-fenced write that changed no row
// (lost, its error) when an earlier try may have been applied: nil if
// applied, a condition on key ($1) and token ($2), holds: the earlier try
// left the key so.
func (s *Store) appliedBefore(ctx context.Context, lost error, key string, token uint64, applied string) error {
	var ok bool
	err := s.pool.QueryRow(ctx, s.names.Replace("SELECT "+applied), []byte(key), int64(token)).Scan(&ok)
	switch {
	case err != nil:
		return err
	case ok:
		return nil
	}
	return lost
}

// Get implements idempotency.Store.
func (s *Store) Get(ctx context.Context, key string, now time.Time) (idempotency.Record, error) {
	var rec idempotency.Record
	err := s.run(ctx, "get", rerunLost, func(ctx context.Context, _ bool) error {
		var row recordRow
		err := s.pool.QueryRow(ctx, s.getSQL, s.args(now, []byte(key))...).Scan(row.dest()...)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("pgstore: get %q: %w", key, idempotency.ErrNotFound)
		}
		if err != nil {
			return err
		}
		rec, err = row.record()
		return err
	})
	return rec, err
}

// Delete implements idempotency.Store. It leaves a tombstone (see
// Release) and, in the same statement, announces the key to WatchDeletes
// by NOTIFY, delivered only if the statement commits. A key that is
// absent is no error and is not announced.
func (s *Store) Delete(ctx context.Context, key string) error {
	return s.run(ctx, "delete", rerunUnsent, func(ctx context.Context, _ bool) error {
		_, err := s.pool.Exec(ctx, s.deleteSQL, []byte(key))
		return err
	})
}

// Sweep deletes records that expired at now (ignored under ServerClock),
// tombstones included, at most limit of them (limit <= 0: all), in batches
// of SweepBatch rows, one statement each, so that no statement holds many
// row locks. It returns the number of rows deleted, also when it fails part
// way; rows deleted by a try whose answer was lost (its connection broke,
// and the batch was run again) are not counted.
func (s *Store) Sweep(ctx context.Context, now time.Time, limit int) (int, error) {
	total := 0
	for limit <= 0 || total < limit {
		n := s.batch
		if limit > 0 {
			n = min(n, limit-total)
		}
		var deleted int64
		err := s.run(ctx, "sweep", rerunLost, func(ctx context.Context, _ bool) error {
			tag, err := s.pool.Exec(ctx, s.sweepSQL, s.args(now, n)...)
			deleted = tag.RowsAffected()
			return err
		})
		total += int(deleted)
		if err != nil {
			return total, err
		}
		if deleted < int64(n) {
			break
		}
	}
	return total, nil
}

// recordRow is a records row as scanned.
type recordRow struct {
	fingerprint   []byte
	state         string
	token         int64
	leaseUntil    *int64
	expiresAt     int64
	status        *int64
	headers, body []byte
}

func (r *recordRow) dest() []any {
	return []any{&r.fingerprint, &r.state, &r.token, &r.leaseUntil, &r.expiresAt, &r.status, &r.headers, &r.body}
}

func (r *recordRow) record() (idempotency.Record, error) {
	rec := idempotency.Record{
		Fingerprint: string(r.fingerprint),
		State:       idempotency.State(r.state),
		Token:       uint64(r.token),
		ExpiresAt:   unixTime(r.expiresAt),
	}
	if r.leaseUntil != nil {
		rec.LeaseUntil = unixTime(*r.leaseUntil)
	}
	if rec.State != idempotency.Done {
		return rec, nil
	}
	if r.status != nil {
		rec.Response.Status = int(*r.status)
	}
	h, err := wire.DecodeHeader(r.headers)
	if err != nil {
		return idempotency.Record{}, err
	}
	rec.Response.Header = h
	rec.Response.Body = r.body
	return rec, nil
}

func unixTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// maxSpan bounds the leases and retentions sent to the server: the
// statements add them to a time in Unix nanoseconds (bigint), which a
// "keep for ever" duration would overflow, failing every call.
const maxSpan = 100 * 365 * 24 * time.Hour

// span is d in nanoseconds, at most maxSpan.
func span(d time.Duration) int64 { return int64(min(d, maxSpan)) }
