package main

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigErrors: each bad value is a usage error that names the
// flag or variable as the operator set it, with the value.
func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want []string // in the error
	}{
		{"log level", []string{"-upstream", "http://x", "-log-level", "verbose"}, nil, []string{`-log-level "verbose"`}},
		{"log level env", []string{"-upstream", "http://x"}, map[string]string{"IDEMPROXY_LOG_LEVEL": "loud"}, []string{`IDEMPROXY_LOG_LEVEL="loud"`}},
		{"retention env", []string{"-upstream", "http://x"}, map[string]string{"IDEMPROXY_RETENTION": "10s"}, []string{`IDEMPROXY_RETENTION="10s"`, "30s"}},
		{"retention flag", []string{"-upstream", "http://x", "-retention", "10s"}, map[string]string{"IDEMPROXY_RETENTION": "1h"}, []string{`-retention "10s"`}},
		{"lease flag wins", []string{"-upstream", "http://x", "-lease", "0s"}, map[string]string{"IDEMPROXY_LEASE": "1m"}, []string{`-lease "0s"`}},
		{"scope header space", []string{"-upstream", "http://x", "-scope-header", "X Tenant"}, nil, []string{"-scope-header"}},
		{"scope header colon", []string{"-upstream", "http://x", "-scope-header", "X-Tenant-Id:"}, nil, []string{"-scope-header"}},
		{"scope header authorization", []string{"-upstream", "http://x", "-scope-header", "authorization"}, nil, []string{"-scope-header", "credentials"}},
		{"scope header cookie", []string{"-upstream", "http://x", "-scope-header", "Cookie"}, nil, []string{"-scope-header"}},
		{"listen", []string{"-upstream", "http://x", "-listen", "8080"}, nil, []string{`-listen "8080"`}},
		{"listen empty", []string{"-upstream", "http://x", "-listen", ""}, nil, []string{"-listen"}},
		{"admin", []string{"-upstream", "http://x", "-admin", "9090"}, nil, []string{`-admin "9090"`}},
		{"store env empty", []string{"-upstream", "http://x"}, map[string]string{"IDEMPROXY_STORE": ""}, []string{"IDEMPROXY_STORE"}},
		{"upstream env empty", nil, map[string]string{"IDEMPROXY_UPSTREAM": ""}, []string{"IDEMPROXY_UPSTREAM"}},
		{"upstream user info", []string{"-upstream", "http://app:s3cret@127.0.0.1:9000"}, nil, []string{"-upstream", "user info"}},
		{"max response", []string{"-upstream", "http://x", "-max-response", "0"}, nil, []string{`-max-response "0"`}},
		{"body timeout", []string{"-upstream", "http://x", "-body-timeout", "-1s"}, nil, []string{`-body-timeout "-1s"`}},
		{"idle timeout env", []string{"-upstream", "http://x"}, map[string]string{"IDEMPROXY_IDLE_TIMEOUT": "-1s"}, []string{`IDEMPROXY_IDLE_TIMEOUT="-1s"`}},
		// Under auto the size is checked on a store that gets no cache too.
		{"replay cache size on memory", []string{"-upstream", "http://x", "-store", "memory", "-replay-cache-size", "64"}, nil, []string{`-replay-cache-size "64"`, "whatever the store"}},
		{"replay cache size on bolt env", []string{"-upstream", "http://x", "-store", "bolt:x.db"}, map[string]string{"IDEMPROXY_REPLAY_CACHE_SIZE": "64"}, []string{`IDEMPROXY_REPLAY_CACHE_SIZE="64"`, "whatever the store"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := envOf(tc.env)
			c, err := parseConfig(tc.args, env, &syncBuffer{})
			if !errors.Is(err, errUsage) {
				t.Fatalf("parseConfig(%q, %v) = %+v, %v; want a usage error", tc.args, tc.env, c, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
	// A scope header that is a header name is fine.
	if _, err := parseConfig([]string{"-upstream", "http://x", "-scope-header", "x-tenant-id"}, noEnv, &syncBuffer{}); err != nil {
		t.Errorf("-scope-header x-tenant-id: %v", err)
	}
}

// TestReplayCacheSizeIgnoredWhenOff: -replay-cache 0 turns the cache off
// on every store, and the size is then not checked.
func TestReplayCacheSizeIgnoredWhenOff(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
	}{
		{"flags", []string{"-replay-cache", "0", "-replay-cache-size", "0"}, nil},
		{"env", nil, map[string]string{"IDEMPROXY_REPLAY_CACHE": "0", "IDEMPROXY_REPLAY_CACHE_SIZE": "64"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"-upstream", "http://x", "-store", "redis://127.0.0.1:1/0"}, tc.args...)
			c, err := parseConfig(args, envOf(tc.env), &syncBuffer{})
			if err != nil {
				t.Fatalf("parseConfig(%q, %v): %v", args, tc.env, err)
			}
			if ttl := c.replayCache.forStore(true); ttl != 0 {
				t.Fatalf("replay cache TTL = %v; want 0 (off)", ttl)
			}
		})
	}
}

// TestReplayCacheUsage: the usage line of -replay-cache says what it
// takes, where the flag package would print "value".
func TestReplayCacheUsage(t *testing.T) {
	var out syncBuffer
	if _, err := parseConfig([]string{"-h"}, noEnv, &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v; want flag.ErrHelp", err)
	}
	usage := out.String()
	if !strings.Contains(usage, "-replay-cache auto|duration\n") {
		t.Errorf("-replay-cache has no auto|duration placeholder:\n%s", usage)
	}
	if strings.Contains(usage, " value\n") {
		t.Errorf("a flag shows the placeholder \"value\":\n%s", usage)
	}
}

// TestUpstreamPasswordNotInError: the upstream's password stays out
// of the error, whichever check refuses it.
func TestUpstreamPasswordNotInError(t *testing.T) {
	for _, up := range []string{"http://u:s3cret@x:bad", "ftp://u:s3cret@x", "http://u:s3cret@x:9000"} {
		_, err := parseConfig([]string{"-upstream", up}, noEnv, &syncBuffer{})
		if err == nil || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("-upstream %q: %v; want an error without the password", up, err)
		}
	}
}

// TestEmptyAdminEnvTurnsAdminOff: IDEMPROXY_ADMIN= turns the admin
// server off as -admin "" does (the usage says "empty: off").
func TestEmptyAdminEnvTurnsAdminOff(t *testing.T) {
	up := newUpstream(t)
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
	}{
		{"flag", []string{"-admin", ""}, nil},
		{"env", nil, map[string]string{"IDEMPROXY_ADMIN": ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			logs := &syncBuffer{}
			done := make(chan error, 1)
			args := append([]string{"-listen", "127.0.0.1:0", "-upstream", up.URL, "-store", "memory"}, tc.args...)
			go func() { done <- run(ctx, args, &syncBuffer{}, logs, envOf(tc.env)) }()
			exited := make(chan struct{})
			var runErr error
			go func() { runErr = <-done; close(exited) }()
			_, admin := waitListening(t, logs.String, exited)
			cancel()
			<-exited
			if runErr != nil {
				t.Fatalf("run: %v", runErr)
			}
			if admin != "" {
				t.Fatalf("admin server on %s; want none:\n%s", admin, logs)
			}
		})
	}
}

// TestStoreEnvPasswordNotInUsage: an operator command prints its
// usage on a mistake; the store URL from IDEMPROXY_STORE, password and
// all, used to be printed as the flag's default.
func TestStoreEnvPasswordNotInUsage(t *testing.T) {
	env := envOf(map[string]string{"IDEMPROXY_STORE": "redis://:hunter2@127.0.0.1:1/0"})
	for _, args := range [][]string{{"get"}, {"delete", "-bogus", "k"}, {"release", "-h"}} {
		var out syncBuffer
		err := run(context.Background(), args, &out, &out, env)
		if err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
		if strings.Contains(out.String(), "hunter2") {
			t.Errorf("run(%q) printed the password:\n%s", args, out.String())
		}
	}
	// The variable is still the default store.
	path := filepath.Join(t.TempDir(), "idem.db")
	var out syncBuffer
	if err := run(context.Background(), []string{"get", "k"}, &out, &out,
		envOf(map[string]string{"IDEMPROXY_STORE": "bolt:" + path})); err == nil {
		t.Fatal("get of a missing key succeeded")
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("get did not open the IDEMPROXY_STORE file: %v", err)
	}
}

// TestHelp: -h prints the usage, which names the environment
// variables, and is not an error (exit 0).
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"get", "-h"}} {
		var out syncBuffer
		err := run(context.Background(), args, &out, &out, noEnv)
		if errors.Is(err, errUsage) || !errors.Is(err, flag.ErrHelp) {
			t.Errorf("run(%q) = %v; want flag.ErrHelp only", args, err)
		}
	}
	var out syncBuffer
	_ = run(context.Background(), []string{"-h"}, &out, &out, noEnv)
	if !strings.Contains(out.String(), "IDEMPROXY_") {
		t.Errorf("-h does not mention the environment:\n%s", out.String())
	}
}

// TestBadListenBeforeStore: a malformed -listen is refused before
// the store is opened (or a PostgreSQL schema migrated).
func TestBadListenBeforeStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	err := run(context.Background(), []string{"-upstream", "http://127.0.0.1:9", "-store", "bolt:" + path, "-listen", "8080"},
		&syncBuffer{}, &syncBuffer{}, noEnv)
	if !errors.Is(err, errUsage) {
		t.Fatalf("-listen 8080: %v; want a usage error", err)
	}
	if _, err := os.Stat(path); err == nil {
		t.Fatal("the store was opened before -listen was checked")
	}
}

// TestEnvValueHint: a variable that does not parse says what is wanted;
// the flag package's own word is only "parse error", and a variable,
// unlike a flag, gets no usage listing that shows the flag's type.
func TestEnvValueHint(t *testing.T) {
	for _, tc := range []struct{ name, value, want string }{
		{"IDEMPROXY_LEASE", "30", "duration"},
		{"IDEMPROXY_REQUIRE_KEY", "yes", "true or false"},
		{"IDEMPROXY_MAX_BODY", "1MiB", "whole number"},
	} {
		_, err := parseConfig([]string{"-upstream", "http://x"}, envOf(map[string]string{tc.name: tc.value}), &syncBuffer{})
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), tc.name) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s=%q: %v; want a usage error naming it and saying %q", tc.name, tc.value, err, tc.want)
		}
	}
}

// TestFlagWinsOverBadEnv: a flag on the command line wins over its
// variable, also over one that does not parse, and -h prints the usage
// whatever the environment holds.
func TestFlagWinsOverBadEnv(t *testing.T) {
	env := envOf(map[string]string{"IDEMPROXY_LEASE": "abc", "IDEMPROXY_UPSTREAM": "http://x"})
	c, err := parseConfig([]string{"-lease", "5s"}, env, &syncBuffer{})
	if err != nil || c.lease.String() != "5s" {
		t.Fatalf("-lease 5s with IDEMPROXY_LEASE=abc: %+v, %v; want lease 5s", c, err)
	}
	if _, err := parseConfig([]string{"-h"}, env, &syncBuffer{}); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h with IDEMPROXY_LEASE=abc: %v; want flag.ErrHelp", err)
	}
	// Without the flag, the variable's error stands.
	if _, err := parseConfig(nil, env, &syncBuffer{}); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "IDEMPROXY_LEASE") {
		t.Fatalf("IDEMPROXY_LEASE=abc alone: %v; want a usage error naming it", err)
	}
}
