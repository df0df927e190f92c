package storeurl

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestClusterSchemeCaseInsensitive: schemes are case-insensitive (RFC
// 3986), as Open treats them for every other form; REDISS+CLUSTER:// used
// to reach go-redis as an unknown scheme.
func TestClusterSchemeCaseInsensitive(t *testing.T) {
	for _, tc := range []struct {
		raw     string
		wantTLS bool
	}{
		{"REDIS+CLUSTER://127.0.0.1:1,127.0.0.1:2?max_retries=-1&dial_timeout=100ms", false},
		{"Rediss+Cluster://127.0.0.1:1,127.0.0.1:2?max_retries=-1&dial_timeout=100ms", true},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, c, err := Open(ctx, tc.raw, Options{})
		cancel()
		if err != nil {
			t.Errorf("Open(%q): %v", tc.raw, err)
			continue
		}
		cc, ok := c.(*redis.ClusterClient)
		if !ok {
			t.Errorf("Open(%q) closer is a %T, want a *redis.ClusterClient", tc.raw, c)
		} else if tls := cc.Options().TLSConfig != nil; tls != tc.wantTLS {
			t.Errorf("Open(%q): TLS %v, want %v", tc.raw, tls, tc.wantTLS)
		}
		c.Close()
	}
}

// TestEmptyOwnParamRejected: prefix=, schema=, table= or clock= with no
// value, as a template with an unset variable writes it, used to mean the
// default: the store then shared the default prefix or table with every
// other application left on it, without a word.
func TestEmptyOwnParamRejected(t *testing.T) {
	for _, raw := range []string{
		"redis://127.0.0.1:1/0?max_retries=-1&dial_timeout=100ms&prefix=",
		"redis://127.0.0.1:1/0?max_retries=-1&dial_timeout=100ms&prefix=app:&clock=",
		"redis+cluster://127.0.0.1:1,127.0.0.1:2?max_retries=-1&dial_timeout=100ms&prefix",
		"postgres://127.0.0.1:1/x?schema=",
		"postgres://127.0.0.1:1/x?schema=idem&table=",
		"postgres://127.0.0.1:1/x?clock=",
	} {
		wantInvalid(t, raw)
	}
}
