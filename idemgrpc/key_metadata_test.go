package idemgrpc_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/archlab/idempotency/idemgrpc"
)

// TestKeyMetadataEdges: what the server makes of the idempotency-key
// field as a client can really send it. A malformed key is refused with
// InvalidArgument even when keys are optional (running the call unguarded
// would drop the idempotency the client asked for), and never reaches the
// handler; the binary field idempotency-key-bin is another field, not the
// key.
func TestKeyMetadataEdges(t *testing.T) {
	for _, tc := range []struct {
		name     string
		md       []string // pairs sent as outgoing metadata
		want     codes.Code
		wantRuns int // executions of two identical calls
	}{
		{"max-length", []string{idemgrpc.MetadataKey, strings.Repeat("k", idemgrpc.MaxKeyLen)}, codes.OK, 1},
		{"too-long", []string{idemgrpc.MetadataKey, strings.Repeat("k", idemgrpc.MaxKeyLen+1)}, codes.InvalidArgument, 0},
		{"empty", []string{idemgrpc.MetadataKey, ""}, codes.InvalidArgument, 0},
		{"two-values", []string{idemgrpc.MetadataKey, "k-1", idemgrpc.MetadataKey, "k-2"}, codes.InvalidArgument, 0},
		{"two-equal-values", []string{idemgrpc.MetadataKey, "k-1", idemgrpc.MetadataKey, "k-1"}, codes.InvalidArgument, 0},
		{"upper-case-field-name", []string{"Idempotency-Key", "k-upper"}, codes.OK, 1},
		{"space", []string{idemgrpc.MetadataKey, " k-1"}, codes.InvalidArgument, 0},
		// Sent as binary, the value is not the key: the call runs unguarded.
		{"binary-field", []string{idemgrpc.MetadataKey + "-bin", "k-bin"}, codes.OK, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{})
			f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
				return wrapperspb.String("ok"), nil
			}
			ctx := metadata.AppendToOutgoingContext(testCtx(t), tc.md...)
			for i := range 2 {
				_, h, err := f.echo(ctx, "", "v")
				if status.Code(err) != tc.want {
					t.Fatalf("call %d: %v, want %v", i+1, err, tc.want)
				}
				if i == 1 && tc.want == codes.OK && tc.wantRuns == 1 && len(h.Get(idemgrpc.ReplayedKey)) != 1 {
					t.Errorf("second call not replayed (header %v)", h)
				}
			}
			if n := f.svc.executions("v"); n != tc.wantRuns {
				t.Errorf("handler ran %d times, want %d", n, tc.wantRuns)
			}
		})
	}
}
