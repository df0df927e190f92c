package faultstore

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/archlab/idempotency"
)

// A Fault decides what happens to one operation. A Fault is also an
// Injector that injects itself into every operation, so
// OnOps(LostAck(nil), OpBegin) reads as it should.
type Fault interface {
	Injector
	// Apply performs the operation through the fault: call runs it on the
	// wrapped store (with the ctx it is given) and returns its error. Apply
	// returns the error the caller of the Store sees.
	Apply(ctx context.Context, op Op, key string, call func(context.Context) error) error
	// String describes the fault in the syntax of Parse.
	String() string
}

// Error returns a Fault that fails the operation before it reaches the
// wrapped store: nothing is applied. The error wraps ErrUnavailable,
// ErrInjected and err (which may be nil).
func Error(err error) Fault { return errorFault{err} }

type errorFault struct{ err error }

func (f errorFault) MaybeFault(Op, string) Fault { return f }
func (f errorFault) String() string              { return "error" }
func (f errorFault) Apply(_ context.Context, op Op, key string, _ func(context.Context) error) error {
	return &InjectedError{Op: op, Key: key, Fault: f.String(), Err: f.err}
}

// LostAck returns a Fault that applies the operation to the wrapped store,
// then loses its reply: the caller gets an error wrapping ErrUnavailable,
// ErrInjected and err (which may be nil), whatever the store answered. The
// store's own answer is kept out of the error chain, so that an error such
// as idempotency.ErrLeaseLost is not mistaken for the store's verdict.
// InjectedError.Applied says whether the store may have applied the
// operation: false only when the store refused it, or when another fault
// that answered in its place (chained inside, or in a faultstore this one
// wraps) says so; true when the store applied it or failed in a way that
// leaves the outcome unknown.
func LostAck(err error) Fault { return lostAckFault{err} }

type lostAckFault struct{ err error }

func (f lostAckFault) MaybeFault(Op, string) Fault { return f }
func (f lostAckFault) String() string              { return "lostack" }
func (f lostAckFault) Apply(ctx context.Context, op Op, key string, call func(context.Context) error) error {
	callErr := call(ctx)
	e := &InjectedError{Op: op, Key: key, Fault: f.String(), Applied: true, Err: f.err}
	switch inner := (*InjectedError)(nil); {
	case callErr == nil:
	case errors.As(callErr, &inner):
		// Another fault answered in the store's place (chained inside
		// this one, or in a faultstore this one wraps): it knows whether
		// the store applied the operation.
		e.Applied, e.unknown = inner.Applied, inner.unknown
	case refused(callErr):
		e.Applied = false
	default:
		// ErrUnavailable, a ctx that ended during the call, anything
		// else: the write may have been applied.
		e.unknown = callErr
	}
	return e
}

// refused reports whether err is an answer of the store that says it
// changed nothing.
func refused(err error) bool {
	return errors.Is(err, idempotency.ErrLeaseLost) || errors.Is(err, idempotency.ErrNotFound) ||
		errors.Is(err, idempotency.ErrInvalidConfig)
}

// Latency returns a Fault that waits a duration drawn uniformly from
// [min, max] before performing the operation. The draws come from a
// generator seeded with seed, so a run that makes the same calls in the same
// order waits the same durations. If ctx ends first, the operation is not
// performed and the error wraps ErrUnavailable, ErrInjected and ctx.Err().
func Latency(seed uint64, min, max time.Duration) Fault {
	if max < min {
		min, max = max, min
	}
	return &latencyFault{min: min, max: max, rng: rand.New(rand.NewPCG(seed, 0x6661756c74))}
}

type latencyFault struct {
	min, max time.Duration
	mu       sync.Mutex
	rng      *rand.Rand
}

func (f *latencyFault) MaybeFault(Op, string) Fault { return f }

func (f *latencyFault) String() string {
	if f.min == f.max {
		return "latency=" + f.min.String()
	}
	return "latency=" + f.min.String() + "-" + f.max.String()
}

func (f *latencyFault) draw() time.Duration {
	if f.max == f.min {
		return f.min
	}
	// The span is counted in uint64: max-min, and the count of values
	// in [min, max], can exceed int64 (a range of every Duration, which
	// Parse accepts, made Int64N panic).
	span := uint64(f.max) - uint64(f.min)
	f.mu.Lock()
	var off uint64
	if span == math.MaxUint64 {
		off = f.rng.Uint64()
	} else {
		off = f.rng.Uint64N(span + 1)
	}
	f.mu.Unlock()
	return time.Duration(uint64(f.min) + off)
}

func (f *latencyFault) Apply(ctx context.Context, op Op, key string, call func(context.Context) error) error {
	if d := f.draw(); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return &InjectedError{Op: op, Key: key, Fault: f.String(), Err: ctx.Err()}
		}
	}
	return call(ctx)
}

// Hang returns a Fault that blocks until ctx is done, then fails without
// performing the operation; the error wraps ErrUnavailable, ErrInjected and
// ctx.Err(). With a ctx that is never done it blocks forever.
func Hang() Fault { return hangFault{} }

type hangFault struct{}

func (f hangFault) MaybeFault(Op, string) Fault { return f }
func (f hangFault) String() string              { return "hang" }
func (f hangFault) Apply(ctx context.Context, op Op, key string, _ func(context.Context) error) error {
	<-ctx.Done()
	return &InjectedError{Op: op, Key: key, Fault: f.String(), Err: ctx.Err()}
}

// Chain returns a Fault that applies faults in order, each around the next:
// Chain(Latency(1, d, d), LostAck(nil)) waits d, applies the operation and
// loses the reply. Chain() performs the operation unchanged.
func Chain(faults ...Fault) Fault {
	var fs []Fault
	for _, f := range faults {
		if f != nil {
			fs = append(fs, f)
		}
	}
	return chainFault(fs)
}

type chainFault []Fault

func (f chainFault) MaybeFault(Op, string) Fault { return f }

func (f chainFault) String() string {
	parts := make([]string, len(f))
	for i, g := range f {
		parts[i] = g.String()
	}
	return strings.Join(parts, "+")
}

func (f chainFault) Apply(ctx context.Context, op Op, key string, call func(context.Context) error) error {
	if len(f) == 0 {
		return call(ctx)
	}
	return f[0].Apply(ctx, op, key, func(ctx context.Context) error {
		return f[1:].Apply(ctx, op, key, call)
	})
}
