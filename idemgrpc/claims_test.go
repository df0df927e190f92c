package idemgrpc_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	_ "google.golang.org/grpc/encoding/gzip" // so that SetSendCompressor has a compressor to pick
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemgrpc"
)

// afterBegin calls after once the wrapped store's Begin has answered.
type afterBegin struct {
	idempotency.Store
	after func()
}

func (s afterBegin) Begin(ctx context.Context, key, fingerprint string, now time.Time, lease, retention time.Duration) (idempotency.Record, bool, error) {
	rec, ok, err := s.Store.Begin(ctx, key, fingerprint, now, lease, retention)
	s.after()
	return rec, ok, err
}

// TestCallerGoneDuringClaim: the caller's context ends while the key is
// being claimed (the store grants the claim anyway). The call is answered
// Canceled or DeadlineExceeded, the handler does not run, and the claim is
// given back. That is no store failure, and OnStoreError hears nothing of
// it. When the claim cannot be given back (the store fails the Release)
// the key stays blocked until its lease ends, and, as Options.OnStoreError
// says, that is not reported either.
func TestCallerGoneDuringClaim(t *testing.T) {
	for _, tc := range []struct {
		name        string
		deadline    bool // the deadline passes, instead of a cancel
		releaseDown bool
		want        codes.Code
	}{
		{"canceled", false, false, codes.Canceled},
		{"deadline", true, false, codes.DeadlineExceeded},
		{"canceled-release-fails", false, true, codes.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := idempotency.NewMemoryStore()
			outage := errors.New("injected outage")
			if tc.releaseDown {
				mem.Fault = func(op string) error {
					if op == "release" {
						return outage
					}
					return nil
				}
			}
			base := metadata.NewIncomingContext(testCtx(t), metadata.Pairs(idemgrpc.MetadataKey, "k-gone-claim"))
			ctx, cancel := context.WithCancel(base)
			defer cancel()
			after := cancel
			if tc.deadline {
				var dcancel context.CancelFunc
				ctx, dcancel = context.WithTimeout(base, 50*time.Millisecond)
				defer dcancel()
				after = func() { <-ctx.Done() }
			}
			g, err := idempotency.NewGuard(afterBegin{Store: mem, after: after}, &idempotency.Options{Lease: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var reported []error
			in, err := idemgrpc.UnaryServerInterceptor(g, &idemgrpc.Options{OnStoreError: func(_ context.Context, _ string, err error) {
				mu.Lock()
				defer mu.Unlock()
				reported = append(reported, err)
			}})
			if err != nil {
				t.Fatal(err)
			}
			ran := false
			_, err = in(ctx, wrapperspb.String("v"), &grpc.UnaryServerInfo{FullMethod: echoMethod}, func(context.Context, any) (any, error) {
				ran = true
				return wrapperspb.String("charged"), nil
			})
			if status.Code(err) != tc.want || ran {
				t.Fatalf("call: %v, handler ran %v; want %v without running it", err, ran, tc.want)
			}
			rec, gerr := mem.Get(context.Background(), "k-gone-claim", time.Now())
			mu.Lock()
			defer mu.Unlock()
			if !tc.releaseDown {
				if !errors.Is(gerr, idempotency.ErrNotFound) {
					t.Errorf("store after the call: %+v, %v; want the claim given back", rec, gerr)
				}
				if len(reported) != 0 {
					t.Errorf("OnStoreError got %v, want nothing: the caller left, the store did not fail", reported)
				}
				return
			}
			if gerr != nil || rec.State != idempotency.Processing {
				t.Errorf("store after the call: %+v, %v; want the claim left behind", rec, gerr)
			}
			if len(reported) != 1 || !errors.Is(reported[0], outage) || errors.Is(reported[0], context.Canceled) {
				t.Errorf("OnStoreError got %v, want the failed release alone (the key stays blocked until its lease ends)", reported)
			}
		})
	}
}

// TestReleaseCodes: the default ReleaseCodes are Unavailable,
// ResourceExhausted and Aborted; an empty non-nil slice releases on none.
func TestReleaseCodes(t *testing.T) {
	for _, tc := range []struct {
		name       string
		release    []codes.Code
		code       codes.Code
		wantSecond codes.Code
		wantRuns   int
	}{
		{"default/aborted-releases", nil, codes.Aborted, codes.OK, 2},
		{"default/resource-exhausted-releases", nil, codes.ResourceExhausted, codes.OK, 2},
		{"default/failed-precondition-keeps", nil, codes.FailedPrecondition, codes.Aborted, 1},
		{"empty/unavailable-keeps", []codes.Code{}, codes.Unavailable, codes.Aborted, 1},
		{"empty/aborted-keeps", []codes.Code{}, codes.Aborted, codes.Aborted, 1},
		{"set/not-found-releases", []codes.Code{codes.NotFound}, codes.NotFound, codes.OK, 2},
		{"set/unavailable-keeps", []codes.Code{codes.NotFound}, codes.Unavailable, codes.Aborted, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{server: &idemgrpc.Options{ReleaseCodes: tc.release}})
			f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
				if n == 1 {
					return nil, status.Error(tc.code, "refused")
				}
				return wrapperspb.String("ok"), nil
			}
			ctx := testCtx(t)
			if _, _, err := f.echo(ctx, "k-rc", "v"); status.Code(err) != tc.code {
				t.Fatalf("first call: %v, want %v", err, tc.code)
			}
			if _, _, err := f.echo(ctx, "k-rc", "v"); status.Code(err) != tc.wantSecond {
				t.Errorf("retry: %v, want %v", err, tc.wantSecond)
			}
			if n := f.svc.executions("v"); n != tc.wantRuns {
				t.Errorf("handler ran %d times, want %d", n, tc.wantRuns)
			}
		})
	}
}

// TestInFlightRetryDelayIsTimeLeft: the RetryInfo of an in-flight answer
// is the time left on the holder's lease, by the Guard's clock.
func TestInFlightRetryDelayIsTimeLeft(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	f := newFixture(t, fixtureOpts{guard: &idempotency.Options{
		Lease: 10 * time.Second, RenewEvery: -1, Now: func() time.Time { return time.Unix(0, now.Load()) },
	}})
	entered, finish := make(chan struct{}), make(chan struct{})
	f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
		close(entered)
		<-finish
		return wrapperspb.String("done"), nil
	}
	ctx := testCtx(t)
	firstErr := make(chan error, 1)
	go func() {
		_, _, err := f.echo(ctx, "k-left", "v")
		firstErr <- err
	}()
	<-entered
	now.Add(int64(4 * time.Second))
	_, _, err := f.echo(ctx, "k-left", "v")
	close(finish)
	st := status.Convert(err)
	var delay time.Duration
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			delay = ri.GetRetryDelay().AsDuration()
		}
	}
	if st.Code() != codes.Aborted || delay != 6*time.Second {
		t.Errorf("duplicate 4s into a 10s lease: %v, RetryInfo %v; want Aborted with the 6s left", err, delay)
	}
	if err := <-firstErr; err != nil {
		t.Fatal(err)
	}
}

// TestStoredErrorAfterClientGone: with StoreErrors, a handler that answers
// an error not in ReleaseCodes after its client went away has it stored
// and replayed to the retry, like a response.
func TestStoredErrorAfterClientGone(t *testing.T) {
	outer, firstDone := firstCallDone()
	f := newFixture(t, fixtureOpts{server: &idemgrpc.Options{StoreErrors: true}, outer: outer})
	entered := make(chan struct{})
	f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
		if n == 1 {
			close(entered)
			<-ctx.Done()
		}
		return nil, status.Error(codes.FailedPrecondition, "insufficient funds")
	}
	ctx, cancel := context.WithCancel(testCtx(t))
	firstErr := make(chan error, 1)
	go func() {
		_, _, err := f.echo(ctx, "k-gone-err", "v")
		firstErr <- err
	}()
	<-entered
	cancel()
	if err := <-firstErr; status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled call: %v, want Canceled", err)
	}
	<-firstDone
	_, h, err := f.echo(testCtx(t), "k-gone-err", "v")
	if st := status.Convert(err); st.Code() != codes.FailedPrecondition || st.Message() != "insufficient funds" || len(h.Get(idemgrpc.ReplayedKey)) != 1 {
		t.Errorf("retry: %v, replayed %v; want the stored FailedPrecondition", err, h.Get(idemgrpc.ReplayedKey))
	}
	if n := f.svc.executions("v"); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

// TestSendCompressorFailsWhenGuarded: the package documentation says that
// grpc.SetSendCompressor, which needs gRPC's own stream, fails in a
// guarded handler; it works in an unguarded one.
func TestSendCompressorFailsWhenGuarded(t *testing.T) {
	f := newFixture(t, fixtureOpts{server: &idemgrpc.Options{Methods: func(string) bool { return true }}})
	f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
		if err := grpc.SetSendCompressor(ctx, "gzip"); err != nil {
			return nil, status.Error(codes.FailedPrecondition, err.Error())
		}
		return wrapperspb.String("ok"), nil
	}
	ctx := testCtx(t)
	if _, _, err := f.echo(ctx, "", "v"); err != nil {
		t.Fatalf("unguarded call: %v, want SetSendCompressor to work", err)
	}
	if _, _, err := f.echo(ctx, "k-compress", "v"); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("guarded call: %v, want SetSendCompressor to fail", err)
	}
}
