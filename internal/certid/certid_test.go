package certid

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"math/big"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/archlab/idempotency/internal/testenv"
)

// identity is what a test certificate names.
type identity struct {
	cn    string
	dns   []string
	uris  []string
	upn   string // an otherName (Microsoft UPN), which crypto/x509 does not parse
	other bool   // the certificate is the identity's renewal: new key, serial and validity
}

// cert makes and parses a self-signed certificate for id, as a TLS peer's
// certificate arrives.
func cert(t *testing.T, id identity) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		Subject:      pkix.Name{CommonName: id.cn},
		SerialNumber: big.NewInt(1),
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		DNSNames:     id.dns,
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	if id.other {
		tmpl.SerialNumber = big.NewInt(99)
		tmpl.NotAfter = time.Now().Add(48 * time.Hour)
	}
	for _, s := range id.uris {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	if id.upn != "" {
		// Given its own subjectAltName, CreateCertificate writes no other.
		tmpl.ExtraExtensions = []pkix.Extension{{Id: oidSubjectAltName, Value: upnSAN(t, id.upn)}}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// upnSAN is a subjectAltName holding one otherName, a Microsoft UPN.
func upnSAN(t *testing.T, upn string) []byte {
	t.Helper()
	must := func(b []byte, err error) []byte {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	value := must(asn1.MarshalWithParams(upn, "utf8"))
	explicit := must(asn1.Marshal(asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 0, IsCompound: true, Bytes: value}))
	typeID := must(asn1.Marshal(asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 311, 20, 2, 3}))
	otherName := must(asn1.Marshal(asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 0, IsCompound: true, Bytes: append(typeID, explicit...)}))
	return must(asn1.Marshal(asn1.RawValue{Class: asn1.ClassUniversal, Tag: asn1.TagSequence, IsCompound: true, Bytes: otherName}))
}

func TestAppendTellsIdentitiesApart(t *testing.T) {
	alice := identity{cn: "alice", dns: []string{"a.example"}, uris: []string{"spiffe://test/alice"}}
	base := Append(nil, cert(t, alice))
	for name, id := range map[string]identity{
		"another subject":    {cn: "bob", dns: []string{"a.example"}, uris: []string{"spiffe://test/alice"}},
		"another DNS name":   {cn: "alice", dns: []string{"b.example"}, uris: []string{"spiffe://test/alice"}},
		"another URI":        {cn: "alice", dns: []string{"a.example"}, uris: []string{"spiffe://test/bob"}},
		"no DNS name":        {cn: "alice", uris: []string{"spiffe://test/alice"}},
		"names moved across": {cn: "alice", dns: []string{"a.examplespiffe://test/alice"}},
	} {
		if bytes.Equal(Append(nil, cert(t, id)), base) {
			t.Errorf("%s encodes like the base identity", name)
		}
	}
	renewed := alice
	renewed.other = true
	if !bytes.Equal(Append(nil, cert(t, renewed)), base) {
		t.Error("a renewed certificate for the same identity encodes differently")
	}
	if got := Append([]byte("x"), cert(t, renewed)); !bytes.Equal(got[1:], base) || got[0] != 'x' {
		t.Error("Append does not append")
	}
}

// Callers named only by an otherName (a UPN, as Windows client
// certificates carry, under one shared subject) are told apart, although
// crypto/x509 parses no otherName: the encoding takes the alternative names
// as the certificate holds them.
func TestAppendTellsOtherNamesApart(t *testing.T) {
	alice := cert(t, identity{cn: "Users", upn: "alice@corp.example"})
	bob := cert(t, identity{cn: "Users", upn: "bob@corp.example"})
	if bytes.Equal(Append(nil, alice), Append(nil, bob)) {
		t.Error("two certificates that differ in their UPN encode alike")
	}
	again := cert(t, identity{cn: "Users", upn: "alice@corp.example", other: true})
	if !bytes.Equal(Append(nil, alice), Append(nil, again)) {
		t.Error("a renewed certificate with the same UPN encodes differently")
	}
}

// Two CAs that a server trusts may issue certificates naming the same
// subject and alternative names; their holders are different callers, and
// must not share a scope (one's stored response would replay to the
// other). The issuer is taken by its name: a CA that renews its own key
// and certificate under the same name keeps its holders' identities.
func TestAppendTellsIssuersApart(t *testing.T) {
	issue := func(ca *testenv.CA) *x509.Certificate {
		t.Helper()
		c, err := x509.ParseCertificate(ca.Issue(t, "alice", "alice.example", "spiffe://test/alice").Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	one, two := testenv.NewCA(t, "CA one"), testenv.NewCA(t, "CA two")
	base := Append(nil, issue(one))
	if bytes.Equal(Append(nil, issue(two)), base) {
		t.Error("the same names issued by two CAs encode alike")
	}
	if !bytes.Equal(Append(nil, issue(one)), base) {
		t.Error("a certificate renewed by the same CA encodes differently")
	}
	if !bytes.Equal(Append(nil, issue(testenv.NewCA(t, "CA one"))), base) {
		t.Error("a certificate from the same CA under a new key of its own encodes differently")
	}
}
