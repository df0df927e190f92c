package idemgrpc_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/archlab/idempotency/idemgrpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// BenchmarkUnary compares a unary call over loopback TCP without the guard,
// with the guard and a new key per call (claim, run, store), and with the
// guard replaying a stored response. Compare the guarded lines with
// Unguarded of the same run.
func BenchmarkUnary(b *testing.B) {
	answer := func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
		return in, nil
	}
	b.Run("Unguarded", func(b *testing.B) {
		f := newFixture(b, fixtureOpts{unguarded: true})
		f.svc.onEcho = answer
		benchCalls(b, f, func(i int) string { return "" })
	})
	b.Run("GuardedNewKey", func(b *testing.B) {
		f := newFixture(b, fixtureOpts{})
		f.svc.onEcho = answer
		benchCalls(b, f, func(i int) string { return "k" + strconv.Itoa(i) })
	})
	b.Run("GuardedReplay", func(b *testing.B) {
		f := newFixture(b, fixtureOpts{})
		f.svc.onEcho = answer
		benchCalls(b, f, func(i int) string { return "same" })
	})
}

func benchCalls(b *testing.B, f *fixture, key func(int) string) {
	ctx := context.Background()
	in := wrapperspb.String("benchmark payload")
	out := new(wrapperspb.StringValue)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		cctx := ctx
		if k := key(i); k != "" {
			cctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, k)
		}
		if err := f.conn.Invoke(cctx, echoMethod, in, out); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
