package wire

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestHeaderRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		h    map[string][]string
	}{
		{"nil", nil},
		{"empty", map[string][]string{}},
		{"nil and empty values", map[string][]string{"A": nil, "B": {}}},
		{"values", map[string][]string{"Content-Type": {"text/plain"}, "Set-Cookie": {"a=1", "b=2", ""}}},
		{"raw bytes", map[string][]string{"\x00\xff": {"\xc3\x28", "\u0000"}, "": {"empty name"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := EncodeHeader(tt.h)
			if (tt.h == nil) != (b == nil) {
				t.Fatalf("EncodeHeader(%v) = %q: nil must encode as nil, and only nil", tt.h, b)
			}
			got, err := DecodeHeader(b)
			if err != nil {
				t.Fatalf("decode(encode(%v)): %v", tt.h, err)
			}
			if diff := cmp.Diff(tt.h, got); diff != "" {
				t.Fatalf("round trip (-want +got):\n%s", diff)
			}
		})
	}
}

func TestHeaderRejectsMalformed(t *testing.T) {
	for _, bad := range [][]byte{{}, {2}, {1}, {1, 1}, {1, 1, 5, 'a'}, {1, 0xff}, {1, 0, 0},
		{1, 2, 1, 'a', 0, 1, 'a', 0}, // the same field twice
		{1, 1, 1, 'a', 3, 1, 'x'},    // fewer values than counted
	} {
		if _, err := DecodeHeader(bad); err != ErrBadHeader {
			t.Errorf("DecodeHeader(%q) = %v, want ErrBadHeader", bad, err)
		}
	}
}

func FuzzHeader(f *testing.F) {
	f.Add(EncodeHeader(map[string][]string{"A": {"1"}, "B": nil}))
	f.Add(EncodeHeader(map[string][]string{"K": {"v1", "\xff"}, "N": {}}))
	f.Add([]byte{1, 1, 1, 'a', 2, 1, 'b'})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHeader(b)
		if err != nil {
			return
		}
		again := EncodeHeader(h)
		h2, err := DecodeHeader(again)
		if err != nil {
			t.Fatalf("re-decoding %q: %v", again, err)
		}
		if diff := cmp.Diff(h, h2); diff != "" {
			t.Fatalf("round trip (-first +second):\n%s", diff)
		}
		if !bytes.Equal(again, EncodeHeader(h2)) {
			t.Fatal("encoding is not canonical")
		}
	})
}
