package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/upgradetest"
)

// TestUpgradeFromOlderBuild loads the rows an older build wrote
// (boltstore/testdata/upgrade/gen.go, run at commit 10b0c63 with the
// caller's clock at 2026-12-02 12:00 UTC, schema version 1) into a table
// this build migrated: records stay inside their window across an upgrade,
// and during a rolling deploy both builds share them, so this build must
// replay them as stored, keep their claims, fence past their tokens, and
// delete and sweep them, the older build's tombstones (released, deleted:
// lease_until holds the server's time) included.
func TestUpgradeFromOlderBuild(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "upgrade", "records-10b0c63.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dump struct {
		Rows []struct {
			Key, Fingerprint []byte
			State            string
			Token            int64
			LeaseUntil       *int64
			ExpiresAt        int64
			Status           *int64
			Headers, Body    []byte
		}
		Seq int64
	}
	if err := json.Unmarshal(b, &dump); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pool := testPool(t, 4, nil)
	schema := freshSchema(t, pool)
	s := migratedStore(t, pool, schema, Options{Clock: CallerClock, Table: "idempotency_keys"})
	table := pgx.Identifier{schema, "idempotency_keys"}.Sanitize()
	old := map[string]uint64{}
	for _, r := range dump.Rows {
		if _, err := pool.Exec(ctx, "INSERT INTO "+table+` (key, fingerprint, state, token, lease_until, expires_at, status, headers, body)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
			r.Key, r.Fingerprint, r.State, r.Token, r.LeaseUntil, r.ExpiresAt, r.Status, r.Headers, r.Body); err != nil {
			t.Fatalf("inserting %q: %v", r.Key, err)
		}
		old[string(r.Key)] = uint64(r.Token)
	}
	if _, err := pool.Exec(ctx, "SELECT setval($1, $2)", schema+".idempotency_keys_token_seq", dump.Seq); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	now := t0.Add(10 * time.Minute)
	rows := func() int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	upgradetest.Check(t, s, now, old)

	if n, err := s.Sweep(ctx, now, 0); err != nil || n != 1 {
		t.Errorf("Sweep = %d, %v; want the one record past its window (short)", n, err)
	}

	if err := s.Delete(ctx, "done"); err != nil {
		t.Fatalf("Delete(done): %v", err)
	}
	if _, err := s.Get(ctx, "done", now); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Get(done) after Delete: %v; want ErrNotFound", err)
	}
	if rec, ok, err := s.Begin(ctx, "done", "fp-done", now, time.Minute, time.Hour); !ok || err != nil || rec.Token <= uint64(dump.Seq) {
		t.Errorf("Begin(done) after Delete = %+v, %v, %v; want a claim with a token above %d", rec, ok, err, dump.Seq)
	}

	if _, err := s.Sweep(ctx, t0.Add(100*24*time.Hour), 0); err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	if n := rows(); n != 0 {
		t.Errorf("after a sweep past every window: %d rows; want none", n)
	}
}
