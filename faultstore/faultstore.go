// Package faultstore wraps any idempotency.Store and injects faults into
// its operations, for tests and for idemcheck. It follows pebble's
// vfs/errorfs: an Injector looks at each operation and may return a Fault;
// combinators narrow injectors to operations, keys, a seeded fraction of
// calls, or the first n calls.
//
// The fault idempotency needs most is LostAck: the operation is applied to
// the wrapped store, then its reply is lost and the caller sees an error
// wrapping idempotency.ErrUnavailable. The Store contract allows exactly
// that ("a write that returned ErrUnavailable may still have been
// applied"), and a Guard must stay correct under it.
//
// Every injected error wraps both idempotency.ErrUnavailable and
// ErrInjected, and is an *InjectedError that says what was injected and
// whether the operation may have been applied (Applied).
package faultstore

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/archlab/idempotency"
)

// Op names a Store operation.
type Op string

// The operations of idempotency.Store.
const (
	OpBegin    Op = "begin"
	OpComplete Op = "complete"
	OpExtend   Op = "extend"
	OpRelease  Op = "release"
	OpGet      Op = "get"
	OpDelete   Op = "delete"
)

// Ops lists every operation, in the order of the Store interface.
var Ops = [...]Op{OpBegin, OpComplete, OpExtend, OpRelease, OpGet, OpDelete}

func (op Op) index() int {
	for i, o := range Ops {
		if o == op {
			return i
		}
	}
	return -1
}

// ErrInjected is wrapped by every error a Fault injects, so tests can tell
// an injected failure from a real one.
var ErrInjected = errors.New("faultstore: injected fault")

// InjectedError is the error an injected fault returns. It wraps
// idempotency.ErrUnavailable, ErrInjected and Err.
type InjectedError struct {
	Op    Op
	Key   string
	Fault string // the fault's String
	// Applied reports whether the operation may have been applied before
	// the error was returned (LostAck): true when the wrapped store applied
	// it, and also when the store's own answer was an error that leaves the
	// outcome unknown (ErrUnavailable, a timeout: "may still have been
	// applied"). It is false only when the operation certainly changed
	// nothing: the fault failed it before it reached the store, or the
	// store refused it (ErrLeaseLost, ErrNotFound, ErrInvalidConfig).
	Applied bool
	// Err is the cause given to the fault, or the context's error for a
	// fault cut short by ctx; it may be nil.
	Err error

	// unknown is the wrapped store's own error when it left the outcome
	// unknown. It is told in the message but kept out of the chain, as
	// every answer of the store under LostAck is.
	unknown error
}

func (e *InjectedError) Error() string {
	applied := "not applied"
	switch {
	case e.unknown != nil:
		applied = "maybe applied: the store answered " + e.unknown.Error() + "; acknowledgement lost"
	case e.Applied:
		applied = "applied, acknowledgement lost"
	}
	msg := fmt.Sprintf("faultstore: %s %q: %s (%s)", e.Op, e.Key, e.Fault, applied)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap makes errors.Is find ErrUnavailable, ErrInjected and Err.
func (e *InjectedError) Unwrap() []error {
	errs := []error{idempotency.ErrUnavailable, ErrInjected}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// Store is an idempotency.Store that passes every operation to the wrapped
// store through its Injector. It is safe for concurrent use if the wrapped
// store and the injector are.
type Store struct {
	inner  idempotency.Store
	inj    atomic.Pointer[injectorBox]
	counts [len(Ops)]atomic.Int64
}

type injectorBox struct{ inj Injector }

var _ idempotency.Store = (*Store)(nil)

// New returns a Store that wraps inner and consults inj before every
// operation. A nil inj injects nothing.
func New(inner idempotency.Store, inj Injector) *Store {
	s := &Store{inner: inner}
	s.SetInjector(inj)
	return s
}

// SetInjector replaces the injector, for example to heal a store in the
// middle of a test. Operations already under way keep the fault they got.
func (s *Store) SetInjector(inj Injector) {
	s.inj.Store(&injectorBox{inj})
}

// Injected returns how many faults were injected into op so far.
func (s *Store) Injected(op Op) int {
	i := op.index()
	if i < 0 {
		return 0
	}
	return int(s.counts[i].Load())
}

// InjectedTotal returns how many faults were injected into all operations.
func (s *Store) InjectedTotal() int {
	n := 0
	for i := range s.counts {
		n += int(s.counts[i].Load())
	}
	return n
}

// Unwrap returns the wrapped store.
func (s *Store) Unwrap() idempotency.Store { return s.inner }

// do runs call through the fault, if any, chosen for op and key.
func (s *Store) do(ctx context.Context, op Op, key string, call func(context.Context) error) error {
	if err := ctx.Err(); err != nil {
		// The contract: a done ctx changes nothing. No fault is consulted,
		// so a cancelled call never consumes an injector's budget.
		return fmt.Errorf("faultstore: %s: %w", op, err)
	}
	var f Fault
	if b := s.inj.Load(); b != nil && b.inj != nil {
		f = b.inj.MaybeFault(op, key)
	}
	if f == nil {
		return call(ctx)
	}
	s.counts[op.index()].Add(1)
	return f.Apply(ctx, op, key, call)
}

// Begin implements idempotency.Store.
func (s *Store) Begin(ctx context.Context, key, fingerprint string, now time.Time, lease, retention time.Duration) (idempotency.Record, bool, error) {
	var (
		rec     idempotency.Record
		claimed bool
	)
	err := s.do(ctx, OpBegin, key, func(ctx context.Context) error {
		var err error
		rec, claimed, err = s.inner.Begin(ctx, key, fingerprint, now, lease, retention)
		return err
	})
	if err != nil {
		return idempotency.Record{}, false, err
	}
	return rec, claimed, nil
}

// Complete implements idempotency.Store.
func (s *Store) Complete(ctx context.Context, key string, token uint64, resp idempotency.Response, now time.Time, retention time.Duration) error {
	return s.do(ctx, OpComplete, key, func(ctx context.Context) error {
		return s.inner.Complete(ctx, key, token, resp, now, retention)
	})
}

// Extend implements idempotency.Store.
func (s *Store) Extend(ctx context.Context, key string, token uint64, now time.Time, lease time.Duration) error {
	return s.do(ctx, OpExtend, key, func(ctx context.Context) error {
		return s.inner.Extend(ctx, key, token, now, lease)
	})
}

// Release implements idempotency.Store.
func (s *Store) Release(ctx context.Context, key string, token uint64) error {
	return s.do(ctx, OpRelease, key, func(ctx context.Context) error {
		return s.inner.Release(ctx, key, token)
	})
}

// Get implements idempotency.Store.
func (s *Store) Get(ctx context.Context, key string, now time.Time) (idempotency.Record, error) {
	var rec idempotency.Record
	err := s.do(ctx, OpGet, key, func(ctx context.Context) error {
		var err error
		rec, err = s.inner.Get(ctx, key, now)
		return err
	})
	if err != nil {
		return idempotency.Record{}, err
	}
	return rec, nil
}

// Delete implements idempotency.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	return s.do(ctx, OpDelete, key, func(ctx context.Context) error {
		return s.inner.Delete(ctx, key)
	})
}
