package main

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/archlab/idempotency/internal/testenv"
)

// TestStoreURLRefusedAtParse: a store URL that cannot work is a usage
// error (exit 2) that names the flag or variable, as the README says of
// every bad value, found before the store is opened or anything listens.
// It used to surface when the store was opened, as "open store: ..."
// (exit 1), naming neither.
func TestStoreURLRefusedAtParse(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"unknown scheme", []string{"-store", "nosuch:x"}, nil, "-store"},
		{"bolt without path", []string{"-store", "bolt:"}, nil, `-store "bolt:"`},
		{"redis clock", []string{"-store", "redis://127.0.0.1:1/0?clock=sundial"}, nil, "-store"},
		{"postgres driver option", []string{"-store", "postgres://127.0.0.1:1/db?pool_max_conns=many"}, nil, "-store"},
		{"env", nil, map[string]string{"IDEMPROXY_STORE": "bolt:"}, `IDEMPROXY_STORE="bolt:"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"-upstream", "http://127.0.0.1:9", "-listen", "127.0.0.1:0", "-admin", ""}, tc.args...)
			_, err := parseConfig(args, envOf(tc.env), &syncBuffer{})
			if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("parseConfig(%q, %v) = %v; want a usage error naming %s", args, tc.env, err, tc.want)
			}
		})
	}
	// The value is shown without its secrets, or not at all when it is
	// not a URL (a key=value connection string).
	for _, store := range []string{"redis://:hunter2@127.0.0.1:1/0?clock=sundial", "host=db password=hunter2"} {
		_, err := parseConfig([]string{"-upstream", "http://x", "-store", store}, noEnv, &syncBuffer{})
		if !errors.Is(err, errUsage) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("-store %q: %v; want a usage error without the password", store, err)
		}
	}
}

// TestOperatorStoreURLRefused: the operator commands refuse a bad store
// URL as a usage error too.
func TestOperatorStoreURLRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"get", "-store", "nosuch:x", "k"}, nil, "-store"},
		{[]string{"delete", "k"}, map[string]string{"IDEMPROXY_STORE": "bolt:"}, "IDEMPROXY_STORE"},
	} {
		err := run(context.Background(), tc.args, &syncBuffer{}, &syncBuffer{}, envOf(tc.env))
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q, %v) = %v; want a usage error naming %s", tc.args, tc.env, err, tc.want)
		}
	}
}

// TestStoreConfigRefusedAtOpen: what only the store can judge (here a
// PostgreSQL schema that -migrate=false finds unmigrated) is a usage
// error naming the flag too.
func TestStoreConfigRefusedAtOpen(t *testing.T) {
	url, _ := testenv.PostgresStoreURL(t, "idemproxy_test_")
	up := newUpstream(t)
	err := run(context.Background(), []string{"-upstream", up.URL, "-store", url, "-migrate=false", "-listen", "127.0.0.1:0", "-admin", ""},
		&syncBuffer{}, &syncBuffer{}, noEnv)
	if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "-store") {
		t.Fatalf("an unmigrated schema with -migrate=false: %v; want a usage error naming -store", err)
	}
}

// TestOperatorNotFoundNamesScope: get, delete and release of a key with
// no record say so in the operator's terms (the key and its scope), not
// as the store's internal key with its NUL separator.
func TestOperatorNotFoundNamesScope(t *testing.T) {
	store := "bolt:" + filepath.Join(t.TempDir(), "idem.db")
	for _, cmd := range []string{"get", "delete", "release"} {
		err := run(context.Background(), []string{cmd, "-store", store, "-scope", "tenant-7", "order-42"}, &syncBuffer{}, &syncBuffer{}, noEnv)
		if err == nil {
			t.Fatalf("%s of a missing key succeeded", cmd)
		}
		msg := err.Error()
		if strings.Contains(msg, `\x00`) || strings.Contains(msg, "\x00") ||
			!strings.Contains(msg, `"order-42"`) || !strings.Contains(msg, `"tenant-7"`) {
			t.Errorf("%s of a missing key: %q; want the key and the scope named, and no internal key", cmd, msg)
		}
	}
}
