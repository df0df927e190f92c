package idemgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemgrpc"
	"github.com/archlab/idempotency/internal/testenv"
	"github.com/archlab/idempotency/redisstore"
)

// TestReplayIsTheFirstAnswer: a replay is the first answer again, byte for
// byte as the client sees it, save the idempotency-replayed header field:
// the response or the status (code, message, details), every header and
// trailer field with all its values in order, binary (-bin) ones included,
// through the MemoryStore and through a store that encodes records (Redis).
// Errors of every form a handler returns are stored as gRPC sent them: a
// status, a wrapped status, a plain error (Unknown).
func TestReplayIsTheFirstAnswer(t *testing.T) {
	stores := map[string]func(t *testing.T) idempotency.Store{
		"memory": func(*testing.T) idempotency.Store { return nil },
		"redis": func(t *testing.T) idempotency.Store {
			opts, err := redis.ParseURL(testenv.RedisURL(t))
			if err != nil {
				t.Fatal(err)
			}
			opts.ContextTimeoutEnabled = true
			c := redis.NewClient(opts)
			t.Cleanup(func() { _ = c.Close() })
			s, err := redisstore.New(c, &redisstore.Options{Prefix: testenv.Unique("idemgrpc-fidelity") + ":"})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	}
	detailed, _ := status.New(codes.NotFound, "no such order: ü\x00%").WithDetails(
		&errdetails.ErrorInfo{Reason: "ORDER", Domain: "example.com", Metadata: map[string]string{"id": "7"}},
		&errdetails.LocalizedMessage{Locale: "de", Message: "keine Bestellung"})
	answers := map[string]error{
		"response":       nil,
		"status":         detailed.Err(),
		"wrapped-status": fmt.Errorf("orders: %w", detailed.Err()),
		"plain-error":    errors.New("disk on fire"),
	}
	for sname, mk := range stores {
		for aname, answer := range answers {
			t.Run(sname+"/"+aname, func(t *testing.T) {
				f := newFixture(t, fixtureOpts{store: mk(t), server: &idemgrpc.Options{StoreErrors: true}})
				f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
					if err := grpc.SetHeader(ctx, metadata.Pairs("x-multi", "1", "x-multi", "2", "x-trace-bin", "\x00\xff\x10")); err != nil {
						return nil, err
					}
					if err := grpc.SetHeader(ctx, metadata.Pairs("x-multi", "3")); err != nil {
						return nil, err
					}
					if err := grpc.SetTrailer(ctx, metadata.Pairs("x-sum-bin", "\xfe\x00", "x-fee", "3", "x-fee", "4")); err != nil {
						return nil, err
					}
					if answer != nil {
						return nil, answer
					}
					return wrapperspb.String(fmt.Sprint("run ", n)), nil
				}
				type got struct {
					out             *wrapperspb.StringValue
					st              *status.Status
					header, trailer metadata.MD
				}
				var calls [2]got
				for i := range calls {
					c := &calls[i]
					var err error
					c.out, _, err = f.echo(testCtx(t), "k-fidelity", "v", grpc.Header(&c.header), grpc.Trailer(&c.trailer))
					c.st = status.Convert(err)
				}
				first, replay := calls[0], calls[1]
				if v := replay.header.Get(idemgrpc.ReplayedKey); len(v) != 1 || v[0] != "true" {
					t.Errorf("replay's %s: %q, want [true]", idemgrpc.ReplayedKey, v)
				}
				if v := first.header.Get(idemgrpc.ReplayedKey); len(v) != 0 {
					t.Errorf("first answer's %s: %q, want none", idemgrpc.ReplayedKey, v)
				}
				delete(replay.header, idemgrpc.ReplayedKey)
				if d := cmp.Diff(first.header, replay.header); d != "" {
					t.Errorf("replayed header differs (-first +replay):\n%s", d)
				}
				if d := cmp.Diff(first.trailer, replay.trailer); d != "" {
					t.Errorf("replayed trailer differs (-first +replay):\n%s", d)
				}
				if !proto.Equal(first.st.Proto(), replay.st.Proto()) {
					t.Errorf("replayed status %v, first %v", replay.st.Proto(), first.st.Proto())
				}
				if answer != nil && first.st.Code() == codes.OK {
					t.Errorf("first call succeeded, want %v", answer)
				}
				if answer == nil && !proto.Equal(first.out, replay.out) {
					t.Errorf("replayed response %v, first %v", replay.out, first.out)
				}
				if n := f.svc.executions("v"); n != 1 {
					t.Errorf("handler ran %d times, want 1", n)
				}
			})
		}
	}
}
