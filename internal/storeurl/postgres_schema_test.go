package storeurl

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/testenv"
)

// TestPostgresSchemaCheckedWithoutMigrate: without Migrate (idemproxy
// -migrate=false) Open used to hand back a store on any schema, and a
// binary older than the schema, or a schema never migrated, was found at
// the first request with a confusing error. Open now refuses both with
// ErrInvalidConfig and the versions, and opens a current schema.
func TestPostgresSchemaCheckedWithoutMigrate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		migrate bool                 // before the setup
		setup   string               // on the version table, with $1 the latest version
		current func(latest int) int // the version after setup
		want    string               // in the error; "" for none
	}{
		{"never migrated", false, "", func(int) int { return 0 }, "migrate"},
		{"older", true, "DELETE FROM %s WHERE version = $1", func(l int) int { return l - 1 }, "migrate"},
		{"newer", true, "INSERT INTO %s (version) VALUES ($1 + 1)", func(l int) int { return l + 1 }, "newer build"},
		{"current", true, "", func(l int) int { return l }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base, schema := testenv.PostgresStoreURL(t, "t")
			raw := base + "&table=keys"
			const latest = 1 // pgstore's migrations; checked below
			if tc.migrate {
				open(t, raw, Options{Migrate: true})
				ctx := context.Background()
				conn, err := pgx.Connect(ctx, testenv.PostgresURL(t))
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close(ctx)
				versions := pgx.Identifier{schema, "keys_schema_version"}.Sanitize()
				var got int
				if err := conn.QueryRow(ctx, "SELECT max(version) FROM "+versions).Scan(&got); err != nil || got != latest {
					t.Fatalf("schema version after Migrate = %d, %v; want %d (update this test)", got, err, latest)
				}
				if tc.setup != "" {
					if _, err := conn.Exec(ctx, strings.Replace(tc.setup, "%s", versions, 1), latest); err != nil {
						t.Fatal(err)
					}
				}
			}

			if tc.want == "" {
				roundTrip(t, open(t, raw, Options{}), "k")
				return
			}
			err := wantInvalidWith(t, raw, Options{})
			if err == nil {
				return
			}
			if errors.Is(err, idempotency.ErrUnavailable) {
				t.Errorf("Open = %v; want ErrInvalidConfig only, not ErrUnavailable", err)
			}
			msg := err.Error()
			cur := tc.current(latest)
			if !strings.Contains(strings.ToLower(msg), tc.want) || !strings.Contains(msg, "version "+strconv.Itoa(cur)) ||
				!strings.Contains(msg, "version "+strconv.Itoa(latest)) {
				t.Errorf("Open = %q; want it to say %q and name versions %d and %d", msg, tc.want, cur, latest)
			}
		})
	}
}

// TestPostgresUnreachableAtOpen: a server that does not answer fails Open
// with ErrUnavailable with or without Migrate (without it, Open used to
// succeed and the store failed at its first request).
func TestPostgresUnreachableAtOpen(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	raw := "postgres://postgres@" + addr + "/x?sslmode=disable&connect_timeout=2"
	for _, migrate := range []bool{true, false} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		s, c, err := Open(ctx, raw, Options{Migrate: migrate})
		cancel()
		if c != nil {
			c.Close()
		}
		if !errors.Is(err, idempotency.ErrUnavailable) || errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("Open(Migrate: %v) of an unreachable server = %T, %v; want ErrUnavailable", migrate, s, err)
		}
	}
}
