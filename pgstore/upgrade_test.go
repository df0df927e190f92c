package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/jackc/pgx/v5"

	"github.com/archlab/idempotency"
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
	g, err := idempotency.NewGuard(s, &idempotency.Options{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	stored := idempotency.Response{
		Status: 201,
		Header: map[string][]string{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}, "X-Empty": {""}, "X-Bin": {"\x00\xff"}},
		Body:   []byte("{\"id\":42}\x00\xff"),
	}
	rows := func() int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	rec, err := s.Get(ctx, "done", now)
	if err != nil || rec.State != idempotency.Done || rec.Fingerprint != "fp-done" || rec.Token != old["done"] {
		t.Fatalf("Get(done) = %+v, %v; want the older build's done record", rec, err)
	}
	if diff := cmp.Diff(stored, rec.Response); diff != "" {
		t.Errorf("Get(done) response (-stored +read):\n%s", diff)
	}

	ran := 0
	fn := func(ctx context.Context) (idempotency.Response, error) {
		ran++
		return idempotency.Response{Status: 299}, nil
	}
	resp, oc, err := g.Do(ctx, "done", "fp-done", fn)
	if oc != idempotency.Replayed || err != nil || ran != 0 {
		t.Fatalf("Do(done) = %v, %v, ran %d times; want a replay", oc, err, ran)
	}
	if diff := cmp.Diff(stored, resp); diff != "" {
		t.Errorf("Do(done) replay (-stored +replayed):\n%s", diff)
	}
	if _, oc, err := g.Do(ctx, "done", "fp-other", fn); oc != idempotency.Conflicted || !errors.Is(err, idempotency.ErrConflict) || ran != 0 {
		t.Errorf("Do(done, other fingerprint) = %v, %v, ran %d times; want a conflict", oc, err, ran)
	}
	resp, oc, err = g.Do(ctx, "zero", "fp-zero", fn)
	if oc != idempotency.Replayed || err != nil || ran != 0 {
		t.Errorf("Do(zero) = %v, %v, ran %d times; want a replay", oc, err, ran)
	}
	if diff := cmp.Diff(idempotency.Response{}, resp, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("Do(zero) replay (-stored +replayed):\n%s", diff)
	}
	if _, oc, err := g.Do(ctx, "inflight", "fp-inflight", fn); oc != idempotency.InFlight || !errors.Is(err, idempotency.ErrInFlight) || ran != 0 {
		t.Errorf("Do(inflight) = %v, %v, ran %d times; want in flight", oc, err, ran)
	}
	// The older build's tombstones are a released and a deleted key: gone
	// for Get, and claimed again with a larger token.
	for _, key := range []string{"abandoned", "released", "deleted"} {
		var tok uint64
		ran = 0
		_, oc, err := g.Do(ctx, key, "fp-"+key, func(ctx context.Context) (idempotency.Response, error) {
			tok, _ = idempotency.TokenFrom(ctx)
			return fn(ctx)
		})
		if oc != idempotency.Executed || err != nil || ran != 1 || tok <= old[key] {
			t.Errorf("Do(%s) = %v, %v, ran %d times with token %d; want one run with a token above %d", key, oc, err, ran, tok, old[key])
		}
	}

	if _, err := s.Get(ctx, "short", now); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Get(short) after its window: %v; want ErrNotFound", err)
	}
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
