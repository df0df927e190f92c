package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Unique returns a fresh lower-case name with the given prefix, fit for a
// PostgreSQL schema or a Redis key prefix.
func Unique(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// withParam appends name=value to a URL's query.
func withParam(url, name, value string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + name + "=" + value
}

// PostgresStoreURL returns a store URL (internal/storeurl form) on the test
// PostgreSQL with a schema of its own, dropped when t ends, and the schema.
func PostgresStoreURL(t testing.TB, prefix string) (url, schema string) {
	t.Helper()
	base := PostgresURL(t)
	schema = Unique(prefix)
	t.Cleanup(func() {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Logf("dropping schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			t.Logf("dropping schema %s: %v", schema, err)
		}
	})
	return withParam(base, "schema", schema), schema
}

// RedisStoreURL returns a store URL on the test Redis with a key prefix of
// its own.
func RedisStoreURL(t testing.TB, prefix string) string {
	t.Helper()
	return withParam(RedisURL(t), "prefix", Unique(prefix)+":")
}
