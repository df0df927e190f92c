// Package idempotency makes retried requests and redelivered messages safe:
// each side effect (a charge, a reservation, an email) runs once per key,
// and every retry inside a window gets the first result back.
//
// # Concepts
//
// A key names one logical operation (a client's Idempotency-Key, a message
// id). A fingerprint names its payload: the same key with another payload is
// a client error (ErrConflict), never a replay. A Guard runs a function for
// a key at most once and stores its Response in a Store; retries inside the
// Retention window get the stored Response back (Replayed).
//
// # Key lifecycle
//
//	absent ──Begin──▶ PROCESSING (lease, token n) ──Complete(n)──▶ DONE ──window ends──▶ absent
//	                       │  ▲                                       │
//	          lease ends,  │  │ Extend(n) while fn runs               └─ Begin, same fingerprint: replay
//	          Begin again  ▼  │
//	                 PROCESSING (token n+1)   Release(n): absent at once (fn marked Retryable, or panicked)
//
// A claim excludes other callers for its lease; the Guard renews the lease
// while fn runs, so fn may outlast it. A holder presumed dead (its lease ran
// out) is taken over by the next Begin, which gets a larger fencing token.
// Only the current token may Complete, Extend or Release: a holder that was
// taken over cannot overwrite the winner's result (ErrLeaseLost).
//
// # Guarantees and their limits
//
//   - Fail closed: when the store cannot answer, fn does not run
//     (Unavailable, ErrUnavailable).
//   - Inside the window, fn runs at most once per key while the holder lives
//     and keeps renewing; a stored result is replayed byte for byte.
//   - If the holder crashes, or cannot reach the store for a whole lease, fn
//     may run again after the lease. It may also run again when its
//     response could not be stored (Do returns that response with an error
//     wrapping ErrNotStored). The guarantee for side effects outside the
//     store is then the downstream write's: make it conditional on the
//     fencing token (TokenFrom) or on the key.
//   - A claim the Guard could not give back (ErrNotReleased: a Retryable
//     error's, or one granted to a caller that had gone) blocks the key
//     until its lease ends, unless it was lost already (ErrLeaseLost).
//   - After the window (Retention) the key is forgotten and runs again.
//
// # Choosing a store
//
// MemoryStore (this package) for tests and single instances that may lose
// the window on restart; boltstore for one instance with a file on disk;
// redisstore or pgstore for a fleet. Every store passes the same
// conformance suite, idemtest.
package idempotency
