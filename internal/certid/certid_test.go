package certid

import (
	"bytes"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/url"
	"testing"
	"time"
)

func cert(t *testing.T, cn string, dns []string, uris ...string) *x509.Certificate {
	t.Helper()
	c := &x509.Certificate{
		Subject:      pkix.Name{CommonName: cn},
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		DNSNames:     dns,
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	for _, s := range uris {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		c.URIs = append(c.URIs, u)
	}
	// RawSubject is what a parsed certificate carries; its content is
	// opaque to Append.
	c.RawSubject = []byte("CN=" + cn)
	return c
}

func TestAppendTellsIdentitiesApart(t *testing.T) {
	base := Append(nil, cert(t, "alice", []string{"a.example"}, "spiffe://test/alice"))
	for name, c := range map[string]*x509.Certificate{
		"another subject":    cert(t, "bob", []string{"a.example"}, "spiffe://test/alice"),
		"another DNS name":   cert(t, "alice", []string{"b.example"}, "spiffe://test/alice"),
		"another URI":        cert(t, "alice", []string{"a.example"}, "spiffe://test/bob"),
		"no DNS name":        cert(t, "alice", nil, "spiffe://test/alice"),
		"names moved across": cert(t, "alice", []string{"a.examplespiffe://test/alice"}),
	} {
		if bytes.Equal(Append(nil, c), base) {
			t.Errorf("%s encodes like the base identity", name)
		}
	}
	renewed := cert(t, "alice", []string{"a.example"}, "spiffe://test/alice")
	renewed.SerialNumber = big.NewInt(99)
	renewed.NotAfter = time.Now().Add(time.Hour)
	if !bytes.Equal(Append(nil, renewed), base) {
		t.Error("a renewed certificate for the same identity encodes differently")
	}
	if got := Append([]byte("x"), renewed); !bytes.Equal(got[1:], base) || got[0] != 'x' {
		t.Error("Append does not append")
	}
}
