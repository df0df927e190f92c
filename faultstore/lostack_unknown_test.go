package faultstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/faultstore"
)

// timeoutAfterWrite applies every write to its MemoryStore, then fails it
// as a real engine does when its connection drops after the commit: with an
// error wrapping ErrUnavailable, which the Store contract says "may still
// have been applied".
type timeoutAfterWrite struct {
	*idempotency.MemoryStore
}

var errReset = errors.New("read tcp: connection reset by peer")

func (s timeoutAfterWrite) Begin(ctx context.Context, key, fp string, now time.Time, lease, retention time.Duration) (idempotency.Record, bool, error) {
	if _, _, err := s.MemoryStore.Begin(ctx, key, fp, now, lease, retention); err != nil {
		return idempotency.Record{}, false, err
	}
	return idempotency.Record{}, false, fmt.Errorf("engine: begin: %w: %w", idempotency.ErrUnavailable, errReset)
}

func (s timeoutAfterWrite) Complete(ctx context.Context, key string, token uint64, resp idempotency.Response, now time.Time, retention time.Duration) error {
	if err := s.MemoryStore.Complete(ctx, key, token, resp, now, retention); err != nil {
		return err
	}
	return fmt.Errorf("engine: complete: %w: %w", idempotency.ErrUnavailable, errReset)
}

// TestLostAckOverUnknownOutcome: when the wrapped store's own answer is an
// error that leaves the outcome unknown, a lost ack must not report the
// operation as certainly not applied. It did (Applied false), and storecert
// drops such calls from the history it checks, as calls that changed
// nothing: a claim or a result the store holds went missing from it.
func TestLostAckOverUnknownOutcome(t *testing.T) {
	ctx := context.Background()
	mem := idempotency.NewMemoryStore()
	s := faultstore.New(timeoutAfterWrite{mem}, faultstore.LostAck(nil))

	_, _, err := begin(s, "k")
	var ie *faultstore.InjectedError
	if !errors.As(err, &ie) || !errors.Is(err, idempotency.ErrUnavailable) {
		t.Fatalf("Begin = %v; want an InjectedError wrapping ErrUnavailable", err)
	}
	rec, gerr := mem.Get(ctx, "k", t0)
	if gerr != nil {
		t.Fatalf("the engine did not apply the Begin: %v", gerr)
	}
	if !ie.Applied {
		t.Errorf("Begin error %q says Applied = false; the store holds the claim (token %d)", err, rec.Token)
	}

	err = s.Complete(ctx, "k", rec.Token, idempotency.Response{Status: 201}, t0, retention)
	if !errors.As(err, &ie) {
		t.Fatalf("Complete = %v; want an InjectedError", err)
	}
	if rec, _ := mem.Get(ctx, "k", t0); rec.State != idempotency.Done {
		t.Fatalf("the engine did not apply the Complete: %+v", rec)
	}
	if !ie.Applied {
		t.Errorf("Complete error %q says Applied = false; the store holds the result", err)
	}
	// A refusal is still known to have changed nothing.
	err = s.Complete(ctx, "k", rec.Token, idempotency.Response{Status: 202}, t0, retention)
	if !errors.As(err, &ie) || ie.Applied || errors.Is(err, idempotency.ErrLeaseLost) {
		t.Errorf("a refused Complete under LostAck = %v; want Applied = false and no ErrLeaseLost in the chain", err)
	}
}
