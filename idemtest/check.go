package idemtest

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/archlab/idempotency"
)

// TB is the part of testing.TB a clause uses. Run hands the clauses a
// *testing.T; Clause.Check hands them a collector that turns failures into
// errors. Fatalf must not return: testing.T's ends the goroutine, the
// collector's panics and Check recovers.
type TB interface {
	Helper()
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// A Clause is one clause of the Store contract, checkable outside of go
// test, as testing/fstest.TestFS checks a file system: Check returns what
// failed instead of failing a testing.T. Run checks the same clauses as
// subtests named after Clause.Name.
type Clause struct {
	// Name is the clause's subtest path in Run, such as
	// "Fencing/stale-complete-rejected".
	Name string
	fn   func(e *env)
}

// Clauses returns the clauses Run checks on a working store, in Run's
// order.
func Clauses() []Clause {
	var out []Clause
	for _, g := range groups() {
		for _, c := range g.clauses {
			out = append(out, Clause{Name: g.name + "/" + c.name, fn: c.fn})
		}
	}
	return out
}

// UnavailableClauses returns the clauses Run checks on Harness.Broken: each
// must be checked on a store whose backend cannot be reached.
func UnavailableClauses() []Clause {
	out := make([]Clause, len(unavailableClauses))
	for i, c := range unavailableClauses {
		out[i] = Clause{Name: "Unavailable/" + c.name, fn: c.fn}
	}
	return out
}

// Check checks the clause on s and returns its failures joined, or nil if
// it held. Keys carry a random per-process run id, so s may be a shared,
// live store; the records the clause writes are left to expire (after the
// suite's retention of an hour, by the store's judgement of time).
//
// The clauses move time through the now arguments, so s must judge leases
// by them (the caller's clock; see the Store contract). Store calls get
// ctx; when ctx ends, a clause waiting on a store that does not honour it is
// abandoned and Check returns ctx's error with what failed so far. A panic
// in the clause (or the store), or a runtime.Goexit that ends it halfway, is
// reported as a failure.
func (c Clause) Check(ctx context.Context, s idempotency.Store) error {
	if c.fn == nil {
		return errors.New("idemtest: the zero Clause checks nothing")
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: not run: %w", c.Name, err)
	}
	col := &collector{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		finished := false
		defer func() {
			r := recover()
			switch _, stopped := r.(clauseStopped); {
			case r != nil && !stopped:
				col.add(fmt.Errorf("%s: panic: %v", c.Name, r))
			case r == nil && !finished:
				// runtime.Goexit (a t.FailNow in the store): the clause
				// stopped halfway, having checked only part of itself.
				col.add(fmt.Errorf("%s: the clause stopped before its end (runtime.Goexit)", c.Name))
			}
		}()
		e := newEnv(col, c.Name, s)
		e.ctx = ctx
		c.fn(e)
		finished = true
	}()
	select {
	case <-done:
		if err := ctx.Err(); err != nil {
			// The clause finished, but its store calls may have failed only
			// because ctx ended: that is no verdict on the store.
			col.add(fmt.Errorf("%s: ctx ended during the check: %w", c.Name, err))
		}
	case <-ctx.Done():
		col.add(fmt.Errorf("%s: abandoned: %w", c.Name, ctx.Err()))
	}
	return col.err()
}

// clauseStopped is the panic value of collector.Fatalf.
type clauseStopped struct{}

// collector is the TB of Clause.Check.
type collector struct {
	mu   sync.Mutex
	errs []error
}

func (c *collector) add(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.errs = append(c.errs, err)
}

func (c *collector) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return errors.Join(c.errs...)
}

func (c *collector) Helper()             {}
func (c *collector) Logf(string, ...any) {}

func (c *collector) Errorf(format string, args ...any) {
	c.add(errors.New(fmt.Sprintf(format, args...)))
}

func (c *collector) Fatalf(format string, args ...any) {
	c.Errorf(format, args...)
	panic(clauseStopped{})
}
