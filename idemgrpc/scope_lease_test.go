package idemgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestDefaultScopeSeparatesCredentials: without Options.Scope, two
// callers with different credentials that send the same key and request
// must not share a result. The handler is where per-caller authorization
// happens; a replay skips it, so a replay across credentials hands one
// caller's answer to another.
func TestDefaultScopeSeparatesCredentials(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
		who := metadata.ValueFromIncomingContext(ctx, "authorization")
		if len(who) != 1 {
			return nil, status.Error(codes.Unauthenticated, "no credentials")
		}
		return wrapperspb.String("answer for " + who[0]), nil
	}
	ctx := testCtx(t)
	alice := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer alice")
	mallory := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer mallory")
	if out, _, err := f.echo(alice, "k-shared", "v"); err != nil || out.GetValue() != "answer for Bearer alice" {
		t.Fatalf("alice: %v, %v", out, err)
	}
	out, h, err := f.echo(mallory, "k-shared", "v")
	if err != nil {
		t.Fatalf("mallory: %v", err)
	}
	if out.GetValue() != "answer for Bearer mallory" || len(h.Get(idemgrpc.ReplayedKey)) != 0 {
		t.Errorf("mallory got %q (replayed %v), want her own execution", out.GetValue(), h.Get(idemgrpc.ReplayedKey))
	}
	// Alice's retry is still a replay of her own answer.
	out, h, err = f.echo(alice, "k-shared", "v")
	if err != nil || out.GetValue() != "answer for Bearer alice" || len(h.Get(idemgrpc.ReplayedKey)) != 1 {
		t.Errorf("alice's retry: %v, %v, replayed %v; want her stored answer", out, err, h.Get(idemgrpc.ReplayedKey))
	}
	if n := f.svc.executions("v"); n != 2 {
		t.Errorf("handler ran %d times, want 2 (once per caller)", n)
	}
	if idemgrpc.DefaultScope(context.Background()) != "" {
		t.Error("DefaultScope of a call without credentials is not the anonymous scope")
	}
}

// TestLeaseLostIsNotCanceled: when the Guard ends the handler's
// context because the claim was lost (taken over or deleted) or could not
// be renewed, a handler that returns its context's error must not answer
// Canceled: the caller did not cancel, and Canceled is what no retry policy
// retries. The call is answered with a code that says to retry with the
// same key.
func TestLeaseLostIsNotCanceled(t *testing.T) {
	tests := []struct {
		name string
		// lose makes the claim go while the handler waits.
		lose func(f *fixture, extendDown func())
		want codes.Code
	}{
		{"deleted", func(f *fixture, _ func()) { _ = f.store.Delete(context.Background(), "k-lost") }, codes.Aborted},
		{"store-unreachable", func(_ *fixture, extendDown func()) { extendDown() }, codes.Unavailable},
	}
	for _, tc := range tests {
		for _, detach := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/detach=%v", tc.name, detach), func(t *testing.T) {
				var down chan struct{}
				down = make(chan struct{})
				f := newFixture(t, fixtureOpts{
					server: &idemgrpc.Options{Detach: detach},
					guard:  &idempotency.Options{Lease: 300 * time.Millisecond, RenewEvery: 30 * time.Millisecond},
					setupStore: func(s *idempotency.MemoryStore) {
						s.Fault = func(op string) error {
							select {
							case <-down:
								if op == "extend" {
									return errors.New("injected outage")
								}
							default:
							}
							return nil
						}
					},
				})
				entered := make(chan struct{})
				f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
					close(entered)
					<-ctx.Done()
					return nil, ctx.Err()
				}
				go func() {
					<-entered
					tc.lose(f, func() { close(down) })
				}()
				_, _, err := f.echo(testCtx(t), "k-lost", "v")
				if got := status.Code(err); got != tc.want {
					t.Errorf("lost claim: %v, want %v", err, tc.want)
				}
				if n := f.svc.executions("v"); n != 1 {
					t.Errorf("handler ran %d times, want 1", n)
				}
			})
		}
	}
}

// TestCallerCancelStaysCanceled: the other side of the test above. A
// handler stopped by its caller's cancellation still answers Canceled. The
// interceptor is called directly: over the network a cancelled caller never
// sees the server's answer.
func TestCallerCancelStaysCanceled(t *testing.T) {
	g, err := idempotency.NewGuard(idempotency.NewMemoryStore(), nil)
	if err != nil {
		t.Fatal(err)
	}
	in, err := idemgrpc.UnaryServerInterceptor(g, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(metadata.NewIncomingContext(testCtx(t), metadata.Pairs(idemgrpc.MetadataKey, "k-cancel")))
	defer cancel()
	_, err = in(ctx, wrapperspb.String("v"), &grpc.UnaryServerInfo{FullMethod: echoMethod}, func(ctx context.Context, req any) (any, error) {
		cancel()
		<-ctx.Done()
		return nil, ctx.Err()
	})
	// gRPC's server sends a raw context error as its code.
	if !errors.Is(err, context.Canceled) && status.Code(err) != codes.Canceled {
		t.Errorf("handler stopped by its caller: %v, want Canceled", err)
	}
}

// TestClientGoneMidHandler: a client that cancels while the handler
// runs does not make a second execution. A duplicate meanwhile is answered
// Aborted; a handler that finishes anyway has its response stored, under a
// context that the cancellation does not reach, and the retry replays it.
func TestClientGoneMidHandler(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	entered := make(chan struct{})
	release := make(chan struct{})
	f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
		close(entered)
		<-ctx.Done() // the client went away
		<-release
		return wrapperspb.String("charged"), nil
	}
	ctx, cancel := context.WithCancel(testCtx(t))
	firstErr := make(chan error, 1)
	go func() {
		_, _, err := f.echo(ctx, "k-gone", "v")
		firstErr <- err
	}()
	<-entered
	cancel()
	if err := <-firstErr; status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled call: %v, want Canceled", err)
	}
	if _, _, err := f.echo(testCtx(t), "k-gone", "v"); status.Code(err) != codes.Aborted {
		t.Fatalf("duplicate while the handler still runs: %v, want Aborted", err)
	}
	close(release)
	retryUntilReplayed(t, f, "k-gone")
}

// retryUntilReplayed retries key (value "v") while it answers Aborted (its
// handler still running), for at most 5 s, and wants the stored "charged"
// response replayed and the handler run once.
func retryUntilReplayed(t *testing.T, f *fixture, key string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		out, h, err := f.echo(testCtx(t), key, "v")
		if err == nil {
			if out.GetValue() != "charged" || len(h.Get(idemgrpc.ReplayedKey)) != 1 {
				t.Errorf("retry: %v, replayed %v; want the stored response", out, h.Get(idemgrpc.ReplayedKey))
			}
			break
		}
		if status.Code(err) != codes.Aborted || time.Now().After(deadline) {
			t.Fatalf("retry: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := f.svc.executions("v"); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}
