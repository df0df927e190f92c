package idempotency_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/faultstore"
)

// sentinelEnv is what a case of TestDoSentinels works with.
type sentinelEnv struct {
	mem    *idempotency.MemoryStore
	cancel context.CancelFunc // cancels the caller's ctx
}

// beginThen is a Store whose Begin runs then after the wrapped store's.
type beginThen struct {
	idempotency.Store
	then func()
}

func (s beginThen) Begin(ctx context.Context, key, fingerprint string, now time.Time, lease, retention time.Duration) (idempotency.Record, bool, error) {
	rec, ok, err := s.Store.Begin(ctx, key, fingerprint, now, lease, retention)
	s.then()
	return rec, ok, err
}

// TestDoSentinels: for each way fn's response can go unstored, or a
// Release the Guard tries can fail, Do's error wraps ErrNotStored or
// ErrNotReleased, and the store's sentinels (ErrUnavailable, ErrLeaseLost)
// match exactly where they matched before those two were added. With
// Executed, ErrNotStored is what tells "fn succeeded, its response was not
// stored" (the response is fn's) from "fn failed": it never comes with
// fn's error.
func TestDoSentinels(t *testing.T) {
	errFn := errors.New("fn failed")
	charged := idempotency.Response{Status: 201, Body: []byte("charged")}
	succeed := func(context.Context, sentinelEnv) (idempotency.Response, error) { return charged, nil }
	deleteKey := func(e sentinelEnv) {
		if err := e.mem.Delete(context.Background(), "k"); err != nil {
			panic(err)
		}
	}
	all := []error{idempotency.ErrNotStored, idempotency.ErrNotReleased, idempotency.ErrUnavailable, idempotency.ErrLeaseLost}
	for _, tc := range []struct {
		name  string
		opts  idempotency.Options
		fault string // the MemoryStore operation its Fault hook fails ("": none)
		store func(sentinelEnv) idempotency.Store
		fn    func(context.Context, sentinelEnv) (idempotency.Response, error)
		out   idempotency.Outcome
		is    []error // nil: Do returns no error
	}{
		{name: "stored", fn: succeed, out: idempotency.Executed},
		{name: "fn fails", fn: func(context.Context, sentinelEnv) (idempotency.Response, error) {
			return idempotency.Response{}, errFn
		}, out: idempotency.Executed, is: []error{errFn}},
		{name: "retryable fn fails, released", fn: func(context.Context, sentinelEnv) (idempotency.Response, error) {
			return idempotency.Response{}, idempotency.Retryable(errFn)
		}, out: idempotency.Executed, is: []error{errFn}},

		{name: "complete unavailable", fault: "complete", fn: succeed, out: idempotency.Executed,
			is: []error{idempotency.ErrNotStored, idempotency.ErrUnavailable}},
		{name: "complete applied, its answer lost", store: func(e sentinelEnv) idempotency.Store {
			return faultstore.New(e.mem, faultstore.OnOps(faultstore.LostAck(nil), faultstore.OpComplete))
		}, fn: succeed, out: idempotency.Executed,
			is: []error{idempotency.ErrNotStored, idempotency.ErrUnavailable, faultstore.ErrInjected}},
		{name: "key gone by complete", fn: func(_ context.Context, e sentinelEnv) (idempotency.Response, error) {
			deleteKey(e)
			return charged, nil
		}, out: idempotency.Executed, is: []error{idempotency.ErrNotStored, idempotency.ErrLeaseLost}},
		{name: "lease lost while fn ran", opts: idempotency.Options{Lease: 3 * time.Second},
			fn: func(ctx context.Context, e sentinelEnv) (idempotency.Response, error) {
				deleteKey(e)
				<-ctx.Done() // a renewal is rejected
				return charged, nil
			}, out: idempotency.Executed, is: []error{idempotency.ErrNotStored, idempotency.ErrLeaseLost}},
		{name: "lease lost while a failing fn ran", opts: idempotency.Options{Lease: 3 * time.Second},
			fn: func(ctx context.Context, e sentinelEnv) (idempotency.Response, error) {
				deleteKey(e)
				<-ctx.Done()
				return idempotency.Response{}, idempotency.Retryable(errFn)
			}, out: idempotency.Executed, is: []error{errFn, idempotency.ErrLeaseLost}},
		{name: "timeout, complete unavailable", opts: idempotency.Options{Timeout: 5 * time.Second}, fault: "complete",
			fn: func(ctx context.Context, _ sentinelEnv) (idempotency.Response, error) {
				<-ctx.Done()
				return charged, nil
			}, out: idempotency.Executed, is: []error{idempotency.ErrNotStored, idempotency.ErrUnavailable}},

		{name: "retryable, release unavailable", fault: "release", fn: func(context.Context, sentinelEnv) (idempotency.Response, error) {
			return idempotency.Response{}, idempotency.Retryable(errFn)
		}, out: idempotency.Executed, is: []error{errFn, idempotency.ErrNotReleased, idempotency.ErrUnavailable}},
		{name: "retryable, release refused by a faultstore", store: func(e sentinelEnv) idempotency.Store {
			return faultstore.New(e.mem, faultstore.OnOps(faultstore.Error(nil), faultstore.OpRelease))
		}, fn: func(context.Context, sentinelEnv) (idempotency.Response, error) {
			return idempotency.Response{}, idempotency.Retryable(errFn)
		}, out: idempotency.Executed, is: []error{errFn, idempotency.ErrNotReleased, idempotency.ErrUnavailable, faultstore.ErrInjected}},
		{name: "retryable, key gone by release", fn: func(_ context.Context, e sentinelEnv) (idempotency.Response, error) {
			deleteKey(e)
			return idempotency.Response{}, idempotency.Retryable(errFn)
		}, out: idempotency.Executed, is: []error{errFn, idempotency.ErrNotReleased, idempotency.ErrLeaseLost}},
		{name: "timeout, retryable, release unavailable", opts: idempotency.Options{Timeout: 5 * time.Second}, fault: "release",
			fn: func(ctx context.Context, _ sentinelEnv) (idempotency.Response, error) {
				<-ctx.Done()
				return idempotency.Response{}, idempotency.Retryable(errFn)
			}, out: idempotency.Executed, is: []error{errFn, idempotency.ErrNotReleased, idempotency.ErrUnavailable}},

		{name: "caller gone during the claim, released", store: func(e sentinelEnv) idempotency.Store {
			return beginThen{e.mem, e.cancel}
		}, fn: succeed, out: idempotency.Unavailable, is: []error{idempotency.ErrUnavailable, context.Canceled}},
		{name: "caller gone during the claim, release unavailable", fault: "release", store: func(e sentinelEnv) idempotency.Store {
			return beginThen{e.mem, e.cancel}
		}, fn: succeed, out: idempotency.Unavailable,
			is: []error{idempotency.ErrNotReleased, idempotency.ErrUnavailable, context.Canceled}},
		{name: "claim answered too late, release unavailable", opts: idempotency.Options{Lease: 10 * time.Second}, fault: "release",
			store: func(e sentinelEnv) idempotency.Store {
				return beginThen{e.mem, func() { time.Sleep(10 * time.Second) }}
			}, fn: succeed, out: idempotency.Unavailable, is: []error{idempotency.ErrNotReleased, idempotency.ErrUnavailable}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				e := sentinelEnv{mem: idempotency.NewMemoryStore(), cancel: cancel}
				if tc.fault != "" {
					e.mem.Fault = func(op string) error {
						if op == tc.fault {
							return errors.New("injected outage")
						}
						return nil
					}
				}
				var store idempotency.Store = e.mem
				if tc.store != nil {
					store = tc.store(e)
				}
				g, err := idempotency.NewGuard(store, &tc.opts)
				if err != nil {
					t.Fatal(err)
				}
				ran := false
				resp, out, err := g.Do(ctx, "k", "fp", func(ctx context.Context) (idempotency.Response, error) {
					ran = true
					return tc.fn(ctx, e)
				})
				if out != tc.out {
					t.Fatalf("Do = %s, %v; want %s", out, err, tc.out)
				}
				if ran != (out == idempotency.Executed) {
					t.Errorf("fn ran: %v with %s", ran, out)
				}
				if (err == nil) != (tc.is == nil) {
					t.Fatalf("Do = %s, %v; want an error wrapping %v", out, err, tc.is)
				}
				for _, target := range tc.is {
					if !errors.Is(err, target) {
						t.Errorf("Do = %v; want it to wrap %q", err, target)
					}
				}
			outer:
				for _, target := range all {
					for _, want := range tc.is {
						if want == target {
							continue outer
						}
					}
					if errors.Is(err, target) {
						t.Errorf("Do = %v; want it not to wrap %q", err, target)
					}
				}
				if errors.Is(err, idempotency.ErrNotStored) && (resp.Status != charged.Status || string(resp.Body) != string(charged.Body)) {
					t.Errorf("Do = %+v with ErrNotStored; want fn's response", resp)
				}
				if (errors.Is(err, idempotency.ErrNotReleased) || errors.Is(err, idempotency.ErrLeaseLost)) && idempotency.IsRetryable(err) {
					t.Errorf("Do = %v: IsRetryable after a release that did not happen", err)
				}
			})
		})
	}
}
