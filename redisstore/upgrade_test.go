package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/upgradetest"
)

// TestUpgradeFromOlderBuild loads the hashes an older build wrote
// (boltstore/testdata/upgrade/gen.go, run at commit 10b0c63 with the
// caller's clock at 2026-12-02 12:00 UTC) under a fresh prefix: records
// stay inside their window across an upgrade, and during a rolling deploy
// both builds share them, so this build must replay them as stored, keep
// their claims, fence past their tokens and delete them; every key keeps a
// TTL.
func TestUpgradeFromOlderBuild(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "upgrade", "records-10b0c63.json"))
	if err != nil {
		t.Fatal(err)
	}
	var hashes map[string]map[string][]byte
	if err := json.Unmarshal(b, &hashes); err != nil {
		t.Fatal(err)
	}
	c := sharedClient(t)
	s := newStore(t, c, Options{Clock: CallerClock})
	ctx := context.Background()
	old := map[string]uint64{}
	for key, fields := range hashes {
		args := make([]any, 0, 2*len(fields))
		for f, v := range fields {
			args = append(args, f, v)
		}
		if err := c.HSet(ctx, s.Key(key), args...).Err(); err != nil {
			t.Fatal(err)
		}
		// The TTL is only garbage collection; the records' times judge.
		if err := c.PExpire(ctx, s.Key(key), time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		tok, err := strconv.ParseUint(string(fields["t"]), 10, 64)
		if err != nil {
			t.Fatalf("%s: token %q: %v", key, fields["t"], err)
		}
		old[key] = tok
	}
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	now := t0.Add(10 * time.Minute)
	upgradetest.Check(t, s, now, old)

	if err := s.Delete(ctx, "done"); err != nil {
		t.Fatalf("Delete(done): %v", err)
	}
	if _, err := s.Get(ctx, "done", now); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Get(done) after Delete: %v; want ErrNotFound", err)
	}
	if rec, ok, err := s.Begin(ctx, "done", "fp-done", now, time.Minute, time.Hour); !ok || err != nil || rec.Token <= old["done"] {
		t.Errorf("Begin(done) after Delete = %+v, %v, %v; want a claim with a token above %d", rec, ok, err, old["done"])
	}
	for key := range hashes {
		if ttl, err := c.PTTL(ctx, s.Key(key)).Result(); err != nil || ttl <= 0 {
			t.Errorf("PTTL of %s = %v, %v; want a TTL", key, ttl, err)
		}
	}
}
