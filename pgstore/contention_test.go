package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/archlab/idempotency"
)

// TestGuardContention runs 64 goroutines through Guards on one store, on
// one key and on many keys at once, with the pool's transactions at each
// isolation level (REPEATABLE READ and SERIALIZABLE make concurrent claims
// fail with SQLSTATE 40001, which the store retries): each key's fn runs
// exactly once, every other call replays its result or is told it is in
// flight, and none fails.
func TestGuardContention(t *testing.T) {
	direct := testPool(t, 2, nil)
	schema := freshSchema(t, direct)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	for _, iso := range []string{"read committed", "repeatable read", "serializable"} {
		t.Run(iso, func(t *testing.T) {
			cfg := direct.Config()
			cfg.MaxConns = 16
			cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = iso
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			table := "contention_" + strings.ReplaceAll(iso, " ", "_")
			migratedStore(t, direct, schema, Options{Table: table})
			s, err := New(pool, &Options{Schema: schema, Table: table})
			if err != nil {
				t.Fatal(err)
			}
			g, err := idempotency.NewGuard(s, &idempotency.Options{Lease: lease, Retention: retention})
			if err != nil {
				t.Fatal(err)
			}
			var (
				mu   sync.Mutex
				runs = map[string]int{}
			)
			do := func(key string) error {
				resp, out, err := g.Do(context.Background(), key, "fp", func(context.Context) (idempotency.Response, error) {
					mu.Lock()
					runs[key]++
					mu.Unlock()
					time.Sleep(time.Millisecond) // let others meet the claim
					return idempotency.Response{Status: 200, Body: []byte(key)}, nil
				})
				switch {
				case out == idempotency.InFlight && errors.Is(err, idempotency.ErrInFlight):
				case err != nil:
					return fmt.Errorf("Do %q: %v, %w", key, out, err)
				case string(resp.Body) != key:
					return fmt.Errorf("Do %q (%v) answered %q", key, out, resp.Body)
				}
				return nil
			}
			const workers = 64
			var wg sync.WaitGroup
			// One key, three rounds.
			for round := range 3 {
				key := fmt.Sprintf("same-%d", round)
				for range workers {
					wg.Go(func() {
						if err := do(key); err != nil {
							t.Error(err)
						}
					})
				}
				wg.Wait()
			}
			// Many keys, each worker in an order of its own.
			const keys = 48
			for w := range workers {
				r := rand.New(rand.NewPCG(seed, uint64(w)))
				order := r.Perm(keys)
				wg.Go(func() {
					for _, k := range order[:keys/3] {
						if err := do(fmt.Sprintf("many-%d", k)); err != nil {
							t.Error(err)
						}
					}
				})
			}
			wg.Wait()
			for key, n := range runs {
				if n != 1 {
					t.Errorf("fn of %q ran %d times, want 1", key, n)
				}
			}
			t.Logf("%d keys run, %d statements retried", len(runs), s.retries.Load())
		})
	}
}
