// Package wire holds what the stores share about their records: the
// header encoding of the engines that store records as bytes (pgstore,
// redisstore) and the saturated time arithmetic of those that keep times as
// Unix nanoseconds (the MemoryStore, boltstore).
package wire

import (
	"encoding/binary"
	"errors"
	"slices"
)

// Response headers are stored in a small binary encoding rather than JSON:
// JSON replaces invalid UTF-8, jsonb cannot hold U+0000, and a replay must
// return the header bytes that were stored. The encoding is a version byte
// (1), then uvarint counts and lengths: the number of fields; per field, in
// key order (so equal maps encode equally), the key, the number of values
// plus one (0 for a nil slice), and each value. A nil map encodes as nil.

const headerV1 = 1

// EncodeHeader encodes h; nil encodes as nil.
func EncodeHeader(h map[string][]string) []byte {
	if h == nil {
		return nil
	}
	keys := make([]string, 0, len(h))
	size := 1 + binary.MaxVarintLen64
	for k, vs := range h {
		keys = append(keys, k)
		size += 2*binary.MaxVarintLen64 + len(k)
		for _, v := range vs {
			size += binary.MaxVarintLen64 + len(v)
		}
	}
	slices.Sort(keys)
	b := make([]byte, 0, size)
	b = append(b, headerV1)
	b = binary.AppendUvarint(b, uint64(len(keys)))
	for _, k := range keys {
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
		vs := h[k]
		if vs == nil {
			b = binary.AppendUvarint(b, 0)
			continue
		}
		b = binary.AppendUvarint(b, uint64(len(vs))+1)
		for _, v := range vs {
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	return b
}

// ErrBadHeader is returned by DecodeHeader for bytes that EncodeHeader did
// not make (a stored record was damaged or written by something else).
var ErrBadHeader = errors.New("malformed stored response header")

// DecodeHeader decodes what EncodeHeader made; nil decodes as a nil map.
func DecodeHeader(b []byte) (map[string][]string, error) {
	if b == nil {
		return nil, nil
	}
	if len(b) == 0 || b[0] != headerV1 {
		return nil, ErrBadHeader
	}
	d := decoder{b: b[1:]}
	n := d.count()
	h := make(map[string][]string, min(n, 64))
	for range n {
		k := d.str()
		nv := d.count()
		if d.err != nil {
			break
		}
		if _, dup := h[k]; dup {
			return nil, ErrBadHeader
		}
		if nv == 0 {
			h[k] = nil
			continue
		}
		vs := make([]string, 0, min(nv-1, 64))
		for range nv - 1 {
			vs = append(vs, d.str())
		}
		h[k] = vs
	}
	if d.err != nil || len(d.b) != 0 {
		return nil, ErrBadHeader
	}
	return h, nil
}

type decoder struct {
	b   []byte
	err error
}

// count reads a uvarint that counts items still to come: each takes at
// least one byte, so a larger count is malformed (and bounds allocation).
func (d *decoder) count() int {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 || v > uint64(len(d.b)) {
		d.err = ErrBadHeader
		return 0
	}
	d.b = d.b[n:]
	return int(v)
}

func (d *decoder) str() string {
	if d.err != nil {
		return ""
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 || v > uint64(len(d.b)-n) {
		d.err = ErrBadHeader
		return ""
	}
	s := string(d.b[n : n+int(v)])
	d.b = d.b[n+int(v):]
	return s
}
