package idemhttp

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/testenv"
)

// TestDefaultScopeSeparatesTLSClients: callers told apart only by their
// client certificates (mTLS, no Authorization header) never share a stored
// response: with the same key and body, the second caller's request runs.
// The same identity with a renewed certificate is the same caller, whose
// retry is a replay.
func TestDefaultScopeSeparatesTLSClients(t *testing.T) {
	ca := testenv.NewCA(t, "idemhttp test CA")
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
		Certificates: []tls.Certificate{ca.Issue(t, "server", "127.0.0.1")},
		ClientCAs:    ca.Pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13,
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)

	post := func(cert tls.Certificate) (string, bool) {
		t.Helper()
		return postMTLS(t, srv.URL, ca.Pool, cert)
	}
	if got, _ := post(ca.Issue(t, "alice", "127.0.0.1")); got != "answer for alice" {
		t.Fatalf("alice: %q", got)
	}
	if got, replayed := post(ca.Issue(t, "bob", "127.0.0.1")); got != "answer for bob" || replayed {
		t.Errorf("bob got %q (replayed %v), want his own execution", got, replayed)
	}
	if got, replayed := post(ca.Issue(t, "alice", "127.0.0.1")); got != "answer for alice" || !replayed {
		t.Errorf("alice with a renewed certificate got %q (replayed %v), want her stored answer", got, replayed)
	}
	if runs != 2 {
		t.Errorf("handler ran %d times, want 2 (once per caller)", runs)
	}
}

// TestDefaultScopeSeparatesIssuers: a server that trusts two CAs may see
// the same subject and alternative names in certificates from each; their
// holders are different callers (a partner's CA may name its own "alice"),
// so the second one's request runs instead of getting the first one's
// stored response.
func TestDefaultScopeSeparatesIssuers(t *testing.T) {
	one, two := testenv.NewCA(t, "idemhttp test CA one"), testenv.NewCA(t, "idemhttp test CA two")
	clients := x509.NewCertPool()
	clients.AddCert(one.Cert)
	clients.AddCert(two.Cert)
	g, err := idempotency.NewGuard(idempotency.NewMemoryStore(), nil)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := New(g, nil)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	srv := httptest.NewUnstartedServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "answer for "+r.TLS.PeerCertificates[0].Issuer.CommonName)
	})))
	srv.TLS = &tls.Config{
		Certificates: []tls.Certificate{one.Issue(t, "server", "127.0.0.1")},
		ClientCAs:    clients, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13,
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)

	post := func(cert tls.Certificate) (string, bool) {
		t.Helper()
		return postMTLS(t, srv.URL, one.Pool, cert)
	}
	if got, _ := post(one.Issue(t, "alice", "127.0.0.1", "spiffe://test/alice")); got != "answer for idemhttp test CA one" {
		t.Fatalf("alice of CA one: %q", got)
	}
	if got, replayed := post(two.Issue(t, "alice", "127.0.0.1", "spiffe://test/alice")); got != "answer for idemhttp test CA two" || replayed {
		t.Errorf("alice of CA two got %q (replayed %v), want her own execution", got, replayed)
	}
	if got, replayed := post(one.Issue(t, "alice", "127.0.0.1", "spiffe://test/alice")); got != "answer for idemhttp test CA one" || !replayed {
		t.Errorf("alice of CA one with a renewed certificate got %q (replayed %v), want her stored answer", got, replayed)
	}
	if n := runs.Load(); n != 2 {
		t.Errorf("handler ran %d times, want 2 (once per issuer)", n)
	}
}

// postMTLS posts {} under the key "k-mtls" to base/orders with the client
// certificate cert, trusting roots, and returns the answer's body and
// whether it was marked a replay.
func postMTLS(t *testing.T, base string, roots *x509.CertPool, cert tls.Certificate) (string, bool) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13,
	}}}
	defer c.CloseIdleConnections()
	req, _ := http.NewRequest(http.MethodPost, base+"/orders", strings.NewReader("{}"))
	req.Header.Set("Idempotency-Key", `"k-mtls"`)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), resp.Header.Get(ReplayedHeader) == "true"
}
