package idemgrpc_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemgrpc"
)

// TestStoreFailureReportSentinels: what OnStoreError hears after the
// handler ran is told by the Guard's sentinels, not by the shape of its
// error: a result not stored wraps ErrNotStored, a key not released
// ErrNotReleased, and a claim lost while a failing handler ran is reported
// as such (ErrLeaseLost), not as a failed release, since no Release was
// tried.
func TestStoreFailureReportSentinels(t *testing.T) {
	outage := errors.New("injected outage")
	for _, tc := range []struct {
		name     string
		failOp   string
		handler  func(ctx context.Context, f *fixture) (*wrapperspb.StringValue, error)
		wantCode codes.Code
		wantIn   string
		is, not  []error
	}{
		{name: "complete", failOp: "complete",
			handler: func(context.Context, *fixture) (*wrapperspb.StringValue, error) {
				return wrapperspb.String("done"), nil
			}, wantCode: codes.OK, wantIn: "could not store the result",
			is:  []error{idempotency.ErrNotStored, idempotency.ErrUnavailable, outage},
			not: []error{idempotency.ErrNotReleased, idempotency.ErrLeaseLost}},
		{name: "release", failOp: "release",
			handler: func(context.Context, *fixture) (*wrapperspb.StringValue, error) {
				return nil, status.Error(codes.Unavailable, "refused before the work")
			}, wantCode: codes.Unavailable, wantIn: "could not release the key",
			is:  []error{idempotency.ErrNotReleased, idempotency.ErrUnavailable, outage},
			not: []error{idempotency.ErrNotStored, idempotency.ErrLeaseLost}},
		{name: "lease lost while a failing handler ran",
			handler: func(ctx context.Context, f *fixture) (*wrapperspb.StringValue, error) {
				if err := f.store.Delete(ctx, "k-sentinel"); err != nil {
					return nil, err
				}
				<-ctx.Done() // a renewal is rejected
				return nil, ctx.Err()
			}, wantCode: codes.Aborted, wantIn: "taken over or deleted while the handler ran",
			is:  []error{idempotency.ErrLeaseLost},
			not: []error{idempotency.ErrNotStored, idempotency.ErrNotReleased, idempotency.ErrUnavailable}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var reported []error
			f := newFixture(t, fixtureOpts{
				server: &idemgrpc.Options{OnStoreError: func(_ context.Context, _ string, err error) {
					mu.Lock()
					defer mu.Unlock()
					reported = append(reported, err)
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
			f.svc.onEcho = func(ctx context.Context, _ *wrapperspb.StringValue, _ int) (*wrapperspb.StringValue, error) {
				return tc.handler(ctx, f)
			}
			if _, _, err := f.echo(testCtx(t), "k-sentinel", "v"); status.Code(err) != tc.wantCode {
				t.Fatalf("call: %v, want %v", err, tc.wantCode)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(reported) != 1 {
				t.Fatalf("OnStoreError called %d times (%v), want once", len(reported), reported)
			}
			rerr := reported[0]
			if !strings.Contains(rerr.Error(), tc.wantIn) {
				t.Errorf("OnStoreError got %q, want it to say %q", rerr, tc.wantIn)
			}
			for _, target := range tc.is {
				if !errors.Is(rerr, target) {
					t.Errorf("OnStoreError got %q, which does not wrap %q", rerr, target)
				}
			}
			for _, target := range tc.not {
				if errors.Is(rerr, target) {
					t.Errorf("OnStoreError got %q, which wraps %q", rerr, target)
				}
			}
		})
	}
}

// TestCallerGoneReleaseFailsSentinel: when the caller left during the
// claim and the Guard could not give the claim back, OnStoreError gets the
// part of the Guard's error that wraps ErrNotReleased, and not the
// caller's leaving.
func TestCallerGoneReleaseFailsSentinel(t *testing.T) {
	mem := idempotency.NewMemoryStore()
	outage := errors.New("injected outage")
	mem.Fault = func(op string) error {
		if op == "release" {
			return outage
		}
		return nil
	}
	ctx, cancel := context.WithCancel(metadata.NewIncomingContext(testCtx(t), metadata.Pairs(idemgrpc.MetadataKey, "k-gone")))
	defer cancel()
	g, err := idempotency.NewGuard(afterBegin{Store: mem, after: cancel}, &idempotency.Options{Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var reported []error
	in, err := idemgrpc.UnaryServerInterceptor(g, &idemgrpc.Options{OnStoreError: func(_ context.Context, _ string, err error) {
		reported = append(reported, err)
	}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = in(ctx, wrapperspb.String("v"), &grpc.UnaryServerInfo{FullMethod: echoMethod}, func(context.Context, any) (any, error) {
		t.Error("the handler ran")
		return nil, nil
	})
	if status.Code(err) != codes.Canceled {
		t.Fatalf("call: %v, want Canceled", err)
	}
	if len(reported) != 1 || !errors.Is(reported[0], idempotency.ErrNotReleased) || !errors.Is(reported[0], outage) ||
		errors.Is(reported[0], context.Canceled) || !strings.Contains(reported[0].Error(), "could not release the key") {
		t.Errorf("OnStoreError got %v, want one failed release wrapping ErrNotReleased and the store's error, not the caller's", reported)
	}
}
