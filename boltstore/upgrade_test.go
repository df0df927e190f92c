package boltstore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/archlab/idempotency"
)

// upgradeResp is the response testdata/upgrade/gen.go stored under "done".
var upgradeResp = idempotency.Response{
	Status: 201,
	Header: map[string][]string{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}, "X-Empty": {""}, "X-Bin": {"\x00\xff"}},
	Body:   []byte("{\"id\":42}\x00\xff"),
}

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
	g, err := idempotency.NewGuard(s, &idempotency.Options{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}

	rec, err := s.Get(ctx, "done", now)
	if err != nil || rec.State != idempotency.Done || rec.Fingerprint != "fp-done" || rec.Token != old["done"] {
		t.Fatalf("Get(done) = %+v, %v; want the older build's done record", rec, err)
	}
	if diff := cmp.Diff(upgradeResp, rec.Response); diff != "" {
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
	if diff := cmp.Diff(upgradeResp, resp); diff != "" {
		t.Errorf("Do(done) replay (-stored +replayed):\n%s", diff)
	}
	if _, oc, err := g.Do(ctx, "done", "fp-other", fn); oc != idempotency.Conflicted || !errors.Is(err, idempotency.ErrConflict) || ran != 0 {
		t.Errorf("Do(done, other fingerprint) = %v, %v, ran %d times; want a conflict", oc, err, ran)
	}
	resp, oc, err = g.Do(ctx, "zero", "fp-zero", fn)
	if oc != idempotency.Replayed || err != nil || ran != 0 {
		t.Errorf("Do(zero) = %v, %v, ran %d times; want a replay", oc, err, ran)
	}
	if diff := cmp.Diff(idempotency.Response{}, resp); diff != "" {
		t.Errorf("Do(zero) replay (-stored +replayed):\n%s", diff)
	}
	if _, oc, err := g.Do(ctx, "inflight", "fp-inflight", fn); oc != idempotency.InFlight || !errors.Is(err, idempotency.ErrInFlight) || ran != 0 {
		t.Errorf("Do(inflight) = %v, %v, ran %d times; want in flight", oc, err, ran)
	}
	// A claim whose lease ran out, a released key and a deleted one run
	// again, each with a token above the older build's.
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

	// "short" ended its window 5 minutes after t0: gone, and swept.
	if _, err := s.Get(ctx, "short", now); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Get(short) after its window: %v; want ErrNotFound", err)
	}
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
