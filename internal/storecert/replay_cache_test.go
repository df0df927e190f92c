package storecert

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/testenv"
	"github.com/archlab/idempotency/internal/verdict"
)

// TestCertifyReplayCache certifies an idempotency.ReplayCache (TTL an
// hour: every replay after the first comes from memory) in front of real
// stores: the contract's clauses, and the fault campaign with its
// linearizability check, with the faults under the cache.
func TestCertifyReplayCache(t *testing.T) {
	redisURL := testenv.RedisURL(t)
	sep := "?"
	if strings.Contains(redisURL, "?") {
		sep = "&"
	}
	for name, url := range map[string]string{
		"memory": "memory",
		"bolt":   "bolt:" + filepath.Join(t.TempDir(), "cert.db"),
		"redis":  redisURL + sep + "prefix=storecert-cache-" + newRunID() + ":",
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			tgt, err := resolve(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer tgt.close()
			cached := func(s idempotency.Store) idempotency.Store {
				c, err := idempotency.NewReplayCache(s, &idempotency.CacheOptions{TTL: time.Hour})
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			tgt.contract = cached(tgt.contract)
			open := tgt.campaign
			tgt.campaign = func(ctx context.Context, seed int64) (*faulty, error) {
				f, err := open(ctx, seed)
				if err == nil {
					f.store = cached(f.store)
				}
				return f, err
			}
			opts, progress := testOptions()
			rep := verdict.New()
			if err := certify(ctx, tgt, opts, rep); err != nil {
				t.Fatal(err)
			}
			wantCertified(t, rep, opts, progress)
		})
	}
}
