package idemhttp

import (
	"net/http"
	"time"
)

// Outcome names what the middleware did with one guarded request. The
// values are stable and short, fit for metric labels.
type Outcome string

const (
	// Executed: the handler ran and its response was stored for replay (or,
	// with Err = ErrResponseTooLarge, or an error saying a write to the
	// client failed, a marker saying it cannot be replayed).
	Executed Outcome = "executed"
	// Replayed: a stored response was sent; the handler did not run.
	Replayed Outcome = "replayed"
	// InFlight: another request holds the key; 409 was sent.
	InFlight Outcome = "in_flight"
	// Conflict: the key belongs to a different request; 422 (or 409) was sent.
	Conflict Outcome = "conflict"
	// Unavailable: the store failed before the handler ran, or the client
	// went away while its claim was being made (Err: the context's error,
	// see the package doc); 503 was sent and the handler did not run.
	Unavailable Outcome = "unavailable"
	// LeaseLost: the handler ran and its response was sent, but another
	// holder took the key over; the response was not stored.
	LeaseLost Outcome = "lease_lost"
	// Released: the handler ran, its response was not stored (storage
	// policy, Hijack, a panic or runtime.Goexit before a stored status
	// was sent) and the key was released for an immediate retry.
	Released Outcome = "released"
	// Abandoned: the response was not stored and the claim is kept until
	// its lease ends (side effects may have happened), then a retry runs
	// again. It happens when the client went away, or the Guard's Timeout
	// ended the handler's context, and the handler answered with a status
	// that is not stored, when the handler called KeepClaim
	// (Err: ErrClaimKept), when it panicked with http.ErrAbortHandler, or
	// with anything (or called runtime.Goexit) after it sent a stored
	// status or called KeepClaim, and when it panicked otherwise (or called
	// runtime.Goexit) but the store refused to release the key (Err wraps
	// idempotency.ErrNotReleased and the store's error).
	Abandoned Outcome = "abandoned"
	// NotStored: the handler ran and its response was sent, but the store
	// failed to record it (Err wraps idempotency.ErrNotStored) or, for a
	// response not to be stored, to release the key (Err wraps
	// idempotency.ErrNotReleased); a retry after the lease may run again.
	NotStored Outcome = "not_stored"
	// NotReplayable: the key's stored result is the marker of a response
	// that cannot be replayed (too large to store, or cut short when the
	// client went away); 409 response-not-replayable was sent.
	NotReplayable Outcome = "not_replayable"
	// BadRequest: a missing (when required) or invalid key, or an
	// unreadable body; 400 was sent and nothing ran.
	BadRequest Outcome = "bad_request"
	// TooLarge: the request body exceeds MaxBody; 413 was sent.
	TooLarge Outcome = "too_large"
)

// Event describes one guarded request, after its response was sent.
type Event struct {
	// Request is the request as the middleware received it. Its body has
	// been consumed; do not read it.
	Request *http.Request
	Outcome Outcome
	// Status is the status code sent to the client (0 if none was sent,
	// for example after Hijack).
	Status int
	// Latency is the time spent in the middleware, handler included.
	Latency time.Duration
	// Err is the error behind the outcome, if any (a store error, a lease
	// loss, ErrResponseTooLarge).
	Err error
}

// Observer sees every guarded request's outcome. Observe is called from the
// request's goroutine after the response is complete; it must be safe for
// concurrent use and should be quick. Requests that are not guarded (other
// methods, or no key when keys are optional) are not observed.
type Observer interface {
	Observe(Event)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(Event)

// Observe calls f(e).
func (f ObserverFunc) Observe(e Event) { f(e) }
