package redisstore

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/testenv"
)

// benchClient is a client of IDEMPOTENCY_TEST_REDIS_URL with a pool large
// enough for 64 workers.
func benchClient(b *testing.B) *redis.Client {
	o, err := redis.ParseURL(testenv.RedisURL(b))
	if err != nil {
		b.Fatal(err)
	}
	o.PoolSize = 128
	o.MinIdleConns = 64
	return newClient(b, o)
}

// runWorkers runs b.N calls of op spread over workers goroutines.
func runWorkers(b *testing.B, workers int, op func(i int64) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var errOnce sync.Once
	var firstErr error
	b.ResetTimer()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := op(i); err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
}

// BenchmarkGuardDo measures Guard.Do of new requests (Begin and Complete)
// and of replays at 1, 8 and 64 workers, and reports the script calls per
// operation counted by the server (INFO commandstats; meaningful on a
// server nobody else uses, as scripts/bench-redis.sh arranges).
func BenchmarkGuardDo(b *testing.B) {
	c := benchClient(b)
	fn := func(context.Context) (idempotency.Response, error) {
		return idempotency.Response{Status: 200, Body: []byte(`{"ok":true}`)}, nil
	}
	for _, mode := range []string{"new", "replay"} {
		for _, workers := range []int{1, 8, 64} {
			b.Run(mode+"/workers="+strconv.Itoa(workers), func(b *testing.B) {
				s := newStore(b, c, Options{})
				g, err := idempotency.NewGuard(s, nil)
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				if _, _, err := g.Do(ctx, "replayed", "fp", fn); err != nil { // also loads the scripts
					b.Fatal(err)
				}
				before := commandCalls(b, c)
				runWorkers(b, workers, func(i int64) error {
					key := "replayed"
					want := idempotency.Replayed
					if mode == "new" {
						key = strconv.FormatInt(i, 10)
						want = idempotency.Executed
					}
					_, out, err := g.Do(ctx, key, "fp", fn)
					if err == nil && out != want {
						b.Errorf("Do(%s) = %v, want %v", key, out, want)
					}
					return err
				})
				d := delta(before, commandCalls(b, c))
				b.ReportMetric(float64(d["evalsha"]+d["eval"])/float64(b.N), "roundtrips/op")
			})
		}
	}
}
