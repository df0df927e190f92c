package idemhttp

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

// mtlsCA signs the certificates of an mTLS test: a server on 127.0.0.1 and
// its clients, each named by its CommonName and a URI.
type mtlsCA struct {
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	pool   *x509.CertPool
	serial int64
}

func newMTLSCA(t *testing.T) *mtlsCA {
	t.Helper()
	ca := &mtlsCA{pool: x509.NewCertPool(), serial: 1}
	ca.cert, ca.key = ca.sign(t, &x509.Certificate{
		Subject: pkix.Name{CommonName: "idemhttp test CA"},
		IsCA:    true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	})
	ca.pool.AddCert(ca.cert)
	return ca
}

// sign issues tmpl with a fresh key, signed by the CA (self-signed before
// the CA exists).
func (ca *mtlsCA) sign(t *testing.T, tmpl *x509.Certificate) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = big.NewInt(ca.serial)
	ca.serial++
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	parent, signer := tmpl, key
	if ca.cert != nil {
		parent, signer = ca.cert, ca.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c, key
}

func (ca *mtlsCA) issue(t *testing.T, cn string) tls.Certificate {
	t.Helper()
	c, key := ca.sign(t, &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	})
	return tls.Certificate{Certificate: [][]byte{c.Raw}, PrivateKey: key}
}

// TestDefaultScopeSeparatesTLSClients: callers told apart only by their
// client certificates (mTLS, no Authorization header) never share a stored
// response: with the same key and body, the second caller's request runs.
// The same identity with a renewed certificate is the same caller, whose
// retry is a replay.
func TestDefaultScopeSeparatesTLSClients(t *testing.T) {
	ca := newMTLSCA(t)
	g, err := idempotency.NewGuard(idempotency.NewMemoryStore(), nil)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := New(g, nil)
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	srv := httptest.NewUnstartedServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "answer for "+r.TLS.PeerCertificates[0].Subject.CommonName)
	})))
	srv.TLS = &tls.Config{
		Certificates: []tls.Certificate{ca.issue(t, "server")},
		ClientCAs:    ca.pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13,
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)

	post := func(cert tls.Certificate) (string, bool) {
		t.Helper()
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
			RootCAs: ca.pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13,
		}}}
		defer c.CloseIdleConnections()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", `"k-mtls"`)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b), resp.Header.Get(ReplayedHeader) == "true"
	}
	if got, _ := post(ca.issue(t, "alice")); got != "answer for alice" {
		t.Fatalf("alice: %q", got)
	}
	if got, replayed := post(ca.issue(t, "bob")); got != "answer for bob" || replayed {
		t.Errorf("bob got %q (replayed %v), want his own execution", got, replayed)
	}
	if got, replayed := post(ca.issue(t, "alice")); got != "answer for alice" || !replayed {
		t.Errorf("alice with a renewed certificate got %q (replayed %v), want her stored answer", got, replayed)
	}
	if runs != 2 {
		t.Errorf("handler ran %d times, want 2 (once per caller)", runs)
	}
}
