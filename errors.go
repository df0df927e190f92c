package idempotency

import (
	"errors"
	"fmt"
)

// Sentinel errors. Stores and adapters wrap them, together with the native
// error that caused them, so that both errors.Is and errors.As work:
//
//	fmt.Errorf("redisstore: begin: %w: %w", idempotency.ErrUnavailable, err)
var (
	// ErrInFlight is returned by Guard.Do when another holder owns a live
	// lease on the key. Nothing ran. The caller should answer "try again
	// later" (HTTP 409 with Retry-After); Result.LeaseUntil says when.
	ErrInFlight = errors.New("idempotent request is in flight")

	// ErrConflict is returned by Guard.Do when the key was first used with a
	// different fingerprint (request payload). Nothing ran. It is a client
	// error and retrying with the same key and payload gives it again.
	ErrConflict = errors.New("idempotency key reused with different parameters")

	// ErrUnavailable means the store could not answer. Guard fails closed:
	// when Begin fails, fn does not run. A write that failed with
	// ErrUnavailable may or may not have been applied; callers must treat
	// it as unknown. After a failed Begin (Outcome Unavailable) a retry is
	// safe: it finds the claim, in flight until its lease ends, or makes
	// it. After a failed Complete (Outcome Executed, with ErrNotStored) fn
	// has run and its result may be lost: a retry is in flight until the
	// lease ends, and may then run fn again, which is what TokenFrom fences.
	// After a failed Release (with ErrNotReleased) the key stays in flight
	// until its lease ends.
	ErrUnavailable = errors.New("idempotency store unavailable")

	// ErrLeaseLost is returned by a Store when Complete, Extend or Release is
	// called with a fencing token that is no longer the key's current one:
	// the lease was taken over, the key was released, deleted or expired.
	// Nothing was changed. Guard.Do returns it (wrapped) when fn's claim is
	// no longer current (another holder took the key over, or it was
	// deleted): with ErrNotStored when fn's response could not be stored,
	// with ErrNotReleased when a Release failed so, and with fn's error
	// when the claim was lost while a failing fn ran. fn's side effects may
	// have happened and must be fenced downstream (see TokenFrom).
	ErrLeaseLost = errors.New("idempotency lease lost")

	// ErrNotStored is returned (wrapped) by Guard.Do, with Executed and fn's
	// response, when fn ran and returned a response but the Guard could not
	// store it: the claim was lost while fn ran or by the time of Complete
	// (the error also wraps ErrLeaseLost), or Complete failed (it also wraps
	// ErrUnavailable, and then the write may still have been applied). The
	// side effect happened and the caller should answer with the response;
	// but a retry may not replay it: it finds the key in flight until the
	// lease ends (another holder's, after a takeover), or a result another
	// holder stored, or runs fn again. Fence fn's side effects downstream
	// with TokenFrom. It is never returned when fn returned an error: that
	// error is returned instead, with anything the Guard adds to it.
	ErrNotStored = errors.New("idempotency result not stored")

	// ErrNotReleased is returned (wrapped) by Guard.Do when the Guard tried
	// to give a claim back and the store's Release failed: after fn
	// returned an error marked Retryable (Executed; fn's error is returned
	// too, without its mark), or when the claim was granted but fn was not
	// started because the caller's ctx was done or Begin answered too late
	// (Unavailable). The error also wraps the store's error and ErrLeaseLost
	// (the claim was no longer this caller's: another holder has the key,
	// or it is gone) or ErrUnavailable (the key stays in flight until its
	// lease ends). A Release after fn panicked is not reported: the panic
	// goes on.
	ErrNotReleased = errors.New("idempotency claim not released")

	// ErrNotFound is returned by Store.Get when the key has no live record.
	ErrNotFound = errors.New("idempotency key not found")

	// ErrInvalidConfig is returned (wrapped) for options that cannot work,
	// such as a negative lease or a retention shorter than the lease.
	ErrInvalidConfig = errors.New("idempotency: invalid configuration")
)

// Retryable marks an error returned by fn as "nothing happened": the Guard
// releases the key at once so that a retry runs immediately instead of
// waiting for the lease to end. Use it only when no side effect can have
// taken place (validation failed, a downstream call was refused before it
// was sent). Retryable(nil) is nil.
//
// If the key cannot be released, Do returns fn's error without the mark, so
// IsRetryable is false, joined with an error that says why: one wrapping
// ErrNotReleased and the store's error (ErrUnavailable: the claim stays
// until its lease ends; ErrLeaseLost: it is no longer this caller's) when
// the Release failed, or one wrapping ErrLeaseLost alone when the claim was
// lost while fn ran, so that no Release was tried.
func Retryable(err error) error {
	if err == nil {
		return nil
	}
	return retryableError{err}
}

// IsRetryable reports whether err, or an error it wraps, was marked with
// Retryable.
func IsRetryable(err error) bool {
	var r retryableError
	return errors.As(err, &r)
}

type retryableError struct{ err error }

// notRetryable is err with its Retryable mark hidden: errors.Is and As
// still see through it, except to the mark. It carries fn's error when the
// key could not be released for it (the lease was lost, or Release failed),
// so that a caller that asks IsRetryable is not told the key was released.
type notRetryable struct{ err error }

func (e notRetryable) Error() string { return e.err.Error() }

func (e notRetryable) Is(target error) bool { return errors.Is(e.err, target) }

func (e notRetryable) As(target any) bool {
	if _, ok := target.(*retryableError); ok {
		return false
	}
	return errors.As(e.err, target)
}

func (e retryableError) Error() string { return e.err.Error() }
func (e retryableError) Unwrap() error { return e.err }

// storeFailed wraps err, a store's error that kept the Guard from storing
// fn's response (sentinel ErrNotStored) or from releasing its claim
// (ErrNotReleased), with sentinel and, unless err wraps ErrLeaseLost or
// ErrUnavailable already, with ErrUnavailable: errors.Is then matches the
// store's sentinels exactly as it did before sentinel was added.
func storeFailed(sentinel, err error) error {
	if errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrUnavailable) {
		return fmt.Errorf("%w: %w", sentinel, err)
	}
	return fmt.Errorf("%w: %w: %w", sentinel, ErrUnavailable, err)
}

// unavailable wraps err with ErrUnavailable unless it already carries it.
func unavailable(op string, err error) error {
	if errors.Is(err, ErrUnavailable) {
		return err
	}
	return fmt.Errorf("idempotency: %s: %w: %w", op, ErrUnavailable, err)
}
