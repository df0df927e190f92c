package storeurl

import (
	"net/url"
	"strings"
	"testing"
)

// fuzzSchemes are the schemes FuzzRedact writes URLs in: every form the
// package documents, and some it does not know (Redact hides the secrets
// of any URL).
var fuzzSchemes = []string{
	"redis", "rediss", "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel",
	"postgres", "postgresql", "REDIS", "http", "nats", "x-y.z",
}

// fuzzSecretParams are the names of the secret query parameters
// FuzzRedact writes, also percent-encoded (index 0: none).
var fuzzSecretParams = []string{
	"", "password", "sslpassword", "sentinel_password", "pass%77ord", "%73slpassword", "sentinel%5Fpassword",
}

// FuzzRedact writes a URL of one of fuzzSchemes from fuzzed parts, a user
// with a password (raw or percent-encoded by enc), hosts, a path (which may
// hold a query and a fragment of its own), a query and one secret query
// parameter, and checks that Redact shows neither secret: not raw, not
// percent-decoded, not percent-encoded. For the password it also checks
// the pieces between its / ? # and @ (Redact must not end the user info
// inside it, and show the rest), unless the URL also reads as one without
// a password (see readsWithoutPassword).
func FuzzRedact(f *testing.F) {
	f.Add(uint8(0), "u", "S3CR/ETX", "127.0.0.1:1", "/0", "", uint8(0), "", uint8(0))
	f.Add(uint8(2), "u", "S3CR?ETX", "h1:1,h2:2", "", "prefix=a@b", uint8(0), "", uint8(0))
	f.Add(uint8(4), "u", "pw#SECRETX", "h1,h2", "/mymaster", "", uint8(3), "S3CRETX", uint8(0))
	f.Add(uint8(6), "u", "p@ss:w/rd", "[::1]:5432", "/db", "sslmode=require", uint8(2), "kp&x#y", uint8(1))
	f.Add(uint8(7), "", "1234/SECRETX", "127.0.0.1", "/db", "", uint8(1), "S E%20C", uint8(2))
	f.Add(uint8(9), "a@b", "p:a%s", "app:9000", "/api#f@g", "x=1", uint8(4), "abc=def", uint8(3))
	f.Fuzz(func(t *testing.T, scheme uint8, user, pass, hosts, path, query string, param uint8, value string, enc uint8) {
		var b strings.Builder
		b.WriteString(fuzzSchemes[int(scheme)%len(fuzzSchemes)] + "://")
		switch enc & 3 {
		case 1:
			user = url.QueryEscape(user)
		case 2:
			user = url.PathEscape(user)
		}
		// A raw : in the user name would start the password there.
		user = strings.ReplaceAll(user, ":", "%3A")
		passRaw := pass
		switch enc >> 2 & 3 {
		case 1:
			passRaw = url.QueryEscape(pass)
		case 2:
			passRaw = url.PathEscape(pass)
		case 3:
			passRaw = strings.TrimPrefix(url.UserPassword("", pass).String(), ":")
		}
		b.WriteString(user + ":")
		passAt := b.Len()
		b.WriteString(passRaw + "@" + hosts + path)
		name := fuzzSecretParams[int(param)%len(fuzzSecretParams)]
		valueAt := -1
		switch {
		case name != "":
			b.WriteString("?")
			if enc&16 != 0 && query != "" {
				b.WriteString(query + "&")
			}
			b.WriteString(name + "=")
			valueAt = b.Len()
			b.WriteString(value)
			if enc&16 == 0 && query != "" {
				b.WriteString("&" + query)
			}
		case query != "":
			b.WriteString("?" + query)
		}
		in := b.String()

		out := Redact(in)
		// What Redact writes in a secret's place is no leak, whatever
		// the secret is.
		out = strings.ReplaceAll(out, "xxxxx", "\x00")

		restAt := len(fuzzSchemes[int(scheme)%len(fuzzSchemes)]) + 3
		none, short := readsWithoutPassword(in[restAt:], passAt+len(passRaw)-restAt)
		// Read short, the user info shows what follows its @: the
		// password is hidden only if some of it comes before.
		if !none && (short < 0 || restAt+short > passAt) {
			checkHidden(t, in, out, passAt, passRaw, pass, "password")
		}
		if !none && short < 0 {
			// The pieces of the password between its / ? # @: Redact
			// must hide the user info up to the @ that ends it.
			for _, piece := range strings.FieldsFunc(passRaw, func(r rune) bool { return strings.ContainsRune("/?#@", r) }) {
				if piece != passRaw {
					checkHidden(t, in, out, passAt+strings.Index(passRaw, piece), piece, "", "piece of the password")
				}
			}
		}
		if valueAt >= 0 {
			// An unencoded & ends the value for every parser, and
			// for Redact: what follows is another parameter.
			value, _, _ = strings.Cut(value, "&")
			v, err := url.QueryUnescape(value)
			if err != nil {
				v = ""
			}
			checkHidden(t, in, out, valueAt, value, v, name+" value")
		}
	})
}

// checkHidden fails t if out shows the secret that in holds at offset at as
// raw (decoded is what it means, "" if the same or unknown), in any of its
// forms of at least 4 bytes that the rest of in does not show as well.
func checkHidden(t *testing.T, in, out string, at int, raw, decoded, what string) {
	t.Helper()
	if len(raw) < 4 {
		return
	}
	rest := in[:at] + "\x00" + in[at+len(raw):]
	forms := []string{raw, url.PathEscape(raw), url.QueryEscape(raw)}
	if decoded != "" {
		forms = append(forms, decoded, url.PathEscape(decoded), url.QueryEscape(decoded))
	}
	for _, form := range forms {
		// \x00 stands for what Redact writes, and for the secret in rest.
		if len(form) < 4 || strings.ContainsAny(form, "\x00") || strings.Contains(form, "xxxxx") || shows(rest, form) {
			continue
		}
		if shows(out, form) {
			t.Fatalf("Redact(%q) = %q shows the %s %q (as %q)", in, strings.ReplaceAll(out, "\x00", "xxxxx"), what, raw, form)
		}
	}
}

// shows reports whether s holds form, as it is or percent-decoded.
func shows(s, form string) bool {
	return strings.Contains(s, form) || strings.Contains(unescape(s, false), form) || strings.Contains(unescape(s, true), form)
}

// unescape decodes the valid %XX escapes of s, and + as a space if plus,
// leaving the rest as it is.
func unescape(s string, plus bool) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '%' && i+2 < len(s) && ishex(s[i+1]) && ishex(s[i+2]):
			b.WriteByte(unhex(s[i+1])<<4 | unhex(s[i+2]))
			i += 2
		case c == '+' && plus:
			b.WriteByte(' ')
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

func ishex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// readsWithoutPassword reports whether rest (a URL after its "://") also
// reads as a well-formed URL without user info (none), or with one that
// ends at an @ before passEnd, the end of the password (short, where that
// @ is; -1 if none): after it, no @ before the first / ? or #, every comma-separated
// host a host with a port of digits (or none) that url.Parse takes, and
// every @ after them in a query parameter's value. parseURL takes
// redis://h:1234?prefix=a@b for host h and prefix a@b, though
// u:1234?x=y@h may have meant a password 1234?x=y, and
// redis://u:pw@h?prefix=a@b for password pw, though it may have meant
// pw@h?prefix=a. Such a URL shows its hosts, port and query.
func readsWithoutPassword(rest string, passEnd int) (none bool, short int) {
	if wellFormed(rest) {
		return true, -1
	}
	for at := 0; at < passEnd; at++ {
		if rest[at] != '@' {
			continue
		}
		if _, pass, _ := strings.Cut(rest[:at], ":"); pass != "" && wellFormed(rest[at+1:]) {
			return false, at
		}
	}
	return false, -1
}

// wellFormed reports whether rest, what follows a URL's user info, is
// hosts and a tail as readsWithoutPassword describes.
func wellFormed(rest string) bool {
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	authority, tail := rest[:end], rest[end:]
	if authority == "" || strings.Contains(authority, "@") {
		return false
	}
	for _, host := range strings.Split(authority, ",") {
		u, err := url.Parse("redis://" + host)
		if err != nil || u.User != nil || strings.Trim(u.Port(), "0123456789") != "" {
			return false
		}
	}
	path, query, _ := strings.Cut(tail, "?")
	query, fragment, _ := strings.Cut(query, "#")
	if strings.Contains(path, "@") || strings.Contains(fragment, "@") || strings.Contains(path, "#") && strings.Contains(query, "@") {
		return false
	}
	for _, p := range strings.Split(query, "&") {
		if name, _, _ := strings.Cut(p, "="); strings.Contains(name, "@") {
			return false
		}
	}
	return true
}

// TestRedactFuzzFinds: the leaks FuzzRedact found, each of which showed
// the secret S3CRETX (or a piece of it) before Redact was fixed.
func TestRedactFuzzFinds(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		// An @ and then a / in the password: the user info ends at the
		// @ after the /, not at the first @.
		{"postgres://u:p@S3CRETX/x@h:5432/db", "postgres://u:xxxxx@h:5432/db"},
		// A # in a secret's value: the fragment is the rest of it.
		{"postgres://u@h/db?password=#S3CRETX", "postgres://u@h/db?password=xxxxx"},
		// A secret parameter in the fragment.
		{"redis+sentinel://h1,h2/m?#&sentinel_password=S3CRETX", "redis+sentinel://h1,h2/m?#&sentinel_password=xxxxx"},
		// A user info that an @ in the query ended: what follows it is
		// the rest of the query.
		{"http://u:pw@h?@&sslpassword=S3CRETX", "http://u:xxxxx@&sslpassword=xxxxx"},
		// ... inside a secret's value.
		{"postgres://u:pw@h#?x&sslpassword=@S3CRETX", "postgres://u:xxxxx@xxxxx"},
		// Hosts url.Parse would not take: a user (with a space) and a
		// password, though the port is a number.
		{"postgres://a b:1234?x=S3CRETX@h/db", "postgres://a b:xxxxx@h/db"},
		// A raw ? and @ in the user name.
		{"postgres://?@=:S3CRETX@h/db", "postgres://?@=:xxxxx@h/db"},
		// An @ in a parameter's name, then one in its value.
		{"redis://u:?@S3CR=ETX@h/0", "redis://u:xxxxx@h/0"},
		// An @ in a parameter's name, then one in a later value.
		{"redis://u:?@S3CR&x=ETX@h/0", "redis://u:xxxxx@h/0"},
		// An empty password before an @ and a query with another @.
		{"redis+cluster://u:@S3CR?ETX=@h", "redis+cluster://u:xxxxx@h"},
		// A raw / in the user name: the authority is empty.
		{"redis:///:S3CRETX@h/0", "redis:///:xxxxx@h/0"},
		// A path's @ that leaves a host url.Parse would not take.
		{"redis:///:0@ S3CRETX?=@h/0", "redis:///:xxxxx@h/0"},
	} {
		got := Redact(tc.in)
		if got != tc.want {
			t.Errorf("Redact(%q) = %q; want %q", tc.in, got, tc.want)
		}
		for _, secret := range []string{"S3CR", "ETX"} {
			if strings.Contains(got, secret) {
				t.Errorf("Redact(%q) = %q shows the secret", tc.in, got)
			}
		}
	}
}
