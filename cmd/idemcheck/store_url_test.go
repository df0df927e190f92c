package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestStoreURLRefusedAtParse: a -store URL that the run would refuse is a
// usage error (exit 2), said before anything runs. A bad clock= used to
// pass the certification's contract checks, which replace it, and be
// refused only when the campaign opened the store, as a failed run (exit
// 1); so did a URL naming no host for the campaign's proxy.
func TestStoreURLRefusedAtParse(t *testing.T) {
	// Nothing listens on port 1: were the store opened, every check
	// would fail instead.
	const redisURL = "redis://127.0.0.1:1/0?max_retries=-1&dial_timeout=100ms&prefix=idemcheck-parse:"
	missingCA := filepath.Join(t.TempDir(), "missing.pem")
	for _, tc := range []struct {
		name, store, want string
	}{
		{"bad clock", redisURL + "&clock=bogus", `clock="bogus": want server or caller`},
		{"empty clock", redisURL + "&clock=", `"clock" is empty`},
		{"clock twice", redisURL + "&clock=server&clock=caller", `"clock" given 2 times`},
		{"cluster bad clock", "redis+cluster://127.0.0.1:1,127.0.0.1:2?max_retries=-1&clock=bogus", `clock="bogus"`},
		{"postgres bad clock", "postgres://u:s3cret@127.0.0.1:1/x?sslmode=disable&clock=bogus", `clock="bogus": want caller or server`},
		{"postgres near miss", "postgres://127.0.0.1:1/x?sslmode=disable&clocks=server", `did you mean "clock"`},
		{"driver option", redisURL + "&dial_timeout=soon", "dial_timeout"},
		{"CA file", "rediss://127.0.0.1:1/0?tls_ca_file=" + missingCA, "cannot be read"},
		{"no host", "redis:///0?prefix=idemcheck-parse:", "one host:port"},
		{"postgres socket", "postgres:///x?host=/var/run/postgresql", "one host:port"},
		{"scheme", "mysql://127.0.0.1:1/x", "unknown store URL scheme"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCmd(t, "-store", tc.store, "-duration", "1s")
			if code != exitUsage {
				t.Fatalf("exit %d, want 2\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
			}
			if !strings.Contains(errOut, "-store ") || !strings.Contains(errOut, tc.want) {
				t.Errorf("stderr does not refuse -store saying %q:\n%s", tc.want, errOut)
			}
			if out != "" {
				t.Errorf("something ran before the refusal:\n%s", out)
			}
			if strings.Contains(errOut, "s3cret") {
				t.Errorf("stderr shows the store's password:\n%s", errOut)
			}
		})
	}
}
