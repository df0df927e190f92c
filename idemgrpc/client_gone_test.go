package idemgrpc_test

import (
	"context"
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

// charge is the tail of a handler that has done its side effect: it sets
// header and trailer metadata, checking the errors as handlers are told to,
// and answers "charged".
func charge(ctx context.Context) (*wrapperspb.StringValue, error) {
	if err := grpc.SetHeader(ctx, metadata.Pairs("x-receipt", "r-1")); err != nil {
		return nil, err
	}
	if err := grpc.SetTrailer(ctx, metadata.Pairs("x-fee", "3")); err != nil {
		return nil, err
	}
	return wrapperspb.String("charged"), nil
}

// wantChargedReplay retries key until it is no longer in flight and wants
// the first execution's answer, metadata included, replayed; the handler
// must have run once.
func wantChargedReplay(t *testing.T, f *fixture, key string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var header, trailer metadata.MD
		out, _, err := f.echo(testCtx(t), key, "v", grpc.Header(&header), grpc.Trailer(&trailer))
		if status.Code(err) == codes.Aborted && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatalf("retry: %v", err)
		}
		if out.GetValue() != "charged" || len(header.Get(idemgrpc.ReplayedKey)) != 1 {
			t.Errorf("retry: %q, replayed %v; want the stored answer", out.GetValue(), header.Get(idemgrpc.ReplayedKey))
		}
		if got := header.Get("x-receipt"); len(got) != 1 || got[0] != "r-1" {
			t.Errorf("replayed header x-receipt %q, want [r-1]", got)
		}
		if got := trailer.Get("x-fee"); len(got) != 1 || got[0] != "3" {
			t.Errorf("replayed trailer x-fee %q, want [3]", got)
		}
		break
	}
	if n := f.svc.executions("v"); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

// TestMetadataAfterClientGone: a handler that finishes its work after its
// client went away sets metadata on a stream gRPC has closed. That must not
// fail the handler (whose side effect is done): the metadata is kept for the
// stored answer, which the retry gets whole. The lease is short so that a
// result that was not stored shows up as a second execution.
func TestMetadataAfterClientGone(t *testing.T) {
	f := newFixture(t, fixtureOpts{guard: &idempotency.Options{Lease: 600 * time.Millisecond}})
	entered := make(chan struct{})
	release := make(chan struct{})
	f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
		if n == 1 {
			close(entered)
			<-ctx.Done() // the client went away; this handler finishes anyway
			<-release
		}
		return charge(ctx)
	}
	ctx, cancel := context.WithCancel(testCtx(t))
	firstErr := make(chan error, 1)
	go func() {
		_, _, err := f.echo(ctx, "k-gone-md", "v")
		firstErr <- err
	}()
	<-entered
	cancel()
	if err := <-firstErr; status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled call: %v, want Canceled", err)
	}
	close(release)
	wantChargedReplay(t, f, "k-gone-md")
}

// TestDetach: a handler that heeds its context stops when its client goes
// away (cancels, or its deadline passes), possibly after part of its side
// effect, and the retry after the lease runs it again. Options.Detach keeps
// the client's end from reaching the handler: it finishes, its answer is
// stored, and the retry replays it.
func TestDetach(t *testing.T) {
	for _, tc := range []struct {
		name     string
		detach   bool
		deadline bool // the client's deadline passes, instead of a cancel
		wantRuns int
	}{
		{"default/cancel", false, false, 2},
		{"detach/cancel", true, false, 1},
		{"detach/deadline", true, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// callCtx has the context gRPC gave the first call: the test
			// waits for the server to see the client go.
			callCtx := make(chan context.Context, 1)
			f := newFixture(t, fixtureOpts{
				server: &idemgrpc.Options{Detach: tc.detach},
				guard:  &idempotency.Options{Lease: 600 * time.Millisecond},
				outer: func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
					select {
					case callCtx <- ctx:
					default:
					}
					return h(ctx, req)
				},
			})
			entered := make(chan struct{})
			release := make(chan struct{})
			f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
				if n == 1 {
					close(entered)
					select {
					case <-ctx.Done():
						return nil, ctx.Err()
					case <-release:
					}
					// A handler that heeds its context checks it again
					// before its next step.
					if err := ctx.Err(); err != nil {
						return nil, err
					}
				}
				return charge(ctx)
			}
			ctx, cancel := context.WithCancel(testCtx(t))
			defer cancel()
			want := codes.Canceled
			if tc.deadline {
				// Long enough for the call to reach the handler on a loaded
				// machine: a call whose deadline passes before would never
				// run it.
				ctx, cancel = context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				want = codes.DeadlineExceeded
			}
			firstErr := make(chan error, 1)
			go func() {
				_, _, err := f.echo(ctx, "k-detach", "v")
				firstErr <- err
			}()
			select {
			case <-entered:
			case err := <-firstErr:
				t.Fatalf("first call ended before its handler ran: %v", err)
			}
			if !tc.deadline {
				cancel()
			}
			if err := <-firstErr; status.Code(err) != want {
				t.Fatalf("first call: %v, want %v", err, want)
			}
			<-(<-callCtx).Done()
			close(release)
			if tc.wantRuns == 1 {
				wantChargedReplay(t, f, "k-detach")
				return
			}
			// Without Detach the claim is kept until its lease ends, and then
			// the retry is a second execution.
			deadline := time.Now().Add(5 * time.Second)
			for {
				out, h, err := f.echo(testCtx(t), "k-detach", "v")
				if status.Code(err) == codes.Aborted && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				if err != nil || out.GetValue() != "charged" || len(h.Get(idemgrpc.ReplayedKey)) != 0 {
					t.Fatalf("retry after the lease: %v, %v, replayed %v; want a second execution", out, err, h.Get(idemgrpc.ReplayedKey))
				}
				break
			}
			if n := f.svc.executions("v"); n != tc.wantRuns {
				t.Errorf("handler ran %d times, want %d", n, tc.wantRuns)
			}
		})
	}
}
