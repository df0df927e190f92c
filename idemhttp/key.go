package idemhttp

import (
	"errors"
	"strings"
)

// MaxKeyLen is the longest Idempotency-Key accepted, in characters.
const MaxKeyLen = 255

// Errors of ParseKey. They end up in the detail of the invalid-key problem.
var (
	errKeyMissing  = errors.New("no Idempotency-Key field")
	errKeyRepeated = errors.New("more than one Idempotency-Key field")
	errKeyEmpty    = errors.New("empty Idempotency-Key")
	errKeyTooLong  = errors.New("Idempotency-Key longer than 255 characters")
	errKeyList     = errors.New("Idempotency-Key is a list; send one key")
	errKeyParams   = errors.New("Idempotency-Key has parameters; send the key alone")
	errKeyString   = errors.New("Idempotency-Key is not a valid sf-string")
	errKeyChar     = errors.New("Idempotency-Key holds a character that is not visible ASCII")
)

// ParseKey returns the key carried by the Idempotency-Key field values of a
// request (http.Header["Idempotency-Key"]).
//
// The draft makes the field an RFC 8941 sf-string ("abc"); many clients send
// a bare token (abc), which is accepted too, and both forms name one key. A
// key is 1 to 255 visible ASCII characters (0x21-0x7E) once the sf-string
// escapes (\" and \\) are undone. Rejected, with an error that says why: more
// than one field, a list, parameters (;a=1), an empty value, a broken
// sf-string, and a bare value holding '"', ',', ';' or '\'.
//
// The returned key shares memory with the field value when it holds no
// escape, so parsing allocates nothing on the common path.
func ParseKey(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", errKeyMissing
	case 1:
	default:
		return "", errKeyRepeated
	}
	v := trimOWS(values[0])
	if v == "" {
		return "", errKeyEmpty
	}
	if v[0] == '"' {
		return parseSFString(v)
	}
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c == ',':
			return "", errKeyList
		case c == ';':
			return "", errKeyParams
		case c == '"' || c == '\\':
			return "", errKeyString
		case c < 0x21 || c > 0x7e:
			return "", errKeyChar
		}
	}
	if len(v) > MaxKeyLen {
		return "", errKeyTooLong
	}
	return v, nil
}

// parseSFString parses v, which starts with a quote, as exactly one
// sf-string (RFC 8941 section 3.3.3) with nothing after it.
func parseSFString(v string) (string, error) {
	escaped := false
	end := -1
	for i := 1; i < len(v); i++ {
		c := v[i]
		if c == '\\' {
			if i+1 >= len(v) || (v[i+1] != '"' && v[i+1] != '\\') {
				return "", errKeyString
			}
			escaped = true
			i++
			continue
		}
		if c == '"' {
			end = i
			break
		}
		if c < 0x20 || c > 0x7e {
			return "", errKeyString
		}
	}
	if end < 0 {
		return "", errKeyString
	}
	if rest := trimOWS(v[end+1:]); rest != "" {
		switch rest[0] {
		case ',':
			return "", errKeyList
		case ';':
			return "", errKeyParams
		}
		return "", errKeyString
	}
	key := v[1:end]
	if escaped {
		var b strings.Builder
		b.Grow(len(key))
		for i := 0; i < len(key); i++ {
			if key[i] == '\\' {
				i++
			}
			b.WriteByte(key[i])
		}
		key = b.String()
	}
	switch {
	case key == "":
		return "", errKeyEmpty
	case len(key) > MaxKeyLen:
		return "", errKeyTooLong
	}
	for i := 0; i < len(key); i++ {
		if key[i] == ' ' {
			return "", errKeyChar
		}
	}
	return key, nil
}

// trimOWS removes the optional white space (SP, HTAB) around a field value.
func trimOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// FormatKey returns key as an sf-string, the form the draft asks clients to
// send. It is the inverse of ParseKey for every key ParseKey accepts.
func FormatKey(key string) string {
	var b strings.Builder
	b.Grow(len(key) + 2)
	b.WriteByte('"')
	for i := 0; i < len(key); i++ {
		if key[i] == '"' || key[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(key[i])
	}
	b.WriteByte('"')
	return b.String()
}
