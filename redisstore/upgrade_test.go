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

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/archlab/idempotency"
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
	g, err := idempotency.NewGuard(s, &idempotency.Options{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	stored := idempotency.Response{
		Status: 201,
		Header: map[string][]string{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}, "X-Empty": {""}, "X-Bin": {"\x00\xff"}},
		Body:   []byte("{\"id\":42}\x00\xff"),
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
