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
	// it. After a failed Complete (Outcome Executed with this error) fn has
	// run and its result may be lost: a retry is in flight until the lease
	// ends, and may then run fn again, which is what TokenFrom fences.
	ErrUnavailable = errors.New("idempotency store unavailable")

	// ErrLeaseLost is returned by a Store when Complete, Extend or Release is
	// called with a fencing token that is no longer the key's current one:
	// the lease was taken over, the key was released, deleted or expired.
	// Nothing was changed. Guard.Do returns it (wrapped) when fn's result
	// could not be stored because its claim is no longer current (another
	// holder took the key over, or it was deleted); fn's side effects may
	// have happened and must be fenced downstream (see TokenFrom).
	ErrLeaseLost = errors.New("idempotency lease lost")

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
// If the key cannot be released (the store fails, or the claim is no longer
// this caller's), Do returns fn's error without the mark, so IsRetryable is
// false, joined with the store's error, which wraps ErrUnavailable or
// ErrLeaseLost: the claim stays until its lease ends.
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

// unavailable wraps err with ErrUnavailable unless it already carries it.
func unavailable(op string, err error) error {
	if errors.Is(err, ErrUnavailable) {
		return err
	}
	return fmt.Errorf("idempotency: %s: %w: %w", op, ErrUnavailable, err)
}
