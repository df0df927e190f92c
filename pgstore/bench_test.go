package pgstore

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/archlab/idempotency/idemtest"
	"github.com/archlab/idempotency/internal/testenv"
	"github.com/archlab/idempotency/internal/wire"
)

// BenchmarkGuardDo is the shared Guard.Do benchmark (new keys and replays
// at 1, 8 and 64 workers) on a pool of up to 64 connections.
// scripts/bench-pg.sh compares it with pgbench running the same statements.
func BenchmarkGuardDo(b *testing.B) {
	pool := testPool(b, 64, nil)
	s := migratedStore(b, pool, freshSchema(b, pool), Options{})
	idemtest.BenchmarkStore(b, s)
}

// TestPgbenchScript checks the pgbench script of scripts/bench-pg.sh: it
// sends the statements of a new request (Begin's two, in a transaction,
// then Complete with the token Begin returned) exactly as the Store sends
// them, with the response
// of idemtest.BenchmarkStore, and, when pgbench is installed, three runs
// of it store three DONE records. With PGSTORE_PGBENCH_SCRIPT naming a file
// and PGSTORE_BENCH_SCHEMA an existing schema (both set by the script) it
// also writes the script there, for that schema.
func TestPgbenchScript(t *testing.T) {
	pool := testPool(t, 2, nil)
	schema := os.Getenv("PGSTORE_BENCH_SCHEMA")
	if schema == "" {
		schema = freshSchema(t, pool)
	}
	s := migratedStore(t, pool, schema, Options{Table: "pgbench"})
	script := pgbenchScript(s)
	for _, stmt := range []string{s.beginSQL, s.tokenSQL, s.completeSQL} {
		if !strings.Contains(script, stmt[:strings.Index(stmt, "$")]) {
			t.Fatalf("statement missing from the script: %s", stmt)
		}
	}
	if strings.Contains(script, "$") {
		t.Fatalf("a parameter was left unbound in the script:\n%s", script)
	}
	if out := os.Getenv("PGSTORE_PGBENCH_SCRIPT"); out != "" {
		if err := os.WriteFile(out, []byte(script), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pgbench, err := exec.LookPath("pgbench")
	if err != nil {
		t.Logf("pgbench is not installed: checked the script's text only")
		return
	}
	file := filepath.Join(t.TempDir(), "request.sql")
	if err := os.WriteFile(file, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var before int
	done := s.names.Replace("SELECT count(*) FROM {{table}} WHERE state = 'DONE'")
	if err := pool.QueryRow(ctx, done).Scan(&before); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(pgbench, "-n", "-M", "prepared", "-c", "1", "-t", "3", "-f", file, testenv.PostgresURL(t))
	if out, err := cmd.CombinedOutput(); err != nil || strings.Contains(string(out), "aborted") {
		t.Fatalf("pgbench: %v\n%s", err, out)
	}
	var after int
	if err := pool.QueryRow(ctx, done).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after-before != 3 {
		t.Fatalf("3 pgbench transactions stored %d DONE records, want 3", after-before)
	}
}

func pgbenchScript(s *Store) string {
	bind := func(sql string, vars ...string) string {
		for i := len(vars); i >= 1; i-- { // $7 before $1 would not matter, $10 would
			sql = strings.ReplaceAll(sql, fmt.Sprintf("$%d", i), vars[i-1])
		}
		return sql
	}
	bytea := func(b []byte) string { return `'\x` + hex.EncodeToString(b) + `'::bytea` }
	header := wire.EncodeHeader(map[string][]string{"Content-Type": {"application/json"}})
	body := []byte(`{"id":"ch_1","amount":1000,"currency":"eur"}`)
	// pgbench has no clock in \set; keys are unique, so a fixed now only
	// decides nothing, as the real one does for a new key.
	// Begin's two statements go in one transaction, as the Store sends
	// them (in one round trip there: pgbench's -M prepared cannot).
	return fmt.Sprintf(`\set k random(1, 9000000000000000000)
\set fp 7
\set lease 30000000000
\set retention 86400000000000
\set now 1800000000000000000
\set status 200
BEGIN;
%s;
%s
\gset b_
COMMIT;
%s;
`,
		bind(s.beginSQL, ":k", ":fp", ":lease", ":retention", ":now"),
		bind(s.tokenSQL, ":k"),
		bind(s.completeSQL, ":k", ":b_token", ":status", bytea(header), bytea(body), ":retention", ":now"))
}
