package storeurl

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/testenv"
)

// TestPostgresNearMissParamRefused: a misspelt schema=, table= or clock=
// (or redis's prefix=) used to reach pgx, which sent it to the server as a
// setting, so the mistake surfaced only when connecting, as an outage
// (ErrUnavailable), and without Migrate only at the first request. Open
// refuses it before connecting, naming it, and not quoting the password.
func TestPostgresNearMissParamRefused(t *testing.T) {
	for _, tc := range []struct{ param, want string }{
		{"Schema=idem", `"Schema"`},
		{"SCHEMA=idem", `"SCHEMA"`},
		{"shema=idem", `"shema"`},
		{"schemas=idem", `"schemas"`},
		{"scheme=idem", `"scheme"`},
		{"tabel=keys", `"tabel"`},
		{"tables=keys", `"tables"`},
		{"Table=keys", `"Table"`},
		{"clok=server", `"clok"`},
		{"clocks=server", `"clocks"`},
		{"prefix=app:", `"prefix"`},
	} {
		// Port 1 answers nothing: a name let through fails as ErrUnavailable.
		raw := "postgres://u:s3cret@127.0.0.1:1/x?sslmode=disable&" + tc.param
		for _, migrate := range []bool{false, true} {
			err := wantInvalidWith(t, raw, Options{Migrate: migrate})
			if err == nil {
				continue
			}
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "s3cret") {
				t.Errorf("Open(%q) = %v; want the parameter %s named and no password", raw, err, tc.want)
			}
		}
	}
}

// TestPostgresSettingsPassThrough: the query parameters pgx does not know
// are server settings, sent when connecting, and Open lets them through:
// built-in ones, and custom ones with a dot, next to pgx's own options.
func TestPostgresSettingsPassThrough(t *testing.T) {
	base, _ := testenv.PostgresStoreURL(t, "t")
	raw := base + "&application_name=idem_settings_test&statement_timeout=5s&search_path=public" +
		"&timezone=UTC&idem_test.note=x&pool_max_conns=2&connect_timeout=5&statement_cache_capacity=64"
	roundTrip(t, open(t, raw, Options{Migrate: true}), "k")
	roundTrip(t, open(t, raw, Options{}), "k2")
}

// TestPostgresServerRefusedSettingInvalid: a setting the server does not
// know, or a bad value for one it does, makes the server refuse the
// session; Open used to report that as ErrUnavailable (an outage, to be
// retried), and without Migrate not at all. It is ErrInvalidConfig, with
// the server's word naming the parameter.
func TestPostgresServerRefusedSettingInvalid(t *testing.T) {
	base, _ := testenv.PostgresStoreURL(t, "t")
	open(t, base, Options{Migrate: true})
	for _, tc := range []struct{ param, want string }{
		{"bogus_setting=1", `"bogus_setting"`},
		{"statement_timeout=soon", `"statement_timeout"`},
	} {
		for _, migrate := range []bool{false, true} {
			raw := base + "&" + tc.param
			err := wantInvalidWith(t, raw, Options{Migrate: migrate})
			if err == nil {
				continue
			}
			if errors.Is(err, idempotency.ErrUnavailable) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Open(%q, Migrate: %v) = %v; want ErrInvalidConfig only, naming %s", raw, migrate, err, tc.want)
			}
		}
	}
}

// TestNearMissSparesKnownNames: the near-miss rule refuses no name pgx
// takes as an option, nor any setting of the test server (pg_settings),
// nor a custom setting.
func TestNearMissSparesKnownNames(t *testing.T) {
	names := []string{
		// pgconn, pgx and pgxpool options (v5), and libpq's dbname, ssl.
		"host", "port", "database", "dbname", "user", "password", "passfile", "connect_timeout",
		"sslmode", "ssl", "sslkey", "sslcert", "sslcertmode", "sslrootcert", "sslnegotiation", "sslpassword",
		"sslsni", "krbspn", "krbsrvname", "target_session_attrs", "service", "servicefile",
		"min_protocol_version", "max_protocol_version", "channel_binding", "require_auth",
		"statement_cache_capacity", "description_cache_capacity", "default_query_exec_mode",
		"pool_max_conns", "pool_min_conns", "pool_min_idle_conns", "pool_max_conn_lifetime",
		"pool_max_conn_idle_time", "pool_health_check_period", "pool_max_conn_lifetime_jitter",
		"pool_ping_timeout",
		// Startup parameters the server takes besides settings.
		"options", "replication",
		// Custom settings.
		"schema.name", "idem.table", "clock.x",
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT name FROM pg_settings")
	if err != nil {
		t.Fatal(err)
	}
	settings, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(settings) < 100 {
		t.Fatalf("pg_settings: %d names, %v", len(settings), err)
	}
	for _, name := range append(names, settings...) {
		u := &url.URL{Scheme: "postgres", Host: "db", RawQuery: url.Values{name: {"1"}}.Encode()}
		if err := checkPostgresParams(u); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
