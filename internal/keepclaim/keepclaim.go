// Package keepclaim lets an adapter (idemhttp) ask an idempotency.Guard to
// keep a claim, rather than release it, should fn end without returning:
// when a handler calls runtime.Goexit (t.FailNow, a library giving up so)
// after it announced its work done, the key must not be given back for a
// retry to run that work a second time at once. It is internal, not an
// option of the Guard, because what "announced its work done" means is the
// adapter's to judge, while fn is still on the stack.
package keepclaim

import (
	"context"
	"sync/atomic"
)

// Key is the context key under which the context a Guard hands fn (and
// every context derived from it) answers with that claim's *Flag.
type Key struct{}

// Flag, once set, makes the Guard keep its claim until the lease ends if
// fn ends without returning (runtime.Goexit, or a panic that goes on): it
// stores nothing and does not release the key. It has no effect on a fn
// that returns.
type Flag struct{ set atomic.Bool }

// Set asks the Guard to keep the claim should fn end without returning.
func (f *Flag) Set() { f.set.Store(true) }

// IsSet reports whether Set was called.
func (f *Flag) IsSet() bool { return f.set.Load() }

// From returns the Flag of the claim whose fn runs with ctx, or nil when
// ctx is not such a context (nor derived from one).
func From(ctx context.Context) *Flag {
	f, _ := ctx.Value(Key{}).(*Flag)
	return f
}
