package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/boltstore"
)

// The sweeper removes a backlog larger than one round's limit at its next
// tick, not one limit per interval: a window that fills faster than that
// would otherwise grow without end.
func TestSweeperClearsBacklog(t *testing.T) {
	s, err := boltstore.Open(filepath.Join(t.TempDir(), "sweep.db"), &boltstore.Options{SweepPerWrite: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	past := time.Now().Add(-time.Hour)
	const n = 25
	for i := range n {
		if _, ok, err := s.Begin(ctx, fmt.Sprint("k", i), "fp", past, time.Second, time.Minute); err != nil || !ok {
			t.Fatalf("claim %d: %v %v", i, ok, err)
		}
	}
	rec := &recordingSweeper{s: s, calls: make(chan sweepCall, 16)}
	const every = 300 * time.Millisecond
	stop := startSweeper(rec, every, 10, slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer stop()
	// One tick sweeps 10, 10 and 5, one round right after the other; one
	// round per tick would leave every interval between them.
	var prev time.Time
	for i, want := range []int{10, 10, 5} {
		var c sweepCall
		select {
		case c = <-rec.calls:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d never came", i)
		}
		if c.err != nil || c.n != want {
			t.Fatalf("round %d removed %d (%v), want %d", i, c.n, c.err, want)
		}
		if i > 0 && c.at.Sub(prev) >= every/2 {
			t.Errorf("round %d came %v after the one before: the backlog waited for the next tick", i, c.at.Sub(prev))
		}
		prev = c.at
	}
	for i := range n {
		if _, err := s.Get(ctx, fmt.Sprint("k", i), past); !errors.Is(err, idempotency.ErrNotFound) {
			t.Errorf("k%d after sweeping: %v, want ErrNotFound", i, err)
		}
	}
}

type sweepCall struct {
	at  time.Time
	n   int
	err error
}

// recordingSweeper is a store's Sweep that reports each call.
type recordingSweeper struct {
	s     *boltstore.Store
	calls chan sweepCall
}

func (r *recordingSweeper) Sweep(ctx context.Context, now time.Time, limit int) (int, error) {
	n, err := r.s.Sweep(ctx, now, limit)
	select {
	case r.calls <- sweepCall{time.Now(), n, err}:
	default:
	}
	return n, err
}
