package idemgrpc_test

import (
	"context"
	"strings"
	"testing"

	"github.com/archlab/idempotency/idemgrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestBadKeyNamesItsSource: a malformed key is InvalidArgument, and the
// message names where the key came from, the metadata field or the
// request, so that the client knows what to fix.
func TestBadKeyNamesItsSource(t *testing.T) {
	f := newFixture(t, fixtureOpts{server: &idemgrpc.Options{KeyFunc: func(_ context.Context, req any) string {
		if s, ok := req.(*structpb.Struct); ok {
			return s.GetFields()["request_id"].GetStringValue()
		}
		return ""
	}}})
	for _, tc := range []struct {
		name      string
		mdKey     string // sent as idempotency-key metadata
		requestID string
		want      string // in the message
	}{
		{"metadata/space", "a b", "", idemgrpc.MetadataKey + " holds a character"},
		{"metadata/long", strings.Repeat("k", idemgrpc.MaxKeyLen+1), "", idemgrpc.MetadataKey + " longer than"},
		{"request/space", "", "a b", "request's idempotency key holds a character"},
		{"request/long", "", strings.Repeat("k", idemgrpc.MaxKeyLen+1), "request's idempotency key longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			if tc.mdKey != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, tc.mdKey)
			}
			in, _ := structpb.NewStruct(map[string]any{"request_id": tc.requestID})
			err := f.conn.Invoke(ctx, putMethod, in, new(structpb.Struct))
			st := status.Convert(err)
			if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tc.want) {
				t.Errorf("got %v, want InvalidArgument saying %q", err, tc.want)
			}
		})
	}
	if n := f.svc.executions("put"); n != 0 {
		t.Errorf("handler ran %d times with malformed keys", n)
	}
}
