package boltstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/archlab/idempotency"
)

// A record is stored as one value, in a versioned binary encoding:
//
//	version    byte (codecV1)
//	state      byte (stateProcessing or stateDone)
//	token      uvarint
//	leaseUntil varint, Unix nanoseconds, 0 for the zero time
//	expiresAt  varint, Unix nanoseconds
//	fp         uvarint length, bytes
//	-- only when state is stateDone:
//	status     varint
//	header     uvarint field count+1 (0: nil map), then per field:
//	             name uvarint length, bytes
//	             values uvarint count+1 (0: nil slice), each uvarint length, bytes
//	body       uvarint length+1 (0: nil slice), bytes
//
// Lengths and counts are written +1 where nil and empty must stay apart, so
// that a replay is the response that was stored, down to nil-ness.
const (
	codecV1         byte = 1
	stateProcessing byte = 1
	stateDone       byte = 2
)

var errCorrupt = errors.New("boltstore: corrupt record")

// rec is a stored record, with times as Unix nanoseconds.
type rec struct {
	state      byte
	token      uint64
	leaseUntil int64
	expiresAt  int64
	fp         string
	resp       idempotency.Response
}

func (r *rec) record(withResponse bool) idempotency.Record {
	out := idempotency.Record{Fingerprint: r.fp, Token: r.token,
		LeaseUntil: unixTime(r.leaseUntil), ExpiresAt: unixTime(r.expiresAt)}
	switch r.state {
	case stateDone:
		out.State = idempotency.Done
		if withResponse {
			out.Response = r.resp // decode made it a private copy
		}
	default:
		out.State = idempotency.Processing
	}
	return out
}

func unixTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// unixNano is t as Unix nanoseconds, 0 for the zero time (whose UnixNano is
// undefined).
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// encode appends r's encoding to dst.
func encode(dst []byte, r *rec) []byte {
	dst = append(dst, codecV1, r.state)
	dst = binary.AppendUvarint(dst, r.token)
	dst = binary.AppendVarint(dst, r.leaseUntil)
	dst = binary.AppendVarint(dst, r.expiresAt)
	dst = appendString(dst, r.fp)
	if r.state != stateDone {
		return dst
	}
	dst = binary.AppendVarint(dst, int64(r.resp.Status))
	if r.resp.Header == nil {
		dst = append(dst, 0)
	} else {
		dst = binary.AppendUvarint(dst, uint64(len(r.resp.Header))+1)
		for name, vals := range r.resp.Header {
			dst = appendString(dst, name)
			if vals == nil {
				dst = append(dst, 0)
				continue
			}
			dst = binary.AppendUvarint(dst, uint64(len(vals))+1)
			for _, v := range vals {
				dst = appendString(dst, v)
			}
		}
	}
	if r.resp.Body == nil {
		return append(dst, 0)
	}
	dst = binary.AppendUvarint(dst, uint64(len(r.resp.Body))+1)
	return append(dst, r.resp.Body...)
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// decode parses an encoded record. The result shares no memory with b, which
// may point into bbolt's read-only mmap. It never panics on any input and
// allocates no more than a small multiple of len(b).
func decode(b []byte) (rec, error) {
	d := decoder{b: b}
	var r rec
	if v := d.byte(); v != codecV1 {
		if d.err != nil {
			return rec{}, d.err
		}
		return rec{}, fmt.Errorf("%w: unknown version %d", errCorrupt, v)
	}
	r.state = d.byte()
	r.token = d.uvarint()
	r.leaseUntil = d.varint()
	r.expiresAt = d.varint()
	r.fp = d.string()
	if d.err != nil {
		return rec{}, d.err
	}
	switch r.state {
	case stateProcessing:
	case stateDone:
		status := d.varint()
		if int64(int(status)) != status {
			return rec{}, fmt.Errorf("%w: status %d out of range", errCorrupt, status)
		}
		r.resp.Status = int(status)
		if n := d.count(); n > 0 {
			// Every field takes at least two bytes, which bounds the map
			// hint by the input's length.
			r.resp.Header = make(map[string][]string, min(n-1, d.left()/2))
			for range n - 1 {
				name := d.string()
				var vals []string
				if m := d.count(); m > 0 {
					vals = make([]string, 0, min(m-1, d.left()))
					for range m - 1 {
						vals = append(vals, d.string())
					}
				}
				if d.err != nil {
					return rec{}, d.err
				}
				if _, dup := r.resp.Header[name]; dup {
					return rec{}, fmt.Errorf("%w: header %q twice", errCorrupt, name)
				}
				r.resp.Header[name] = vals
			}
		}
		if n := d.count(); n > 0 {
			r.resp.Body = append([]byte{}, d.bytes(n-1)...)
		}
	default:
		return rec{}, fmt.Errorf("%w: unknown state %d", errCorrupt, r.state)
	}
	if d.err != nil {
		return rec{}, d.err
	}
	if len(d.b) != 0 {
		return rec{}, fmt.Errorf("%w: %d trailing bytes", errCorrupt, len(d.b))
	}
	return r, nil
}

// expiryOf reads only the expiry of an encoded record: the sweep and Delete
// need no more, and decode would copy the record's body and header.
func expiryOf(b []byte) (int64, error) {
	d := decoder{b: b}
	if v := d.byte(); v != codecV1 && d.err == nil {
		return 0, fmt.Errorf("%w: unknown version %d", errCorrupt, v)
	}
	if st := d.byte(); st != stateProcessing && st != stateDone && d.err == nil {
		return 0, fmt.Errorf("%w: unknown state %d", errCorrupt, st)
	}
	d.uvarint() // token
	d.varint()  // leaseUntil
	at := d.varint()
	return at, d.err
}

// decoder reads from b; the first error sticks and zero values follow it.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: bad %s", errCorrupt, what)
	}
	d.b = nil
}

func (d *decoder) left() int { return len(d.b) }

func (d *decoder) byte() byte {
	if len(d.b) == 0 {
		d.fail("length")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("uvarint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a length that must fit in what is left of the input (each
// counted item takes at least one byte), so no allocation can be larger
// than the input.
func (d *decoder) count() int {
	v := d.uvarint()
	if d.err != nil {
		return 0
	}
	if v > uint64(len(d.b))+1 {
		d.fail("count")
		return 0
	}
	return int(v)
}

func (d *decoder) bytes(n int) []byte {
	if n < 0 || n > len(d.b) {
		d.fail("length")
		return nil
	}
	out := d.b[:n]
	d.b = d.b[n:]
	return out
}

func (d *decoder) string() string {
	v := d.uvarint()
	if d.err != nil {
		return ""
	}
	if v > uint64(len(d.b)) {
		d.fail("string length")
		return ""
	}
	return string(d.bytes(int(v)))
}
