package boltstore

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/upgradetest"
)

// TestUpgradeFromOlderBuild opens a file written by an older build
// (testdata/upgrade/gen.go, run at commit 10b0c63 with t0 as its clock):
// records stay inside their window across an upgrade, so this build must
// replay them as stored, keep their claims, fence past their tokens, and
// delete and sweep them.
func TestUpgradeFromOlderBuild(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("testdata", "upgrade", "records-10b0c63.db"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "idem.db")
	if err := os.WriteFile(path, src, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Open(path, nil)
	if err != nil {
		t.Fatalf("Open of the older build's file: %v", err)
	}
	defer func() {
		checkFile(t, s.DB())
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	// The tokens the older build gave, in the order gen.go claimed.
	old := map[string]uint64{"done": 1, "zero": 2, "inflight": 3, "abandoned": 4, "released": 5, "deleted": 6, "short": 7}
	now := t0.Add(10 * time.Minute)
	upgradetest.Check(t, s, now, old)

	// "short" is swept.
	if _, err := s.Sweep(ctx, now, 0); err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	if recs, index := counts(t, s); recs != 6 || index != 6 {
		t.Errorf("after the sweep: %d records, %d index entries; want 6 and 6", recs, index)
	}

	if err := s.Delete(ctx, "done"); err != nil {
		t.Fatalf("Delete(done): %v", err)
	}
	if _, err := s.Get(ctx, "done", now); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Get(done) after Delete: %v; want ErrNotFound", err)
	}
	if rec, ok, err := s.Begin(ctx, "done", "fp-done", now, lease, retention); !ok || err != nil || rec.Token <= 7 {
		t.Errorf("Begin(done) after Delete = %+v, %v, %v; want a claim with a token above 7", rec, ok, err)
	}

	// Every record, the older build's included, leaves with the sweep.
	if _, err := s.Sweep(ctx, t0.Add(100*24*time.Hour), 0); err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	if recs, index := counts(t, s); recs != 0 || index != 0 {
		t.Errorf("after a sweep past every window: %d records, %d index entries; want none", recs, index)
	}
}
