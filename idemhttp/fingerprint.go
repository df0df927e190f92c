package idemhttp

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// fingerprintVersion starts every fingerprint's input, so that a change of
// the canonical form below can never make an old record match a new request.
const fingerprintVersion = "idemhttp/fp/v3"

// queryPair is one name=value of the query, decoded. raw marks a pair that
// net/http's URL.Query drops, with a part that does not decode (a stray %)
// or a semicolon: it is kept as sent and told apart from a pair that
// decodes to the same text (a=%25zz, a=1%3Bb=2), which URL.Query keeps.
type queryPair struct {
	name, value string
	raw         bool
}

// appendField appends s with its length in front: the fields of the
// canonical form cannot run into each other, whatever bytes they hold.
func appendField(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// canonicalQuery appends the pairs of raw to pairs, decoded and sorted by
// name. The relative order of the values of one name is kept, since it may
// carry meaning (a=1&a=2 is not a=2&a=1). Empty pairs (a&&b) are dropped,
// and "a" is "a=". A pair that URL.Query drops, because a part does not
// decode or because it holds a semicolon, is kept as sent and flagged.
func canonicalQuery(pairs []queryPair, raw string) []queryPair {
	for raw != "" {
		var part string
		part, raw, _ = strings.Cut(raw, "&")
		if part == "" {
			continue
		}
		name, value, _ := strings.Cut(part, "=")
		if strings.IndexByte(part, ';') >= 0 {
			// a=1;b=2 decodes like a=1%3Bb=2, which URL.Query keeps.
			pairs = append(pairs, queryPair{name: name, value: value, raw: true})
			continue
		}
		n, nok := unescapeQuery(name)
		v, vok := unescapeQuery(value)
		pairs = append(pairs, queryPair{name: n, value: v, raw: !nok || !vok})
	}
	slices.SortStableFunc(pairs, func(a, b queryPair) int { return strings.Compare(a.name, b.name) })
	return pairs
}

// unescapeQuery decodes s; ok is false, and s is returned as sent, when it
// does not decode.
func unescapeQuery(s string) (_ string, ok bool) {
	if strings.IndexByte(s, '%') < 0 && strings.IndexByte(s, '+') < 0 {
		return s, true
	}
	if u, err := url.QueryUnescape(s); err == nil {
		return u, true
	}
	return s, false
}

// fingerprinter computes request fingerprints with reusable buffers. It is
// not safe for concurrent use; the middleware keeps one per request state.
type fingerprinter struct {
	h     hash.Hash
	head  []byte
	pairs []queryPair
	sum   [sha256.Size]byte
}

// appendHead appends the canonical form of everything but the body: method,
// escaped path (URL.EscapedPath: as sent, so /a%2Fb is not /a/b, and never
// the decoded path, which /a%252Fb would share with it), canonical query and
// the selected header fields (names canonicalized, values in order).
func (f *fingerprinter) appendHead(b []byte, method, path, rawQuery string, header http.Header, names []string) []byte {
	b = append(b, fingerprintVersion...)
	b = appendField(b, method)
	b = appendField(b, path)
	f.pairs = canonicalQuery(f.pairs[:0], rawQuery)
	b = binary.AppendUvarint(b, uint64(len(f.pairs)))
	for _, p := range f.pairs {
		if p.raw {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
		b = appendField(b, p.name)
		b = appendField(b, p.value)
	}
	clear(f.pairs) // do not keep the request's strings alive in the pool
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, name := range names {
		vs := header[name]
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = appendField(b, v)
		}
	}
	return b
}

// appendFingerprint appends the hex SHA-256 of the canonical form of the
// request and its body to b. names must be canonical header names.
func (f *fingerprinter) appendFingerprint(b []byte, r *http.Request, names []string, body []byte) []byte {
	f.head = f.appendHead(f.head[:0], r.Method, r.URL.EscapedPath(), r.URL.RawQuery, r.Header, names)
	f.head = binary.AppendUvarint(f.head, uint64(len(body)))
	f.h.Reset()
	f.h.Write(f.head)
	f.h.Write(body)
	return hex.AppendEncode(b, f.h.Sum(f.sum[:0]))
}

// fingerprint is appendFingerprint as a string.
func (f *fingerprinter) fingerprint(r *http.Request, names []string, body []byte) string {
	return string(f.appendFingerprint(nil, r, names, body))
}
