// Package upgradetest holds the checks the stores' upgrade tests share:
// records written by an older build (commit 10b0c63, whose
// boltstore/testdata/upgrade/gen.go wrote every store's fixture) must read,
// replay, conflict, stay in flight and run again under this build as they
// would have under the older one.
package upgradetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/archlab/idempotency"
)

// Response is what gen.go stored under "done".
var Response = idempotency.Response{
	Status: 201,
	Header: map[string][]string{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}, "X-Empty": {""}, "X-Bin": {"\x00\xff"}},
	Body:   []byte("{\"id\":42}\x00\xff"),
}

// Check runs a Guard on s at now over gen.go's records, whose tokens the
// older build gave are old: "done" and "zero" replay as stored and conflict
// with another fingerprint, "inflight" is in flight, "abandoned",
// "released" and "deleted" run again with larger tokens, and "short",
// whose window has ended, is gone.
func Check(t *testing.T, s idempotency.Store, now time.Time, old map[string]uint64) {
	t.Helper()
	ctx := context.Background()
	g, err := idempotency.NewGuard(s, &idempotency.Options{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx, "done", now)
	if err != nil || rec.State != idempotency.Done || rec.Fingerprint != "fp-done" || rec.Token != old["done"] {
		t.Fatalf("Get(done) = %+v, %v; want the older build's done record", rec, err)
	}
	if diff := cmp.Diff(Response, rec.Response); diff != "" {
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
	if diff := cmp.Diff(Response, resp); diff != "" {
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
	// "short" ended its window 5 minutes after gen.go's clock.
	if _, err := s.Get(ctx, "short", now); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Get(short) after its window: %v; want ErrNotFound", err)
	}
}
