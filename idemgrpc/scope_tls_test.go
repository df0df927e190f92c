package idemgrpc_test

import (
	"context"
	"crypto/tls"
	"testing"

	"github.com/archlab/idempotency/idemgrpc"
	"github.com/archlab/idempotency/internal/testenv"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// clientCreds dials with cert, trusting ca.
func clientCreds(ca *testenv.CA, cert tls.Certificate) grpc.DialOption {
	return grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: ca.Pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13,
	}))
}

// TestDefaultScopeSeparatesTLSPeers: callers told apart by their client
// certificates alone (mTLS, no authorization metadata, as between services)
// must not share a result either: with the same key and request, the second
// caller runs its own call. A certificate renewed for the same identity
// (another key, another serial) is the same caller: its retry is a replay.
func TestDefaultScopeSeparatesTLSPeers(t *testing.T) {
	ca := testenv.NewCA(t, "idemgrpc test CA")
	alice := ca.Issue(t, "alice", "127.0.0.1", "spiffe://test/alice")
	f := newFixture(t, fixtureOpts{
		serverOpts: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(&tls.Config{
			Certificates: []tls.Certificate{ca.Issue(t, "server", "127.0.0.1")},
			ClientCAs:    ca.Pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13,
		}))},
		dialOpts: []grpc.DialOption{clientCreds(ca, alice)},
	})
	f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
		p, _ := peer.FromContext(ctx)
		ti, ok := p.AuthInfo.(credentials.TLSInfo)
		if !ok || len(ti.State.PeerCertificates) == 0 {
			return nil, status.Error(codes.Unauthenticated, "no client certificate")
		}
		return wrapperspb.String("answer for " + ti.State.PeerCertificates[0].Subject.CommonName), nil
	}
	dial := func(cert tls.Certificate) *grpc.ClientConn {
		conn, err := grpc.NewClient(f.addr, clientCreds(ca, cert))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return conn
	}
	call := func(conn *grpc.ClientConn) (string, bool) {
		t.Helper()
		ctx := metadata.AppendToOutgoingContext(testCtx(t), idemgrpc.MetadataKey, "k-mtls")
		var header metadata.MD
		out := new(wrapperspb.StringValue)
		if err := conn.Invoke(ctx, echoMethod, wrapperspb.String("v"), out, grpc.Header(&header)); err != nil {
			t.Fatalf("call: %v", err)
		}
		return out.GetValue(), len(header.Get(idemgrpc.ReplayedKey)) == 1
	}
	if got, _ := call(f.conn); got != "answer for alice" {
		t.Fatalf("alice: %q", got)
	}
	if got, replayed := call(dial(ca.Issue(t, "bob", "127.0.0.1", "spiffe://test/bob"))); got != "answer for bob" || replayed {
		t.Errorf("bob got %q (replayed %v), want his own execution", got, replayed)
	}
	if got, replayed := call(dial(ca.Issue(t, "alice", "127.0.0.1", "spiffe://test/alice"))); got != "answer for alice" || !replayed {
		t.Errorf("alice with a renewed certificate got %q (replayed %v), want her stored answer", got, replayed)
	}
	if n := f.svc.executions("v"); n != 2 {
		t.Errorf("handler ran %d times, want 2 (once per caller)", n)
	}
}
