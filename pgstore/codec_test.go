package pgstore

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestHeaderCodec(t *testing.T) {
	tests := []struct {
		name string
		h    map[string][]string
	}{
		{"nil", nil},
		{"empty", map[string][]string{}},
		{"nil and empty values", map[string][]string{"A": nil, "B": {}}},
		{"values", map[string][]string{"Content-Type": {"text/plain"}, "Set-Cookie": {"a=1", "b=2", ""}}},
		{"raw bytes", map[string][]string{"\x00\xff": {"\xc3\x28", "\u0000"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := encodeHeader(tt.h)
			got, err := decodeHeader(b)
			if err != nil {
				t.Fatalf("decode(encode(%v)): %v", tt.h, err)
			}
			if diff := cmp.Diff(tt.h, got); diff != "" {
				t.Fatalf("round trip (-want +got):\n%s", diff)
			}
		})
	}
	for _, bad := range [][]byte{{}, {2}, {1}, {1, 1}, {1, 1, 5, 'a'}, {1, 0xff}, {1, 0, 0}, {1, 2, 1, 'a', 0, 1, 'a', 0}} {
		if _, err := decodeHeader(bad); err == nil {
			t.Errorf("decodeHeader(%q) accepted malformed input", bad)
		}
	}
}

func FuzzHeaderCodec(f *testing.F) {
	f.Add(encodeHeader(map[string][]string{"A": {"1"}, "B": nil}))
	f.Add([]byte{1, 0})
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := decodeHeader(b)
		if err != nil {
			return
		}
		// Whatever decodes must encode back to the same bytes (keys are
		// written in order, so the encoding is canonical) when it came from
		// a canonical input, and must always round-trip as a map.
		again, err := decodeHeader(encodeHeader(h))
		if err != nil {
			t.Fatalf("re-decoding: %v", err)
		}
		if diff := cmp.Diff(h, again); diff != "" {
			t.Fatalf("round trip (-first +second):\n%s", diff)
		}
	})
}
