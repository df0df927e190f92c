package idemgrpc_test

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/archlab/idempotency/idemgrpc"
)

// recoverInterceptor answers a handler's panic with Internal, as
// go-grpc-middleware's recovery interceptor does.
func recoverInterceptor(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (_ any, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = status.Errorf(codes.Internal, "panic: %v", r)
		}
	}()
	return h(ctx, req)
}

// TestHandlerPanic: what doc.go says of a panicking handler. The handler
// may have done its work before it panicked, so wherever the recovery
// interceptor is in the chain the retry must not run it again at once: the
// claim is kept until its lease ends. Before the guard, the guard sees the
// panic, and keeps the claim as it does for an Internal error; after it,
// the panic is an Internal error like any other. With Internal in
// ReleaseCodes both release the key, and the retry runs the handler again.
func TestHandlerPanic(t *testing.T) {
	releaseInternal := &idemgrpc.Options{ReleaseCodes: []codes.Code{codes.Internal}}
	tests := []struct {
		name       string
		o          fixtureOpts
		wantSecond codes.Code
		wantRuns   int
	}{
		{"recovered-before-guard-keeps-claim", fixtureOpts{outer: recoverInterceptor}, codes.Aborted, 1},
		{"recovered-after-guard-keeps-claim", fixtureOpts{inner: recoverInterceptor}, codes.Aborted, 1},
		{"recovered-before-guard-internal-released", fixtureOpts{outer: recoverInterceptor, server: releaseInternal}, codes.OK, 2},
		{"recovered-after-guard-internal-released", fixtureOpts{inner: recoverInterceptor, server: releaseInternal}, codes.OK, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.o)
			f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
				if n == 1 {
					panic("handler bug")
				}
				return wrapperspb.String(fmt.Sprint("run-", n)), nil
			}
			ctx := testCtx(t)
			if _, _, err := f.echo(ctx, "k-panic", "v"); status.Code(err) != codes.Internal {
				t.Fatalf("panicking call: %v, want Internal from the recovery interceptor", err)
			}
			if _, _, err := f.echo(ctx, "k-panic", "v"); status.Code(err) != tc.wantSecond {
				t.Fatalf("retry: %v, want %v", err, tc.wantSecond)
			}
			if n := f.svc.executions("v"); n != tc.wantRuns {
				t.Errorf("handler ran %d times, want %d", n, tc.wantRuns)
			}
		})
	}
}

// TestMetadataIsNotFingerprinted: metadata other than the key is not part
// of the request's identity (a retry carries a new trace id, a renewed
// token): the retry is replayed, not refused. A Scope that reads a metadata
// field makes its value part of the key's namespace: another value is
// another operation.
func TestMetadataIsNotFingerprinted(t *testing.T) {
	ctx := testCtx(t)
	with := func(k, v string) context.Context { return metadata.AppendToOutgoingContext(ctx, k, v) }

	f := newFixture(t, fixtureOpts{})
	for _, trace := range []string{"t-1", "t-2"} {
		if _, _, err := f.echo(with("x-trace-id", trace), "k-md", "v"); err != nil {
			t.Fatalf("trace %s: %v", trace, err)
		}
	}
	if n := f.svc.executions("v"); n != 1 {
		t.Errorf("handler ran %d times for one key with two trace ids, want 1", n)
	}

	scoped := newFixture(t, fixtureOpts{server: &idemgrpc.Options{Scope: func(ctx context.Context) string {
		return idemgrpc.DefaultScope(ctx) + "/" + fmt.Sprint(metadata.ValueFromIncomingContext(ctx, "x-region"))
	}}})
	for _, region := range []string{"eu", "us", "eu"} {
		if _, _, err := scoped.echo(with("x-region", region), "k-md", "v"); err != nil {
			t.Fatalf("region %s: %v", region, err)
		}
	}
	if n := scoped.svc.executions("v"); n != 2 {
		t.Errorf("handler ran %d times for one key in regions eu, us, eu; want 2", n)
	}
}
