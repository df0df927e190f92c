// Package certid names the holder of a TLS client certificate for the
// adapters' default scopes (idemhttp, idemgrpc), so that callers told apart
// only by mTLS never share a stored result.
package certid

import (
	"crypto/x509"
	"encoding/asn1"
	"encoding/binary"
)

// oidSubjectAltName is the subjectAltName extension's (RFC 5280, 4.2.1.6).
var oidSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}

// Append appends to b an encoding of the identity that c, a parsed
// certificate, names: its issuer, its subject and its alternative names,
// each length-prefixed so that no two identities encode alike. The issuer
// is part of it because a name means something only to the CA that vouched
// for it: a server that trusts two CAs (its own and a partner's) may see
// the same subject and names from each, held by different callers. All
// three are taken as the certificate holds them (DER), not as crypto/x509
// parses them: the bytes stay the same whatever Go version reads them (a
// URI that a newer url.URL.String wrote otherwise would move a caller to
// another scope, and its retry would run again), and names crypto/x509
// does not parse (an otherName, such as a Windows UPN) still tell callers
// apart. Keys, serial numbers and validity are left out, so a certificate
// renewed for the same identity gives the same bytes; the issuer is taken
// by its name, not its key, so that a CA renewing its own certificate under
// the same name does not move its holders either (two CAs that share a
// name are one issuer here). The caller hashes the bytes: they hold names
// a store should not keep.
func Append(b []byte, c *x509.Certificate) []byte {
	b = field(b, "issuer:", c.RawIssuer)
	b = field(b, "subject:", c.RawSubject)
	for _, e := range c.Extensions {
		if e.Id.Equal(oidSubjectAltName) {
			b = field(b, "san:", e.Value)
		}
	}
	return b
}

func field(b []byte, kind string, v []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(kind)+len(v)))
	b = append(b, kind...)
	return append(b, v...)
}
