package idemgrpc_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemgrpc"
)

// TestEveryStoreFailureIsReported: whenever the store fails a call, before
// or after its handler ran, Options.OnStoreError hears of it once (unless
// the caller left while the key was claimed: TestCallerGoneDuringClaim), with an
// error that names what failed and wraps the store's, and the client gets
// the handler's own answer whenever the handler ran.
func TestEveryStoreFailureIsReported(t *testing.T) {
	outage := errors.New("injected outage at redis-7.internal:6379")
	tests := []struct {
		name string
		// failOp is the MemoryStore operation that fails ("" none).
		failOp      string
		storeErrors bool
		// handler answers the first execution; deleteKey makes it delete
		// its own key first (the claim is lost); waitCut makes it wait for
		// the Guard to end its context.
		handlerCode codes.Code
		deleteKey   bool
		waitCut     bool
		// wantCode and wantValue are what the client gets.
		wantCode  codes.Code
		wantValue string
		wantRuns  int
		// wantIn is a phrase of the reported error, wantIs what it wraps.
		wantIn string
		wantIs []error
	}{
		{name: "begin", failOp: "begin", wantCode: codes.Unavailable, wantRuns: 0,
			wantIn: "claim the key", wantIs: []error{idempotency.ErrUnavailable, outage}},
		{name: "complete", failOp: "complete", wantCode: codes.OK, wantValue: "done", wantRuns: 1,
			wantIn: "store the result", wantIs: []error{idempotency.ErrUnavailable, outage}},
		{name: "complete-stored-error", failOp: "complete", storeErrors: true, handlerCode: codes.NotFound,
			wantCode: codes.NotFound, wantRuns: 1,
			wantIn: "store the result", wantIs: []error{idempotency.ErrUnavailable, outage}},
		{name: "release", failOp: "release", handlerCode: codes.Unavailable,
			wantCode: codes.Unavailable, wantRuns: 1,
			wantIn: "release the key", wantIs: []error{outage}},
		{name: "lease-lost", deleteKey: true, wantCode: codes.OK, wantValue: "done", wantRuns: 1,
			wantIn: "store the result", wantIs: []error{idempotency.ErrLeaseLost}},
		{name: "renew", failOp: "extend", waitCut: true, wantCode: codes.Unavailable, wantRuns: 1,
			wantIn: "renew the lease", wantIs: []error{idempotency.ErrUnavailable}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var reported []string
			var reportedErrs []error
			f := newFixture(t, fixtureOpts{
				server: &idemgrpc.Options{StoreErrors: tc.storeErrors, OnStoreError: func(_ context.Context, method string, err error) {
					mu.Lock()
					defer mu.Unlock()
					reported = append(reported, method)
					reportedErrs = append(reportedErrs, err)
				}},
				guard: &idempotency.Options{Lease: 300 * time.Millisecond, RenewEvery: 30 * time.Millisecond},
				setupStore: func(s *idempotency.MemoryStore) {
					s.Fault = func(op string) error {
						if op == tc.failOp {
							return outage
						}
						return nil
					}
				},
			})
			f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
				if tc.deleteKey {
					if err := f.store.Delete(ctx, "k-fail"); err != nil {
						return nil, err
					}
				}
				if tc.waitCut {
					<-ctx.Done()
					return nil, ctx.Err()
				}
				if tc.handlerCode != codes.OK {
					return nil, status.Error(tc.handlerCode, "the handler's own answer")
				}
				return wrapperspb.String("done"), nil
			}
			out, _, err := f.echo(testCtx(t), "k-fail", "v")
			if got := status.Code(err); got != tc.wantCode {
				t.Fatalf("call: %v, want %v", err, tc.wantCode)
			}
			if tc.wantValue != "" && out.GetValue() != tc.wantValue {
				t.Errorf("call answered %q, want the handler's %q", out.GetValue(), tc.wantValue)
			}
			if tc.handlerCode != codes.OK && status.Convert(err).Message() != "the handler's own answer" {
				t.Errorf("call: %v, want the handler's own status", err)
			}
			if n := f.svc.executions("v"); n != tc.wantRuns {
				t.Errorf("handler ran %d times, want %d", n, tc.wantRuns)
			}
			// The hook runs before the answer is sent: no wait needed.
			mu.Lock()
			defer mu.Unlock()
			if len(reportedErrs) != 1 {
				t.Fatalf("OnStoreError called %d times (%v), want once", len(reportedErrs), reportedErrs)
			}
			rerr := reportedErrs[0]
			if reported[0] != echoMethod {
				t.Errorf("OnStoreError method %q, want %q", reported[0], echoMethod)
			}
			if !strings.Contains(rerr.Error(), tc.wantIn) {
				t.Errorf("OnStoreError got %q, want it to say %q", rerr, tc.wantIn)
			}
			for _, target := range tc.wantIs {
				if !errors.Is(rerr, target) {
					t.Errorf("OnStoreError got %q, which does not wrap %q", rerr, target)
				}
			}
		})
	}
}

// TestNoStoreFailureNoReport: handler errors of every kind, and the
// handler's context ended by its caller, are not store failures.
func TestNoStoreFailureNoReport(t *testing.T) {
	for _, code := range []codes.Code{codes.OK, codes.Unavailable, codes.NotFound, codes.Internal} {
		t.Run(code.String(), func(t *testing.T) {
			var mu sync.Mutex
			var reported []error
			f := newFixture(t, fixtureOpts{server: &idemgrpc.Options{StoreErrors: code == codes.NotFound, OnStoreError: func(_ context.Context, _ string, err error) {
				mu.Lock()
				defer mu.Unlock()
				reported = append(reported, err)
			}}})
			f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
				if code != codes.OK {
					return nil, status.Error(code, "handler")
				}
				return wrapperspb.String("ok"), nil
			}
			ctx := testCtx(t)
			for range 2 {
				_, _, _ = f.echo(ctx, "k-fine", "v")
			}
			mu.Lock()
			defer mu.Unlock()
			if len(reported) != 0 {
				t.Errorf("OnStoreError called with %v, want never", reported)
			}
		})
	}
}
