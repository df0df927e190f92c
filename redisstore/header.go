package redisstore

import (
	"encoding/binary"
	"errors"
	"slices"
)

// The header is stored as a version byte (1) followed by, for each name
// in sorted order: uvarint length and name, uvarint count of values plus
// one (0 for a nil slice), and each value as uvarint length and bytes.
// Unlike JSON it keeps any bytes, valid UTF-8 or not. A nil header is not
// stored at all.
const headerVersion = 1

func encodeHeader(h map[string][]string) []byte {
	if h == nil {
		return nil
	}
	names := make([]string, 0, len(h))
	size := 1
	for k, vs := range h {
		names = append(names, k)
		size += len(k) + 2*binary.MaxVarintLen64
		for _, v := range vs {
			size += len(v) + binary.MaxVarintLen64
		}
	}
	slices.Sort(names)
	b := make([]byte, 1, size)
	b[0] = headerVersion
	for _, k := range names {
		vs := h[k]
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
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

var errBadHeader = errors.New("bad header encoding")

func decodeHeader(b []byte) (map[string][]string, error) {
	if len(b) == 0 || b[0] != headerVersion {
		return nil, errBadHeader
	}
	b = b[1:]
	str := func() (string, bool) {
		n, w := binary.Uvarint(b)
		if w <= 0 || n > uint64(len(b)-w) {
			return "", false
		}
		s := string(b[w : w+int(n)])
		b = b[w+int(n):]
		return s, true
	}
	h := map[string][]string{}
	for len(b) > 0 {
		k, ok := str()
		if !ok {
			return nil, errBadHeader
		}
		if _, dup := h[k]; dup {
			return nil, errBadHeader
		}
		n, w := binary.Uvarint(b)
		// Every value takes at least one byte, which bounds n.
		if w <= 0 || n > uint64(len(b)-w)+1 {
			return nil, errBadHeader
		}
		b = b[w:]
		if n == 0 {
			h[k] = nil
			continue
		}
		vs := make([]string, n-1)
		for i := range vs {
			if vs[i], ok = str(); !ok {
				return nil, errBadHeader
			}
		}
		h[k] = vs
	}
	return h, nil
}
