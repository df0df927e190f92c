package idemhttp

import (
	"errors"
	"strings"
	"testing"
)

func TestParseKey(t *testing.T) {
	for _, c := range []struct {
		name string
		in   []string
		want string
		err  error
	}{
		{"sf-string", []string{`"abc"`}, "abc", nil},
		{"bare token", []string{"abc"}, "abc", nil},
		{"ows", []string{" \t\"abc\" "}, "abc", nil},
		{"escapes", []string{`"a\"b\\c"`}, `a"b\c`, nil},
		{"uuid", []string{"8e03978e-40d5-43e8-bc93-6894a57f9324"}, "8e03978e-40d5-43e8-bc93-6894a57f9324", nil},
		{"comma in string", []string{`"a,b"`}, "a,b", nil},
		{"max length", []string{strings.Repeat("x", 255)}, strings.Repeat("x", 255), nil},
		{"none", nil, "", errKeyMissing},
		{"two fields", []string{"a", "a"}, "", errKeyRepeated},
		{"empty", []string{"  "}, "", errKeyEmpty},
		{"empty string", []string{`""`}, "", errKeyEmpty},
		{"too long", []string{strings.Repeat("x", 256)}, "", errKeyTooLong},
		{"too long quoted", []string{`"` + strings.Repeat("x", 256) + `"`}, "", errKeyTooLong},
		{"list", []string{`"a","b"`}, "", errKeyList},
		{"bare list", []string{"a, b"}, "", errKeyList},
		{"params", []string{`"a"; p=1`}, "", errKeyParams},
		{"bare params", []string{"a;p=1"}, "", errKeyParams},
		{"unterminated", []string{`"abc`}, "", errKeyString},
		{"bad escape", []string{`"a\b"`}, "", errKeyString},
		{"escape at end", []string{`"a\`}, "", errKeyString},
		{"junk after", []string{`"a"b`}, "", errKeyString},
		{"space in string", []string{`"a b"`}, "", errKeyChar},
		{"space in token", []string{"a b"}, "", errKeyChar},
		{"control", []string{"a\x01"}, "", errKeyChar},
		{"non-ascii", []string{"clé"}, "", errKeyChar},
		{"non-ascii quoted", []string{`"clé"`}, "", errKeyString},
		{"quote in token", []string{`a"b`}, "", errKeyString},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseKey(c.in)
			if !errors.Is(err, c.err) || got != c.want {
				t.Fatalf("ParseKey(%q) = %q, %v; want %q, %v", c.in, got, err, c.want, c.err)
			}
		})
	}
}

func TestFormatKeyRoundTrip(t *testing.T) {
	for _, k := range []string{"abc", `a"b`, `a\b`, "a,b;c", strings.Repeat("z", 255)} {
		got, err := ParseKey([]string{FormatKey(k)})
		if err != nil || got != k {
			t.Fatalf("ParseKey(FormatKey(%q)) = %q, %v", k, got, err)
		}
	}
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{`"abc"`, "abc", `"a\"b"`, `"a", "b"`, `"a";x`, "", `"`, `"\`, " x ", strings.Repeat("k", 256)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, err := ParseKey([]string{s})
		if err != nil {
			if k != "" {
				t.Fatalf("error %v with key %q", err, k)
			}
			return
		}
		if len(k) < 1 || len(k) > MaxKeyLen {
			t.Fatalf("key of length %d from %q", len(k), s)
		}
		for i := 0; i < len(k); i++ {
			if k[i] < 0x21 || k[i] > 0x7e {
				t.Fatalf("key %q from %q holds byte %#x", k, s, k[i])
			}
		}
		if again, err := ParseKey([]string{FormatKey(k)}); err != nil || again != k {
			t.Fatalf("sf-string form of %q parses to %q, %v", k, again, err)
		}
		if !strings.ContainsAny(k, `",;\`) {
			if bare, err := ParseKey([]string{k}); err != nil || bare != k {
				t.Fatalf("bare form of %q parses to %q, %v", k, bare, err)
			}
		}
		if trimmed := trimOWS(s); trimmed[0] != '"' && trimmed != k {
			t.Fatalf("bare %q gave key %q", s, k)
		}
	})
}
