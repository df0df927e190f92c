package idemgrpc_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/archlab/idempotency/idemgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// testCA issues certificates for mTLS tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
	next int64
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "idemgrpc test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool, next: 2}
}

// issue returns a certificate with a fresh key for cn (and spiffe, a URI
// SAN, if not empty), usable by a server on 127.0.0.1 and by a client.
func (ca *testCA) issue(t *testing.T, cn, spiffe string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.next), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	ca.next++
	if spiffe != "" {
		u, err := url.Parse(spiffe)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = []*url.URL{u}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func (ca *testCA) clientCreds(cert tls.Certificate) grpc.DialOption {
	return grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: ca.pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13,
	}))
}

// TestDefaultScopeSeparatesTLSPeers: callers told apart by their client
// certificates alone (mTLS, no authorization metadata, as between services)
// must not share a result either: with the same key and request, the second
// caller runs its own call. A certificate renewed for the same identity
// (another key, another serial) is the same caller: its retry is a replay.
func TestDefaultScopeSeparatesTLSPeers(t *testing.T) {
	ca := newTestCA(t)
	alice := ca.issue(t, "alice", "spiffe://test/alice")
	f := newFixture(t, fixtureOpts{
		serverOpts: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(&tls.Config{
			Certificates: []tls.Certificate{ca.issue(t, "server", "")},
			ClientCAs:    ca.pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13,
		}))},
		dialOpts: []grpc.DialOption{ca.clientCreds(alice)},
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
		conn, err := grpc.NewClient(f.addr, ca.clientCreds(cert))
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
	if got, replayed := call(dial(ca.issue(t, "bob", "spiffe://test/bob"))); got != "answer for bob" || replayed {
		t.Errorf("bob got %q (replayed %v), want his own execution", got, replayed)
	}
	if got, replayed := call(dial(ca.issue(t, "alice", "spiffe://test/alice"))); got != "answer for alice" || !replayed {
		t.Errorf("alice with a renewed certificate got %q (replayed %v), want her stored answer", got, replayed)
	}
	if n := f.svc.executions("v"); n != 2 {
		t.Errorf("handler ran %d times, want 2 (once per caller)", n)
	}
}
