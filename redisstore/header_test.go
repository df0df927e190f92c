package redisstore

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestHeaderEncoding(t *testing.T) {
	for _, h := range []map[string][]string{
		{},
		{"A": nil},
		{"A": {}},
		{"X-Bin": {"\x00\xff", ""}, "Content-Type": {"text/plain"}, "": {"empty name"}},
	} {
		b := encodeHeader(h)
		got, err := decodeHeader(b)
		if err != nil {
			t.Fatalf("decode(encode(%q)): %v", h, err)
		}
		if diff := cmp.Diff(h, got); diff != "" {
			t.Errorf("round trip of %q (-want +got):\n%s", h, diff)
		}
	}
	if encodeHeader(nil) != nil {
		t.Error("encodeHeader(nil) is not nil")
	}
	for _, bad := range []string{"", "\x02", "\x01\x05ab", "\x01\x01a\x03\x01x", "\x01\x01a\x00\x01a\x00"} {
		if _, err := decodeHeader([]byte(bad)); err == nil {
			t.Errorf("decodeHeader(%q) accepted a bad encoding", bad)
		}
	}
}

func FuzzHeader(f *testing.F) {
	f.Add([]byte("\x01\x01a\x02\x01b"))
	f.Add(encodeHeader(map[string][]string{"K": {"v1", "\xff"}, "N": nil}))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := decodeHeader(b)
		if err != nil {
			return
		}
		again := encodeHeader(h)
		h2, err := decodeHeader(again)
		if err != nil {
			t.Fatalf("re-decoding %q: %v", again, err)
		}
		if diff := cmp.Diff(h, h2); diff != "" {
			t.Fatalf("not stable (-first +second):\n%s", diff)
		}
		if !bytes.Equal(again, encodeHeader(h2)) {
			t.Fatalf("encoding not canonical")
		}
	})
}
