package faultstore

import (
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
)

// An Injector chooses the fault for an operation on key, or nil for none.
// It is consulted once per operation, before the wrapped store is called,
// and must be safe for concurrent use.
type Injector interface {
	MaybeFault(op Op, key string) Fault
}

// InjectorFunc adapts a function to an Injector.
type InjectorFunc func(op Op, key string) Fault

// MaybeFault implements Injector.
func (f InjectorFunc) MaybeFault(op Op, key string) Fault { return f(op, key) }

// None injects nothing.
var None Injector = InjectorFunc(func(Op, string) Fault { return nil })

func maybe(inj Injector, op Op, key string) Fault {
	if inj == nil {
		return nil
	}
	return inj.MaybeFault(op, key)
}

// OnOps narrows inj to the operations listed.
func OnOps(inj Injector, ops ...Op) Injector {
	ops = slices.Clone(ops)
	return InjectorFunc(func(op Op, key string) Fault {
		if !slices.Contains(ops, op) {
			return nil
		}
		return maybe(inj, op, key)
	})
}

// OnKeys narrows inj to the keys for which match returns true.
func OnKeys(match func(key string) bool, inj Injector) Injector {
	return InjectorFunc(func(op Op, key string) Fault {
		if !match(key) {
			return nil
		}
		return maybe(inj, op, key)
	})
}

// Random passes on inj's fault with probability p (0 never, 1 always). The
// choices come from a generator seeded with seed and are drawn only for
// calls where inj has a fault, so a run that makes the same calls in the
// same order gets the same faults.
func Random(seed uint64, p float64, inj Injector) Injector {
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, 0x72616e646f6d))
	return InjectorFunc(func(op Op, key string) Fault {
		f := maybe(inj, op, key)
		if f == nil {
			return nil
		}
		mu.Lock()
		hit := rng.Float64() < p
		mu.Unlock()
		if !hit {
			return nil
		}
		return f
	})
}

// Times passes on inj's fault for the first n calls that get one, and
// nothing after: Times(2, OnOps(Error(nil), OpExtend)) fails two renewals.
func Times(n int, inj Injector) Injector {
	var seen atomic.Int64
	return InjectorFunc(func(op Op, key string) Fault {
		f := maybe(inj, op, key)
		if f == nil || seen.Add(1) > int64(n) {
			return nil
		}
		return f
	})
}

// Nth passes on inj's fault only for the nth call (counting from 1) that
// gets one.
func Nth(n int, inj Injector) Injector {
	var seen atomic.Int64
	return InjectorFunc(func(op Op, key string) Fault {
		f := maybe(inj, op, key)
		if f == nil || seen.Add(1) != int64(n) {
			return nil
		}
		return f
	})
}

// Any returns the fault of the first injector that has one.
func Any(injs ...Injector) Injector {
	injs = slices.Clone(injs)
	return InjectorFunc(func(op Op, key string) Fault {
		for _, inj := range injs {
			if f := maybe(inj, op, key); f != nil {
				return f
			}
		}
		return nil
	})
}

// All consults every injector and chains the faults they return, in order:
// All(OnOps(Latency(...), ...), OnOps(LostAck(nil), OpBegin)) gives a slow
// Begin whose reply is lost.
func All(injs ...Injector) Injector {
	injs = slices.Clone(injs)
	return InjectorFunc(func(op Op, key string) Fault {
		var fs []Fault
		for _, inj := range injs {
			if f := maybe(inj, op, key); f != nil {
				fs = append(fs, f)
			}
		}
		switch len(fs) {
		case 0:
			return nil
		case 1:
			return fs[0]
		}
		return Chain(fs...)
	})
}
