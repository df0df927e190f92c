// Package certid names the holder of a TLS client certificate for the
// adapters' default scopes (idemhttp, idemgrpc), so that callers told apart
// only by mTLS never share a stored result.
package certid

import (
	"crypto/x509"
	"encoding/binary"
)

// Append appends to b an encoding of the identity c names: its subject and
// its alternative names (DNS, email, IP, URI), each length-prefixed so that
// no two identities encode alike. Keys, serial numbers and validity are
// left out, so a certificate renewed for the same identity gives the same
// bytes. The caller hashes them: they hold names a store should not keep.
func Append(b []byte, c *x509.Certificate) []byte {
	b = field(b, "subject:", c.RawSubject)
	for _, n := range c.DNSNames {
		b = field(b, "dns:", []byte(n))
	}
	for _, n := range c.EmailAddresses {
		b = field(b, "email:", []byte(n))
	}
	for _, ip := range c.IPAddresses {
		b = field(b, "ip:", []byte(ip.String()))
	}
	for _, u := range c.URIs {
		b = field(b, "uri:", []byte(u.String()))
	}
	return b
}

func field(b []byte, kind string, v []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(kind)+len(v)))
	b = append(b, kind...)
	return append(b, v...)
}
