package idemgrpc_test

import (
	"context"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemgrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestReleaseCodeAfterContextEndedKeepsClaim: a handler whose context
// ended mid-work (its client cancelled, its deadline passed, the Guard's
// Timeout) often answers with a code of ReleaseCodes: a downstream client
// cut short by the context reports Unavailable, or Aborted. That is no
// refusal made before the work: the downstream write may have been applied.
// The claim must be kept until its lease ends, not released for the retry
// to run the handler again at once.
func TestReleaseCodeAfterContextEndedKeepsClaim(t *testing.T) {
	for _, tc := range []struct {
		name    string
		detach  bool
		timeout bool // the Guard's Timeout ends the handler's context, not the client
		code    codes.Code
	}{
		{"client-cancels/unavailable", false, false, codes.Unavailable},
		{"client-cancels/aborted", false, false, codes.Aborted},
		{"guard-timeout/unavailable", false, true, codes.Unavailable},
		{"guard-timeout-detached/resource-exhausted", true, true, codes.ResourceExhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := &idempotency.Options{Lease: time.Minute}
			if tc.timeout {
				o.Timeout = 100 * time.Millisecond
			}
			outer, firstDone := firstCallDone()
			f := newFixture(t, fixtureOpts{server: &idemgrpc.Options{Detach: tc.detach}, guard: o, outer: outer})
			entered := make(chan struct{})
			f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
				if n == 1 {
					close(entered)
					<-ctx.Done() // the downstream call is cut short
					return nil, status.Error(tc.code, "downstream: "+ctx.Err().Error())
				}
				return wrapperspb.String("second run"), nil
			}
			ctx, cancel := context.WithCancel(testCtx(t))
			defer cancel()
			firstErr := make(chan error, 1)
			go func() {
				_, _, err := f.echo(ctx, "k-cut", "v")
				firstErr <- err
			}()
			<-entered
			if !tc.timeout {
				cancel()
			}
			err := <-firstErr
			if tc.timeout && status.Code(err) != tc.code {
				t.Fatalf("first call: %v, want %v", err, tc.code)
			}
			<-firstDone // the guard is through with the first call
			_, _, err = f.echo(testCtx(t), "k-cut", "v")
			if status.Code(err) != codes.Aborted {
				t.Errorf("retry: %v, want Aborted (the claim is kept)", err)
			}
			if n := f.svc.executions("v"); n != 1 {
				t.Errorf("handler ran %d times, want 1", n)
			}
		})
	}
}
