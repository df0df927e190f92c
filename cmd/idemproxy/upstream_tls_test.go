package main

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestUpstreamTLSFailureNotSent: a TLS handshake that fails (a
// certificate the proxy does not trust, an upstream that does not speak
// TLS) comes before the request is written, so the proxy answers 502
// upstream-unreachable and releases the key, as for a refused dial. It
// used to answer upstream-failed ("it may have taken effect") and keep
// the claim until its lease ended, so the retries got 409.
func TestUpstreamTLSFailureNotSent(t *testing.T) {
	untrusted := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(untrusted.Close)
	plain := newUpstream(t)
	for _, tc := range []struct{ name, url string }{
		{"untrusted certificate", untrusted.URL},
		{"upstream without TLS", "https://" + plain.Listener.Addr().String()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startInproc(t, "-upstream", tc.url, "-store", "memory")
			for i := range 2 {
				r := mustPost(t, p.proxy, "/orders", "k", "x")
				if r.status != http.StatusBadGateway || !strings.Contains(r.body, "upstream-unreachable") {
					t.Fatalf("attempt %d = %d %q; want 502 upstream-unreachable (nothing was sent, key released)", i+1, r.status, r.body)
				}
			}
			if n := plain.total.Load(); n != 0 {
				t.Fatalf("the plain upstream got %d requests; want none", n)
			}
		})
	}
}

// TestNotSentTLSErrors: notSent recognises the errors of a TLS handshake
// that did not complete, as the Transport returns them.
func TestNotSentTLSErrors(t *testing.T) {
	roundTrip := func(t *testing.T, tr *http.Transport, url string) error {
		t.Helper()
		req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := tr.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
			t.Fatal("the round trip succeeded")
		}
		return err
	}

	untrusted := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(untrusted.Close)

	// A server that wants a client certificate refuses the handshake
	// with an alert the client reads after it wrote its request (TLS
	// 1.3); the server's HTTP side never saw that request.
	mtls := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("the mTLS upstream served a request without a client certificate")
	}))
	mtls.TLS = &tls.Config{ClientAuth: tls.RequireAnyClientCert}
	mtls.StartTLS()
	t.Cleanup(mtls.Close)

	// A listener that accepts and never answers the handshake.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() })
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()

	plain := newUpstream(t)
	for _, tc := range []struct {
		name string
		tr   *http.Transport
		url  string
	}{
		{"unknown authority", &http.Transport{}, untrusted.URL},
		{"not TLS", &http.Transport{}, "https://" + plain.Listener.Addr().String()},
		{"client certificate required", mtls.Client().Transport.(*http.Transport).Clone(), mtls.URL},
		{"handshake timeout", &http.Transport{TLSHandshakeTimeout: 50 * time.Millisecond}, "https://" + silent.Addr().String()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := roundTrip(t, tc.tr, tc.url)
			if !notSent(err) {
				t.Fatalf("notSent(%T %q) = false; want true (the handshake failed, nothing was sent)", err, err)
			}
		})
	}
}
