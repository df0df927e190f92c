package storeurl

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/archlab/idempotency"
)

// TestPasswordWithReservedCharactersNotInError: a password with an
// unencoded / ? or # ends the URL's authority early, so the parsers read
// part of it as a port, a database, a query parameter or a fragment, and
// used to quote it back ("invalid port \":S3CR\" after host", "invalid URL
// path: /S3CR@...", "unexpected option: S3CR@..."). Open refuses these
// URLs without quoting them, and says to percent-encode.
func TestPasswordWithReservedCharactersNotInError(t *testing.T) {
	for _, raw := range []string{
		"redis://u:S3CR/ETX@127.0.0.1:1/0",
		"redis://u:S3CR#ETX@127.0.0.1:1/0",
		"redis://u:S3CR?ETX@127.0.0.1:1/0",
		"redis://:1234/S3CRETX@127.0.0.1:1/0",
		"redis://:1234?S3CRETX@127.0.0.1:1/0",
		"redis://:1234#S3CRETX@127.0.0.1:1/0",
		"rediss://u:S3CR/ETX@127.0.0.1:1/0",
		"redis+cluster://u:S3CR/ETX@127.0.0.1:1,127.0.0.1:2",
		"redis+cluster://u:S3CR#ETX@127.0.0.1:1,127.0.0.1:2",
		"redis+cluster://u:S3CR?ETX@127.0.0.1:1,127.0.0.1:2",
		"redis+cluster://u:1234?S3CRETX@127.0.0.1:1,127.0.0.1:2",
		"postgres://u:S3CR/ETX@127.0.0.1:1/db",
		"postgres://u:S3CR#ETX@127.0.0.1:1/db",
		"postgres://u:1234/S3CRETX@127.0.0.1:1/db",
	} {
		err := wantInvalid(t, raw)
		if err == nil {
			continue
		}
		for _, secret := range []string{"S3CR", "ETX", "1234"} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("Open(%q) error quotes the password: %v", raw, err)
			}
		}
		if !strings.Contains(err.Error(), "percent-encode") || strings.Contains(err.Error(), "%!") {
			t.Errorf("Open(%q) = %v; want it to say to percent-encode the password", raw, err)
		}
	}
}

// TestMalformedHostStillExplained: a URL with a user name whose host part
// is wrong still says what is wrong, naming only what follows the last @.
func TestMalformedHostStillExplained(t *testing.T) {
	for _, raw := range []string{
		"redis://u:s3cret@127.0.0.1:bad/0",
		"postgres://u:s3cret@127.0.0.1:bad/db",
		"redis+cluster://u:s3cret@127.0.0.1:bad,127.0.0.1:2",
	} {
		_, c, err := Open(context.Background(), raw, Options{})
		if c != nil {
			c.Close()
		}
		if !errors.Is(err, idempotency.ErrInvalidConfig) || strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), `":bad"`) {
			t.Errorf("Open(%q) = %v; want ErrInvalidConfig naming the port \":bad\" and not the password", raw, err)
		}
	}
}
