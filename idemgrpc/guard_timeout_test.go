package idemgrpc_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemgrpc"
)

// TestGuardTimeoutIsNoStoreFailure: the Guard's Timeout ending the handler
// is not a lease the store failed to renew: OnStoreError hears nothing, the
// caller gets the handler's DeadlineExceeded (not Unavailable), and the
// claim is kept, since the handler may have done part of its work.
func TestGuardTimeoutIsNoStoreFailure(t *testing.T) {
	var mu sync.Mutex
	var reported []error
	f := newFixture(t, fixtureOpts{
		server: &idemgrpc.Options{OnStoreError: func(_ context.Context, _ string, err error) {
			mu.Lock()
			defer mu.Unlock()
			reported = append(reported, err)
		}},
		guard: &idempotency.Options{Lease: time.Minute, Timeout: 50 * time.Millisecond},
	})
	f.svc.onEcho = func(ctx context.Context, _ *wrapperspb.StringValue, _ int) (*wrapperspb.StringValue, error) {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	_, _, err := f.echo(testCtx(t), "k-timeout", "v")
	if got := status.Code(err); got != codes.DeadlineExceeded {
		t.Fatalf("call: %v, want DeadlineExceeded", err)
	}
	mu.Lock()
	if len(reported) != 0 {
		t.Errorf("OnStoreError called for a timeout: %v", reported)
	}
	mu.Unlock()
	_, _, err = f.echo(testCtx(t), "k-timeout", "v")
	if got := status.Code(err); got != codes.Aborted {
		t.Errorf("retry: %v, want Aborted (in flight: the claim is kept)", err)
	}
	if n := f.svc.executions("v"); n != 1 {
		t.Errorf("handler ran %d times; want 1 (the claim is kept)", n)
	}
}
