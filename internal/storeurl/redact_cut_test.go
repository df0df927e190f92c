package storeurl

import (
	"strings"
	"testing"
)

// TestRedactPasswordThatEndsAuthority: a password with an unencoded / ? or
// # ends the URL's authority early. Open refuses such a URL without quoting
// it, and the commands then name the flag's value through Redact
// (idemcheck's "-store URL: error", idemproxy's usage errors): Redact must
// hide that password too, not print the URL as it is.
func TestRedactPasswordThatEndsAuthority(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"redis://u:S3CR/ETX@127.0.0.1:1/0", "redis://u:xxxxx@127.0.0.1:1/0"},
		{"redis://u:S3CR?ETX@127.0.0.1:1/0", "redis://u:xxxxx@127.0.0.1:1/0"},
		{"redis://u:S3CR#ETX@127.0.0.1:1/0", "redis://u:xxxxx@127.0.0.1:1/0"},
		{"redis://:1234/S3CRETX@127.0.0.1:1/0", "redis://:xxxxx@127.0.0.1:1/0"},
		{"redis://:1234?S3CRETX@127.0.0.1:1/0", "redis://:xxxxx@127.0.0.1:1/0"},
		{"redis://u:S3CR/ETX@h:1/0?prefix=a@b", "redis://u:xxxxx@h:1/0?prefix=a@b"},
		{"redis://u:S3CR?x=ETX@h:1/0", "redis://u:xxxxx@h:1/0"},
		{"rediss+cluster://u:S3CR/ETX@h1:1,h2:2?prefix=a:", "rediss+cluster://u:xxxxx@h1:1,h2:2?prefix=a:"},
		{"redis+sentinel://u:S3CR/ETX@h1,h2/mymaster?sentinel_password=S3CRETX", "redis+sentinel://u:xxxxx@h1,h2/mymaster?sentinel_password=xxxxx"},
		{"postgres://u:S3CR/ETX@127.0.0.1:1/db", "postgres://u:xxxxx@127.0.0.1:1/db"},
		{"postgres://u:S3CR#ETX@127.0.0.1:1/db", "postgres://u:xxxxx@127.0.0.1:1/db"},
		{"postgres://u:1234/S3CRETX@127.0.0.1:1/db", "postgres://u:xxxxx@127.0.0.1:1/db"},
		// No password: nothing to hide, the URL as it is.
		{"redis://h:6379/0?prefix=a@b:", "redis://h:6379/0?prefix=a@b:"},
		{"redis+cluster://h1:1,h2:2?prefix=a@b", "redis+cluster://h1:1,h2:2?prefix=a@b"},
		{"bolt:///var/lib/idem@x:y.db", "bolt:///var/lib/idem@x:y.db"},
	} {
		got := Redact(tc.in)
		if got != tc.want {
			t.Errorf("Redact(%q) = %q; want %q", tc.in, got, tc.want)
		}
		for _, secret := range []string{"S3CR", "ETX", "1234"} {
			if strings.Contains(got, secret) {
				t.Errorf("Redact(%q) = %q shows the password", tc.in, got)
			}
		}
	}
}
