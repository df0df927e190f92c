// Package testenv finds the external services that tests run against.
//
// Each service is named by an environment variable. When it is unset the
// test is skipped with a message that says so, unless
// IDEMPOTENCY_TEST_REQUIRE_SERVICES=1 (set by .ci/run), under which a
// missing service fails the test: in CI a skip would hide an untested engine.
package testenv

import (
	"os"
	"strings"
	"testing"
)

// Variables naming the services.
const (
	RedisURLVar        = "IDEMPOTENCY_TEST_REDIS_URL"
	RedisClusterVar    = "IDEMPOTENCY_TEST_REDIS_CLUSTER"
	PostgresURLVar     = "IDEMPOTENCY_TEST_POSTGRES_URL"
	NATSURLVar         = "IDEMPOTENCY_TEST_NATS_URL"
	RequireServicesVar = "IDEMPOTENCY_TEST_REQUIRE_SERVICES"
)

// Required reports whether missing services fail tests instead of skipping.
func Required() bool { return os.Getenv(RequireServicesVar) == "1" }

// Lookup returns the value of the variable, or skips (fails when Required)
// the test when it is unset.
func Lookup(t testing.TB, name string) string {
	t.Helper()
	v := strings.TrimSpace(os.Getenv(name))
	if v == "" {
		Missing(t, name+" is not set")
	}
	return v
}

// Missing skips t, or fails it when services are required, saying why.
func Missing(t testing.TB, why string) {
	t.Helper()
	if Required() {
		t.Fatalf("required service missing: %s (%s=1)", why, RequireServicesVar)
	}
	t.Skipf("skipping: %s", why)
}

// RedisURL returns the URL of a Redis server for tests (redis://...).
func RedisURL(t testing.TB) string { t.Helper(); return Lookup(t, RedisURLVar) }

// RedisCluster returns the addresses of a Redis Cluster's masters.
func RedisCluster(t testing.TB) []string {
	t.Helper()
	return strings.Split(Lookup(t, RedisClusterVar), ",")
}

// PostgresURL returns a PostgreSQL connection URL for tests.
func PostgresURL(t testing.TB) string { t.Helper(); return Lookup(t, PostgresURLVar) }

// NATSURL returns the URL of a NATS server with JetStream.
func NATSURL(t testing.TB) string { t.Helper(); return Lookup(t, NATSURLVar) }

// Binary returns the path of an executable needed by a fault test (for
// example redis-server or pg_ctl), or skips/fails when it is not installed.
func Binary(t testing.TB, candidates ...string) string {
	t.Helper()
	for _, c := range candidates {
		if p, err := lookPath(c); err == nil {
			return p
		}
	}
	Missing(t, "none of "+strings.Join(candidates, ", ")+" is installed")
	return ""
}
