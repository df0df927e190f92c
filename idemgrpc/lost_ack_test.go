package idemgrpc_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/faultstore"
	"github.com/archlab/idempotency/idemgrpc"
)

// TestLostAcknowledgement: a store write that was applied but whose reply
// was lost (faultstore.LostAck) must never lead to a second execution. A
// lost Begin: the call is answered Unavailable without running the handler,
// and the retry finds the claim the lost write made (Aborted until its lease
// ends). A lost Complete: the handler's answer is sent, and the retry
// replays what was stored after all.
func TestLostAcknowledgement(t *testing.T) {
	for _, tc := range []struct {
		op        faultstore.Op
		wantFirst codes.Code
		wantRetry codes.Code
		wantRuns  int
	}{
		{faultstore.OpBegin, codes.Unavailable, codes.Aborted, 0},
		{faultstore.OpComplete, codes.OK, codes.OK, 1},
	} {
		t.Run(string(tc.op), func(t *testing.T) {
			fs := faultstore.New(idempotency.NewMemoryStore(), faultstore.Times(1, faultstore.OnOps(faultstore.LostAck(nil), tc.op)))
			f := newFixture(t, fixtureOpts{store: fs, guard: &idempotency.Options{Lease: time.Minute}})
			f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
				return wrapperspb.String("charged"), nil
			}
			out, _, err := f.echo(testCtx(t), "k-lostack", "v")
			if status.Code(err) != tc.wantFirst || (err == nil && out.GetValue() != "charged") {
				t.Fatalf("first call: %v, %v; want %v", out, err, tc.wantFirst)
			}
			out, h, err := f.echo(testCtx(t), "k-lostack", "v")
			if status.Code(err) != tc.wantRetry {
				t.Fatalf("retry: %v, want %v", err, tc.wantRetry)
			}
			if err == nil && (out.GetValue() != "charged" || len(h.Get(idemgrpc.ReplayedKey)) != 1) {
				t.Errorf("retry: %q, replayed %v; want the stored answer", out.GetValue(), h.Get(idemgrpc.ReplayedKey))
			}
			if n := f.svc.executions("v"); n != tc.wantRuns {
				t.Errorf("handler ran %d times, want %d", n, tc.wantRuns)
			}
		})
	}
}
