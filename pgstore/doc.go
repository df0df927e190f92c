// Package pgstore is an idempotency.Store on PostgreSQL, through a
// github.com/jackc/pgx/v5 pgxpool.Pool.
//
// # Schema
//
// The schema is embedded SQL, applied by Store.Migrate: versioned (a
// <table>_schema_version table), idempotent (running it again does
// nothing), safe when several instances migrate at once (transaction
// advisory locks serialize them) and one transaction per migration. Run it
// at startup or at deploy time; New itself does not touch the database.
// Migrate fails with idempotency.ErrInvalidConfig, changing nothing, on a
// schema that a newer build migrated further than it knows (so an old
// binary that runs Migrate at startup stops instead of misreading it;
// builds before this check, from before 2026-12-03 08:56 UTC, go on), and
// when a name it would create is taken, by another store in the schema
// whose Table is one of its derived names or by the application. A
// process that leaves migrating to deploy time calls Store.CheckSchema at
// startup instead: it fails with ErrInvalidConfig, also changing nothing,
// unless the schema is at the version its build needs.
//
// One row per key holds the state, the fencing token (drawn from the
// sequence <table>_token_seq under the key's row lock, so tokens strictly
// increase per key across takeover, release, deletion, expiry and Sweep),
// the lease and window ends as
// Unix nanoseconds, and the response as status, headers (bytea, in a
// small binary encoding that keeps every byte, which jsonb would not) and
// body (bytea).
//
// # Statements
//
// Each operation but Begin is one statement in its own implicit
// transaction. Begin reads the key's row and, only when it is absent, expired or
// abandoned, claims it with an INSERT ... ON CONFLICT DO UPDATE, all in
// one statement (a CTE); a replay, an in-flight or a conflicting answer
// thus takes no row lock and writes nothing. A claim that replaces a row
// draws its token in the DO UPDATE, under the row's lock; a claim that
// inserts one draws it in a second statement, an UPDATE of the row it
// inserted, sent with the first in one round trip and one transaction (an
// INSERT builds its row before it meets the key's index, and a token
// drawn there could be smaller than that of a claim made and swept in the
// meantime). Complete, Extend and Release are an UPDATE on key, token and
// state; Release and Delete leave an expired tombstone. So a new request
// costs two round trips (Begin, Complete) and a replay one.
//
// CompleteTx runs Complete's statement in the caller's pgx.Tx, so that the
// business write and the stored result commit or roll back together. If the
// transaction rolls back the key stays Processing and is taken over after
// its lease, like a crashed holder.
//
// # Clock
//
// By default (CallerClock) leases and windows are judged by the now the
// caller passes, as the idempotency.Store contract describes: the Guard's
// clock rules, and tests move time by passing a later now. In a fleet this
// trusts the application hosts' clocks to agree to well within a lease.
// ServerClock judges by the database server's clock instead
// (statement_timestamp()), immune to skew between hosts; every now argument
// is then ignored, and the returned LeaseUntil and ExpiresAt are server
// times.
//
// # Errors
//
// Serialization failures and deadlocks (SQLSTATE 40001, 40P01; they arise
// when the pool's transactions are REPEATABLE READ or SERIALIZABLE), and a
// Begin whose snapshot was overtaken by a concurrent claim, applied
// nothing: they are retried, with jittered pauses of up to 32ms, until
// OpTimeout. A statement whose connection broke (an end of file, a reset,
// the server's FATAL notice, as every pooled connection meets once after
// the server restarts) is run again at once, on another connection, until
// OpTimeout, as long as running it twice has the effect of running it
// once: Get and Sweep; Begin, which then meets its own claim, if the first
// try made it, and answers in flight (the claim is held until its lease
// ends, as when the error is returned); Extend, which sets the same lease
// again; Complete and Release, which, finding that an earlier try was
// applied (the key Done, or a tombstone, with their token), succeed. Delete
// is run again only when pgconn.SafeToRetry says the statement was never
// sent: a second run could delete a claim made after the first. A failure
// to connect is not retried. Every other failure, from the server or the
// network, wraps idempotency.ErrUnavailable together with the native error
// (a *pgconn.PgError, a net error, or ctx's error), so errors.Is and
// errors.As both work. A write that failed this way may or may not have
// been applied, except when pgconn.SafeToRetry reports true for the error:
// then the statement was never sent (a failure to connect is not marked
// so, but applies nothing either). CompleteTx does not retry, since a
// failed statement aborts the caller's transaction; it wraps
// ErrUnavailable too, and the caller retries the whole transaction.
//
// Keys and fingerprints are bytes: NUL and invalid UTF-8 are kept. A key
// must fit the primary key's index, about 2.7 kB after compression; a
// longer one fails with ErrUnavailable (SQLSTATE 54000) every time, so
// bound keys before they reach the store (idemhttp accepts 255 bytes).
// Leases and retentions longer than a century are taken as a century (times
// are Unix nanoseconds in bigint columns).
//
// Options.OpTimeout (default 5s) bounds every operation, retries included,
// whatever its ctx: the Guard stores results with a ctx that is never
// cancelled, so without a bound a server that stopped answering would hold
// Guard.Do for good; SchemaVersion and CheckSchema are bounded by it too.
// pgx closes a connection whose statement ran out, but the server may
// still run a statement it had received (one that waited on a row lock,
// or all of them on a server that was frozen): that is why such a write
// may or may not have been applied. Complete, Extend and Release are
// fenced by their token, so applied late they change nothing that another
// claim owns.
//
// An acknowledged write is as durable as the server's commit. With
// synchronous_commit off (for the server, database, role or pool), or
// after a failover to an asynchronous standby, the last results
// acknowledged may be lost and their keys run again: keep it on, and fail
// over only to a synchronous standby.
//
// # Deletion feed
//
// Delete announces each key it deletes by NOTIFY on the channel
// "<schema>.<table>.deleted" (past 63 bytes, the identifier limit, its
// first bytes and a hash), in its own statement: a deletion is announced
// when it commits, never if it rolls back, and an absent key is not
// announced. Store.WatchDeletes LISTENs on that channel and feeds an
// idempotency.ReplayCache (Forget, ForgetAll), with the same contract as
// redisstore's: PostgreSQL keeps no notification for a session that is not
// listening, so reset is called each time LISTEN succeeds, and failures
// are reported and retried about once a second (a pooled connection found
// dead when LISTEN is sent is passed over at once). A notification's payload
// is under 8000 bytes and a key goes as hex, so the deletion of a key
// longer than 3999 bytes is announced as a marker on which watchers call
// reset.
//
// WatchDeletes holds one connection for as long as it runs, taken from the
// pool and then kept out of it: one connection per watching process beyond
// the pool's MaxConns, to count in max_connections. LISTEN needs a session
// of its own: PgBouncer in transaction or statement pooling mode does not
// support it (notifications go to whichever client holds the server
// connection, or nowhere). Behind such a pooler, give WatchDeletes a Store
// of the same Schema and Table made by New on a pool that reaches the server
// directly or through session pooling; Delete's NOTIFY works through any
// mode. NOTIFY takes a database-wide lock while the deleting transaction
// commits, which is of no account for deletions made by operators.
//
// # Cleanup
//
// Expired rows, tombstones included, are ignored by every operation and
// overwritten by the next Begin of their key. Sweep deletes them in bounded
// batches (one short statement per batch, skipping rows locked by
// writers); run it periodically.
package pgstore
