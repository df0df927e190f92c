package redisstore

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/archlab/idempotency/internal/testenv"
)

// TestNewWarnsWithoutContextTimeout: a client without ContextTimeoutEnabled
// loses batching, and a call cut short by OpTimeout keeps its pooled
// connection until ReadTimeout. New says so through Options.Logger, once
// per New (not once per shard of a Ring), and says nothing of it for a
// client that has it.
func TestNewWarnsWithoutContextTimeout(t *testing.T) {
	o, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		client func(enabled bool) redis.UniversalClient
	}{
		{"client", func(enabled bool) redis.UniversalClient {
			o := *o
			o.ContextTimeoutEnabled = enabled
			return redis.NewClient(&o)
		}},
		{"ring", func(enabled bool) redis.UniversalClient {
			return redis.NewRing(&redis.RingOptions{
				Addrs: map[string]string{"a": o.Addr, "b": o.Addr}, DB: o.DB, Password: o.Password,
				ContextTimeoutEnabled: enabled, DialTimeout: time.Second,
			})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, enabled := range []bool{false, true} {
				c := tc.client(enabled)
				t.Cleanup(func() { c.Close() })
				var buf bytes.Buffer
				if _, err := New(c, &Options{Logger: slog.New(slog.NewTextHandler(&buf, nil))}); err != nil {
					t.Fatal(err)
				}
				n := 0 // warnings about it
				for _, line := range strings.Split(buf.String(), "\n") {
					if strings.Contains(line, "level=WARN") && strings.Contains(line, "ContextTimeoutEnabled") {
						n++
					}
				}
				switch {
				case !enabled && n != 1:
					t.Errorf("New on a client without ContextTimeoutEnabled logged %q; want one warning about it", buf.String())
				case enabled && n != 0:
					t.Errorf("New on a client with ContextTimeoutEnabled logged %q; want no warning about it", buf.String())
				}
			}
		})
	}
}
