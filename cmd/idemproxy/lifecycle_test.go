package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
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
	const every = time.Second
	stop := startSweeper(rec, every, 10, slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer stop()
	// One tick sweeps 10, 10 and 5, the rounds a short pause apart; one
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

// Once SIGTERM came, /readyz answers 503 while in-flight requests drain,
// so that nothing routes new traffic to a proxy that no longer accepts it;
// the request under way still completes and is stored.
func TestReadyzFailsWhileDraining(t *testing.T) {
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory")
	base := "http://" + p.admin
	if r := get(t, base+"/readyz"); r.status != http.StatusOK {
		t.Fatalf("/readyz before shutdown = %d %q", r.status, r.body)
	}
	held := make(chan reply, 1)
	go func() {
		r, _ := post(t, &http.Client{Timeout: 30 * time.Second}, p.proxy, "/block", "draining", "x")
		held <- r
	}()
	for deadline := time.Now().Add(10 * time.Second); up.total.Load() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the request never reached the upstream")
		}
	}
	stopped := make(chan error, 1)
	go func() { stopped <- p.stop() }()
	var r reply
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		r = get(t, base+"/readyz")
		if r.status != http.StatusOK || time.Now().After(deadline) {
			break
		}
	}
	if r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, "shutting down") {
		t.Errorf("/readyz while draining = %d %q, want 503 shutting down", r.status, r.body)
	}
	up.open()
	if got := <-held; got.status != http.StatusCreated {
		t.Errorf("the request in flight at SIGTERM got %d %q, want 201", got.status, got.body)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
}
