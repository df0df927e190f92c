package idemgrpc_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/archlab/idempotency/idemgrpc"
)

// TestKeyFuncWinsOverClientKey: a server that keys requests by their
// AIP-155 request_id, called through the client interceptor, which attaches
// a fresh metadata key to every call. The caller retries with the same
// request_id; the handler must run once.
func TestKeyFuncWinsOverClientKey(t *testing.T) {
	f := newFixture(t, fixtureOpts{
		server: &idemgrpc.Options{KeyFunc: func(_ context.Context, req any) string {
			if s, ok := req.(*structpb.Struct); ok {
				return s.GetFields()["request_id"].GetStringValue()
			}
			return ""
		}},
		dialOpts: []grpc.DialOption{grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(nil))},
	})
	putTwiceRunsOnce(t, f)
}

// TestStoredErrorReplaysHeaderAndDetails: with StoreErrors, a retry sees
// what the first call saw: code, message, details and header metadata,
// binary fields included.
func TestStoredErrorReplaysHeaderAndDetails(t *testing.T) {
	f := newFixture(t, fixtureOpts{server: &idemgrpc.Options{StoreErrors: true}})
	f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
		if err := grpc.SetHeader(ctx, metadata.Pairs("x-run", "1", "x-trace-bin", "\x00\xff\x10")); err != nil {
			return nil, err
		}
		st, _ := status.New(codes.NotFound, "no such order").WithDetails(&errdetails.ErrorInfo{Reason: "ORDER"})
		return nil, st.Err()
	}
	ctx := testCtx(t)
	_, h1, err1 := f.echo(ctx, "k-err-h", "v")
	_, h2, err2 := f.echo(ctx, "k-err-h", "v")
	s1, s2 := status.Convert(err1), status.Convert(err2)
	if !proto.Equal(s1.Proto(), s2.Proto()) || s1.Code() != codes.NotFound {
		t.Errorf("replayed status %v, want the first %v", s2.Proto(), s1.Proto())
	}
	for _, k := range []string{"x-run", "x-trace-bin"} {
		if got, want := h2.Get(k), h1.Get(k); len(want) != 1 || len(got) != 1 || got[0] != want[0] {
			t.Errorf("%s: replayed %q, first %q", k, got, want)
		}
	}
	if n := f.svc.executions("v"); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

// TestReplaySendsTrailer: trailer metadata the handler set is part of its
// answer; a replay that drops it differs from the original, for a response
// and for a stored error alike.
func TestReplaySendsTrailer(t *testing.T) {
	for _, fail := range []bool{false, true} {
		name := map[bool]string{false: "response", true: "stored-error"}[fail]
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{server: &idemgrpc.Options{StoreErrors: true}})
			f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
				if err := grpc.SetTrailer(ctx, metadata.Pairs("x-version", "7", "x-sum-bin", "\x01\x02")); err != nil {
					return nil, err
				}
				if fail {
					return nil, status.Error(codes.NotFound, "gone")
				}
				return wrapperspb.String("ok"), nil
			}
			ctx := testCtx(t)
			var trailers [2]metadata.MD
			for i := range trailers {
				_, _, err := f.echo(ctx, "k-trailer", "v", grpc.Trailer(&trailers[i]))
				if fail != (status.Code(err) == codes.NotFound) {
					t.Fatalf("call %d: %v", i, err)
				}
			}
			for _, k := range []string{"x-version", "x-sum-bin"} {
				if got, want := trailers[1].Get(k), trailers[0].Get(k); len(want) != 1 || len(got) != 1 || got[0] != want[0] {
					t.Errorf("trailer %s: replayed %q, first %q", k, got, want)
				}
			}
			if n := f.svc.executions("v"); n != 1 {
				t.Errorf("handler ran %d times, want 1", n)
			}
		})
	}
}

// TestShortClientDeadlineStillStores: the client's deadline reaches the
// handler's context, but a handler that finishes after it had its effect:
// its response is stored, and the retry with a longer deadline replays it.
func TestShortClientDeadlineStillStores(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
		if _, ok := ctx.Deadline(); !ok {
			return nil, status.Error(codes.Internal, "no deadline reached the handler")
		}
		<-ctx.Done()
		// The server's deadline can fire a moment before the client's: answer
		// well after both, so that the client has surely given up.
		time.Sleep(100 * time.Millisecond)
		return wrapperspb.String("charged"), nil
	}
	short, cancel := context.WithTimeout(testCtx(t), 50*time.Millisecond)
	defer cancel()
	if _, _, err := f.echo(short, "k-deadline", "v"); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("short call: %v, want DeadlineExceeded", err)
	}
	retryUntilReplayed(t, f, "k-deadline")
}
