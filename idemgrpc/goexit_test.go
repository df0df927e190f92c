package idemgrpc_test

import (
	"context"
	"runtime"
	"sync"
	"testing"

	"github.com/archlab/idempotency/idemgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestHandlerGoexit: a handler that calls runtime.Goexit (t.FailNow in a
// test handler, a library that gives up so) may have done its work; gRPC
// never answers the call, whose client waits until its deadline (here: it
// cancels) and retries. The retry must not run the handler again at once:
// the claim is kept until its lease ends, as after a panic. With Internal
// in ReleaseCodes the key is released, as it is for a panic.
func TestHandlerGoexit(t *testing.T) {
	for _, tc := range []struct {
		name       string
		opts       *idemgrpc.Options
		wantSecond codes.Code
		wantRuns   int
	}{
		{"keeps-claim", nil, codes.Aborted, 1},
		{"internal-in-release-codes-releases", &idemgrpc.Options{ReleaseCodes: []codes.Code{codes.Internal}}, codes.OK, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// gone is closed once the goroutine that served the first call
			// has unwound through the guard: deferred calls run on Goexit
			// too.
			outer, gone := firstCallDone()
			f := newFixture(t, fixtureOpts{server: tc.opts, outer: outer})
			f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
				if n == 1 {
					runtime.Goexit()
				}
				return wrapperspb.String("ok"), nil
			}
			ctx, cancel := context.WithCancel(testCtx(t))
			firstErr := make(chan error, 1)
			go func() {
				_, _, err := f.echo(ctx, "k-goexit", "v")
				firstErr <- err
			}()
			<-gone
			cancel() // gRPC never answers a call whose handler called Goexit
			if err := <-firstErr; status.Code(err) != codes.Canceled {
				t.Fatalf("first call: %v, want Canceled (no answer)", err)
			}
			_, _, err := f.echo(testCtx(t), "k-goexit", "v")
			if status.Code(err) != tc.wantSecond {
				t.Errorf("retry after Goexit: %v, want %v", err, tc.wantSecond)
			}
			if n := f.svc.executions("v"); n != tc.wantRuns {
				t.Errorf("handler ran %d times, want %d", n, tc.wantRuns)
			}
		})
	}
}

// firstCallDone returns an interceptor to chain before the guard, and a
// channel closed when the first call it sees has come back through it
// (returned, panicked or ended by runtime.Goexit): the guard is through
// with that call, its claim stored, released or kept.
func firstCallDone() (grpc.UnaryServerInterceptor, <-chan struct{}) {
	done := make(chan struct{})
	var once sync.Once
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		first := false
		once.Do(func() { first = true })
		if first {
			defer close(done)
		}
		return h(ctx, req)
	}, done
}
