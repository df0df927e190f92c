package idempotency

import (
	"context"
	"time"
)

// State is the state of a record, as a Store reports it.
type State string

const (
	// Processing: a holder claimed the key and has not stored a result.
	// LeaseUntil says until when its claim excludes everyone else.
	Processing State = "PROCESSING"
	// Done: a result is stored; Begin with the same fingerprint replays it.
	Done State = "DONE"
	// Conflict is never stored. Begin reports it when the key's record has
	// a different fingerprint from the one asked for, in any state.
	Conflict State = "CONFLICT"
)

// Response is the result of an idempotent operation, stored once and
// replayed to every retry inside the retention window.
type Response struct {
	// Status is an application status, for HTTP the status code.
	Status int
	// Header holds response metadata (for HTTP the header fields worth
	// replaying). Its type matches net/http.Header without importing it.
	Header map[string][]string
	// Body is the response payload.
	Body []byte
}

// Record is a Store's view of one key.
type Record struct {
	// Fingerprint of the request that created the record.
	Fingerprint string
	// State of the record; Conflict only as an answer of Begin.
	State State
	// Response is set when State is Done.
	Response Response
	// Token is the fencing token of the current claim. It strictly increases
	// per key: across takeovers, releases, deletions and expiry followed by
	// re-creation. 0 never names a claim.
	Token uint64
	// LeaseUntil is when the current claim stops excluding other holders;
	// zero when State is Done.
	LeaseUntil time.Time
	// ExpiresAt is when the record leaves the dedup window.
	ExpiresAt time.Time
}

// Store is the contract between the Guard and a storage engine. It is
// documented like database/sql/driver: the Guard holds all policy, a Store
// only translates these operations, each of which must be atomic with
// respect to every other operation on the same key, from any process that
// shares the store.
//
// Implementations must be safe for concurrent use by multiple goroutines.
//
// Time. Every method that judges expiry takes now, the caller's clock, and
// compares it with the record's LeaseUntil and ExpiresAt: a record is live
// while now < ExpiresAt, and a lease excludes others while now < LeaseUntil.
// Tests move time by passing a later now. An engine that judges time by its
// server clock instead (to be immune to skew between application hosts) must
// say so in its package documentation and offer a way to use the caller's
// clock for tests.
//
// Context. A Store must return promptly once ctx is done. If ctx is already
// done when a method is called, the method changes nothing and returns an
// error that wraps ctx.Err(). If ctx ends while a remote call is under way,
// the write may or may not have been applied, as with any ErrUnavailable.
// The Guard calls Complete and Release after fn with a context that keeps
// the caller's values but not its cancellation (the side effect has
// happened; its result must be stored even if the caller has gone away), so
// a Store that makes remote calls must bound each one with a timeout of its
// own, as every engine in this module does.
//
// Errors. Failures of the engine itself (network, timeouts, a full store,
// a closed store) wrap ErrUnavailable together with the native error. The
// other sentinels are part of the semantics below. A write that returned
// ErrUnavailable may still have been applied; the Guard is built so that
// this is safe (a retried Begin finds the claim and answers in flight).
//
// Fencing. Begin hands out a token with every successful claim. Complete,
// Extend and Release act only when the token is the key's current one;
// otherwise they return ErrLeaseLost and change nothing. This is what stops
// a holder whose lease ran out, and whose key was taken over, from
// overwriting the new holder's result.
type Store interface {
	// Begin claims key for fingerprint, atomically:
	//
	//   - no live record (absent, or now >= ExpiresAt): create a Processing
	//     record with a new token, LeaseUntil = now+lease and ExpiresAt =
	//     now+retention; return it and true;
	//   - a live record with another fingerprint, in any state: return a
	//     Record with State Conflict and false; change nothing;
	//   - Done with the same fingerprint: return the record (with its
	//     Response) and false;
	//   - Processing and now < LeaseUntil: return the record and false (in
	//     flight); change nothing;
	//   - Processing and now >= LeaseUntil (the holder is presumed dead):
	//     take over: a new, larger token and LeaseUntil = now+lease, keeping
	//     ExpiresAt (extended to at least LeaseUntil); return it and true.
	//
	// The returned Record is the caller's: it shares no memory with the
	// store.
	Begin(ctx context.Context, key, fingerprint string, now time.Time, lease, retention time.Duration) (Record, bool, error)

	// Complete stores resp as the key's result if token is the current
	// claim's token and the record is Processing: State becomes Done,
	// LeaseUntil is cleared and ExpiresAt becomes now+retention. It succeeds
	// even if the lease ran out, as long as nobody took the key over: the
	// token, not the clock, decides. Otherwise it returns ErrLeaseLost and
	// changes nothing. The store keeps its own copy of resp.
	Complete(ctx context.Context, key string, token uint64, resp Response, now time.Time, retention time.Duration) error

	// Extend renews the lease of the Processing claim named by token:
	// LeaseUntil becomes now+lease (and ExpiresAt at least that). A token
	// that is not current, or a record that is not Processing, gives
	// ErrLeaseLost.
	Extend(ctx context.Context, key string, token uint64, now time.Time, lease time.Duration) error

	// Release gives the Processing claim named by token back: the record is
	// removed so the next Begin, with any fingerprint, claims the key at
	// once (with a larger token). A token that is not current, or a record
	// that is not Processing, gives ErrLeaseLost.
	Release(ctx context.Context, key string, token uint64) error

	// Get returns the live record of key, for operators and for adapters
	// that wait for an in-flight holder. It returns ErrNotFound when the
	// key has no live record.
	Get(ctx context.Context, key string, now time.Time) (Record, error)

	// Delete removes the key's record in any state, for operators. A holder
	// of the deleted claim gets ErrLeaseLost from then on. Deleting an
	// absent key is not an error.
	Delete(ctx context.Context, key string) error
}
