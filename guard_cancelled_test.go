package idempotency_test

import (
	"context"
	"errors"
	"testing"

	"github.com/archlab/idempotency"
)

// slowPath hides the MemoryStore from the Guard's fast path, so that both
// ways to a claim are tested.
type slowPath struct{ idempotency.Store }

// A caller whose ctx is done by the time its claim is granted (a shutdown,
// a client that hung up while Begin was under way) must not start fn: nothing has
// happened yet, so the key is given back and the answer is Unavailable with
// ctx's error, as when Begin itself sees the ctx done.
func TestCancelledCallerDoesNotStartFn(t *testing.T) {
	for name, wrap := range map[string]func(*idempotency.MemoryStore) idempotency.Store{
		"memory fast path": func(m *idempotency.MemoryStore) idempotency.Store { return m },
		"store interface":  func(m *idempotency.MemoryStore) idempotency.Store { return slowPath{m} },
	} {
		t.Run(name, func(t *testing.T) {
			m := idempotency.NewMemoryStore()
			g := &idempotency.Guard{Store: wrap(m)}
			ctx, cancel := context.WithCancel(context.Background())
			// The caller goes away while Begin is under way: after the
			// store looked at ctx, before it answered with the claim.
			m.Fault = func(op string) error {
				if op == "begin" {
					cancel()
				}
				return nil
			}
			ran := 0
			fn := func(context.Context) (idempotency.Response, error) {
				ran++
				return idempotency.Response{Status: 201}, nil
			}
			_, outcome, err := g.Do(ctx, "k", "fp", fn)
			if ran != 0 || outcome != idempotency.Unavailable || !errors.Is(err, idempotency.ErrUnavailable) || !errors.Is(err, context.Canceled) {
				t.Fatalf("Do with a cancelled ctx: fn ran %d times, %v, %v; want 0 runs, Unavailable wrapping ErrUnavailable and context.Canceled", ran, outcome, err)
			}
			// The key was given back: the retry runs at once.
			m.Fault = nil
			if _, outcome, err := g.Do(context.Background(), "k", "fp", fn); outcome != idempotency.Executed || err != nil || ran != 1 {
				t.Fatalf("retry: %v, %v, fn ran %d times; want Executed, nil, 1", outcome, err, ran)
			}
		})
	}
}
