package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestConnLostLocalizedFatal: a server whose lc_messages is not English
// sends Severity translated; the FATAL notice of a shutdown is still told
// by SeverityUnlocalized (or by Severity from a server older than 9.6).
func TestConnLostLocalizedFatal(t *testing.T) {
	for _, pe := range []*pgconn.PgError{
		{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P01"},
		{Severity: "ВАЖНО", SeverityUnlocalized: "FATAL", Code: "57P01"},
		{Severity: "致命的エラー", SeverityUnlocalized: "FATAL", Code: "57P01"},
		{Severity: "FATAL", Code: "57P01"},
	} {
		if !connLost(pe) {
			t.Errorf("connLost(%q/%q 57P01) = false, want true", pe.Severity, pe.SeverityUnlocalized)
		}
	}
	if pe := (&pgconn.PgError{Severity: "ERREUR", SeverityUnlocalized: "ERROR", Code: "23505"}); connLost(pe) {
		t.Errorf("connLost(an ERROR) = true, want false")
	}
}

// TestConnectFailureNotRetried: a server that cannot be reached fails the
// call at once; only a connection that broke under a sent statement is
// tried again.
func TestConnectFailureNotRetried(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, err := New(pool, &Options{OpTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Begin(context.Background(), "k", "fp", time.Now(), time.Second, time.Minute); err == nil {
		t.Fatal("Begin on an unreachable server succeeded")
	}
	if n := s.retries.Load(); n != 0 {
		t.Errorf("Begin on an unreachable server was tried %d more times; want none", n)
	}
}
