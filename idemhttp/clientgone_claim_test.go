package idemhttp

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

// claimThenWait grants claims and, while hold is set, holds the answer
// until the caller's ctx is done: the client hangs up while its claim is
// being made.
type claimThenWait struct {
	idempotency.Store
	hold    *atomic.Bool
	claimed chan struct{}
}

func (s claimThenWait) Begin(ctx context.Context, key, fp string, now time.Time, lease, retention time.Duration) (idempotency.Record, bool, error) {
	rec, ok, err := s.Store.Begin(ctx, key, fp, now, lease, retention)
	if ok && s.hold.Load() {
		select {
		case s.claimed <- struct{}{}:
		default:
		}
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
		}
	}
	return rec, ok, err
}

// TestClientGoneDuringClaimSkipsHandler: a client that hangs up while its
// claim is being made never reaches the handler, and the key is given
// back: its retry runs the handler once.
func TestClientGoneDuringClaimSkipsHandler(t *testing.T) {
	store := claimThenWait{Store: idempotency.NewMemoryStore(), hold: new(atomic.Bool), claimed: make(chan struct{}, 1)}
	store.hold.Store(true)
	g, err := idempotency.NewGuard(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	var events eventLog
	mw, err := New(g, &Options{Observer: &events})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header["Idempotency-Key"] = key("gone")
	done := make(chan error, 1)
	go func() {
		resp, err := srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	select {
	case <-store.claimed:
	case <-time.After(5 * time.Second):
		t.Fatal("the claim was never made")
	}
	cancel() // the client hangs up: the transport closes the connection
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("client: %v, want context.Canceled", err)
	}
	e := events.waitOutcome(t, Unavailable)
	if !errors.Is(e.Err, context.Canceled) {
		t.Errorf("Observer: %v with %v; want Unavailable with context.Canceled", e.Outcome, e.Err)
	}
	if n := calls.Load(); n != 0 {
		t.Fatalf("handler ran %d times for a client gone before its claim was granted; want 0", n)
	}

	store.hold.Store(false)
	retry, err := http.NewRequest(http.MethodPost, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	retry.Header["Idempotency-Key"] = key("gone")
	resp, err := srv.Client().Do(retry)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || calls.Load() != 1 {
		t.Errorf("retry: %d, handler ran %d times; want 201 and one run (the key given back)", resp.StatusCode, calls.Load())
	}
}
