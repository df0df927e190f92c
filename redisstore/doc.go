// Package redisstore is an idempotency.Store on Redis (github.com/redis/go-redis/v9),
// for a fleet of application instances sharing one dedup window. It works on
// a single node, behind Sentinel (redis.NewFailoverClient), on Redis
// Cluster and on a Ring (see Ring): New takes any redis.UniversalClient.
//
// # Layout and round trips
//
// Each key's record is one Redis hash at Prefix+key, so Cluster needs no
// hash tags. Every operation but Delete is one round trip: Begin, Complete,
// Extend, Release and Get are Lua scripts run with EVALSHA (go-redis's
// Script.Run falls back to EVAL, which loads the script, on NOSCRIPT), and
// Delete is one HDEL, followed by a PUBLISH of the key on the channel
// Prefix+"deleted" for the replay caches of other processes
// (Store.WatchDeletes feeds an idempotency.ReplayCache). A new request
// therefore costs two round trips (Begin, Complete) and a replay one.
//
// The PUBLISH goes to the node that holds the key, which has just answered
// the HDEL: on Cluster the key's master (go-redis would send the keyless
// PUBLISH to any master, maybe one that is down or failing over), on a
// Ring the key's shard. WatchDeletes subscribes on each master of a
// Cluster and each live shard of a Ring, and so hears every announcement
// from the node it was made on. (Redis Cluster passes a PUBLISH on to the
// subscribers on every node too, but over its bus, which drops messages
// for a node that was unreachable for a while; its subscribers would not
// know. A Cluster's watcher hears those copies as well: a key may be
// forgotten once per master.) Where a Cluster's master cannot be told
// (no slot map yet) go-redis routes the PUBLISH itself; on a Ring whose
// shard for the key is down, Delete fails with ErrUnavailable before the
// HDEL (see Ring).
//
// Under load, round trips are shared: operations that arrive while another
// is on the wire wait for it and then go out together, as one pipeline, so
// that a busy store pays one write and one read for many operations instead
// of one each. On Cluster each master, and on a Ring each shard, has its
// own queue, so that a stalled node holds up only its own keys. A lone
// operation goes out at once.
// There is no goroutine behind it: the waiting callers take turns sending.
// Each script keeps its rules (sent at most once if it writes; EVAL after
// NOSCRIPT), and an operation whose ctx ends before its batch goes out is
// never sent. A batch's deadline is the latest of its operations', and the
// caller with that deadline sends it and waits for its answer; the others
// return at their own deadlines at the latest. go-redis retries no pipeline that holds a write, so a Get or
// a failed dial in one fails with ErrUnavailable where, sent alone, it
// would have been retried. Batching needs a client with
// ContextTimeoutEnabled (a pipeline's deadline must reach the socket);
// Options.NoBatch turns it off.
// With 64 concurrent callers it took Guard.Do on new keys from 28-43% to
// 54% of redis-benchmark's SET rate here (scripts/bench-redis.sh).
//
// The record's times are stored in it and every decision compares them:
// the key's TTL (PEXPIRE or PEXPIREAT, set to cover the end of the window)
// is only garbage collection, never the judge.
//
// # Ring
//
// On a Ring (redis.NewRing) a key's record is on the shard that the ring's
// consistent hash picks among all its shards as built (RingOptions.Addrs),
// and its calls go there. go-redis sends a shard's keys to the other
// shards while its heartbeat finds it down; the store does not follow, since
// their records are not there (claimed there, a key done or in flight
// would run a second time): their calls fail with ErrUnavailable until the
// shard is back. Shards that SetAddrs adds or replaces are followed, and a
// key that moves so loses its record, as on any resharding of a Ring.
//
// # Whose clock rules leases
//
// With the default ServerClock the scripts read the Redis server's TIME and
// ignore the now arguments: every application instance judges a key's lease
// by the same clock, the one of the server that holds the key, so a host
// whose clock runs ahead cannot take over a live holder's claim and run the
// operation a second time. Lease renewal stays safe because the Guard times
// renewals with durations, not with wall-clock instants. The window's TTL is
// PEXPIREAT at the window's end by the same clock. Records' LeaseUntil and
// ExpiresAt are then server times. The residual risk is a failover to a
// replica whose clock differs from the old primary's.
//
// CallerClock judges by the now each call is given, as the Store contract
// describes; it is what tests that move time need (the conformance suite
// runs in this mode) and what a deployment with well-synchronised hosts and
// a mistrusted server clock may choose. The TTL is then relative (PEXPIRE
// window end minus now) and never shortened by a later call.
//
// # Fencing tokens
//
// A new claim's token is the larger of the previous token of the key plus
// one and the server's TIME in microseconds. Release and Delete leave a
// tombstone (the hash with only the token, keeping its TTL) so that the next
// claim counts on from it; once the tombstone itself has expired, the server
// clock has moved on past the old token. Tokens therefore increase strictly
// per key across takeovers, releases, deletions and expiry, as long as the
// server's clock does not step back by more than the time since the key's
// last claim, and the clocks of the servers that may come to hold the key
// agree: a master and its replicas, and on Cluster every master, since a
// slot can move to another. Tokens fit in 53 bits, the precision of Lua's
// numbers.
//
// # Redis settings this store depends on
//
//   - maxmemory-policy must be noeviction. Every volatile-* policy evicts
//     exactly these records, since all of them carry TTLs, and allkeys-*
//     evicts them too: an evicted claim or result lets a retry run the
//     operation a second time. With noeviction a full server refuses the
//     writes that would grow it (OOM) and the store fails closed with
//     ErrUnavailable: a new claim, a takeover and a renewal are refused,
//     having written nothing. Redis judges a script by its first write, so
//     Complete, Release and Delete, which begin by removing fields, still
//     go through (work already done keeps its result), and so does a claim
//     that replaces an ended record (TestFullServerFailsClosed). New reads
//     the policy of each server (each master on Cluster, each shard on a Ring)
//     with CONFIG GET and logs a warning on any other policy, or fails with
//     ErrInvalidConfig when Options.RequireNoEviction is set; a server that
//     does not answer, or where CONFIG is disabled (many managed services),
//     only gets a warning.
//   - Persistence. Without AOF a restart loses every record. With
//     appendonly yes and appendfsync everysec (Redis's default) up to about a
//     second of acknowledged claims and results is lost on a crash of the
//     server's host; with appendfsync always none is, at the cost of an fsync
//     per write. A lost claim or result means a retry runs again.
//   - ACLs. Besides its keys (~Prefix*) and the commands above, the user
//     needs the channel Prefix+"deleted" (&idem:deleted) for PUBLISH and,
//     where WatchDeletes runs, SUBSCRIBE. Redis 7 users start without
//     channels (acl-pubsub-default resetchannels). Without it Delete still
//     deletes, and the announcement is lost without a word; WatchDeletes
//     reports NOPERM, and the replay caches fall back on their TTL.
//   - Replication is asynchronous. A failover (Sentinel or Cluster) can
//     promote a replica that has not yet received the latest acknowledged
//     claims and results, so a retry may run the operation a second time,
//     and a lost claim lets a second holder run it while the first still
//     does. The store does not offer WAIT (it is a second round trip, and
//     even WAIT does not make failover strongly consistent); fence side
//     effects downstream with the token (idempotency.TokenFrom) where that
//     matters.
//
// # Failover behind Sentinel
//
// With a client from redis.NewFailoverClient the store follows the master
// the sentinels name. When the master dies, every call fails with
// ErrUnavailable (the Guard fails closed: fn does not run) until the
// sentinels have promoted a replica: down-after-milliseconds (30 s by
// default) and the election. go-redis then hears the switch from the
// sentinels and the same client's calls go to the new master; nothing
// needs to be reopened. What the new master has is what had reached the
// replica: a record acknowledged and known replicated (a WAIT on the old
// master) is replayed; one acknowledged a moment before the crash may be
// missing, and its key runs again. A call whose fn ran but whose result
// could not be stored (Guard.Do's Executed with an error) leaves its claim
// holding the key until the lease ends, if the claim had replicated.
//
// TestSentinelFailover checks this with a master, one replica and three
// sentinels (down-after-milliseconds 500): SIGKILL of the master under a
// storm of Guard.Do calls. There, the replica was promoted about 2 s after
// the kill and calls succeeded again a few hundred milliseconds later at
// most; every failed call said ErrUnavailable; no key's fn ran twice at
// once; every result known replicated was replayed. Over a loopback link
// the replica kept up, and none of the 100-odd results acknowledged just
// before the kill was lost in those runs: that is what a fast link makes
// likely, not what the store promises.
//
// # Errors and time limits
//
// Every Redis failure (network, timeout, OOM, READONLY, CLUSTERDOWN, ...)
// is returned wrapped together with idempotency.ErrUnavailable; a write that
// failed so may or may not have been applied. Options.OpTimeout bounds each
// operation: with a client whose ContextTimeoutEnabled is set the deadline
// reaches the socket; otherwise the store stops waiting at the deadline and
// leaves the call to the client's own ReadTimeout. Such an abandoned call
// keeps a goroutine and one of the pool's connections until ReadTimeout
// (with ReadTimeout -1, until the server answers or the connection breaks;
// a paused server's kernel keeps it open). At most PoolSize of them (per
// node on Cluster) pile up, since the calls after them wait for a
// connection only until their own deadline; but while they last the store
// fails every call. Set ContextTimeoutEnabled. go-redis re-sends a
// command after a read timeout or a connection lost while it waited for the
// reply (MaxRetries); the store's writing scripts opt out of that (they are
// sent at most once), because their first send may have run: a re-sent
// Begin would find its own claim and answer "in flight", a re-sent Complete
// or Release would find its own work done and answer ErrLeaseLost. Such a
// call fails with ErrUnavailable instead. Failed dials, before anything was
// sent, are still retried by the client's pool, and so are Get's reads.
//
// A write that timed out may also be applied after the call returned: it
// can wait in a paused or overloaded server's socket and run when the
// server gets to it, however late. For Begin, Complete and Release that
// is what "may have been applied" already covers (a late claim holds the
// key until its lease ends). A late Delete is the one an operator may
// trip on: the record is replayed after the error and removed afterwards,
// and a claim made in between is removed with it. Retry a failed Delete
// until it succeeds before acting on the key (see Store.Delete).
//
// A cancelled ctx is noticed before a call is sent, and by a call waiting
// in the batcher's queue; but go-redis bounds the I/O under way only by a
// deadline, so a call already on the wire to a server that does not answer
// returns at its deadline (OpTimeout at the latest, or ctx's own deadline
// if earlier), not at the cancellation. Give ctx a deadline where that
// matters. Delete's announcement, once the HDEL is done, is sent even if
// ctx is cancelled meanwhile (within the same deadline): the deletion has
// happened, and the other processes' caches should hear of it.
package redisstore
