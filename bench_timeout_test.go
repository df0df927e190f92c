package idempotency_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

// BenchmarkTimeout compares the two ways of bounding fn on a new key: a
// context.WithTimeout inside fn (what a handler does by itself) and
// Guard.Timeout, which the claim's renewal timer keeps. The caller's ctx
// is detached, as idemhttp's Detach and idemproxy make it.
//
//	go test -run '^$' -bench Timeout -benchmem -count 6 . | benchstat -col /bound -
func BenchmarkTimeout(b *testing.B) {
	resp := idempotency.Response{Status: 201}
	for _, tc := range []struct {
		name    string
		timeout time.Duration
		fn      func(context.Context) (idempotency.Response, error)
	}{
		{"bound=none", 0, func(context.Context) (idempotency.Response, error) { return resp, nil }},
		{"bound=WithTimeout", 0, func(ctx context.Context) (idempotency.Response, error) {
			ctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			_ = ctx.Done() // what an HTTP transport asks for
			return resp, nil
		}},
		{"bound=GuardTimeout", time.Minute, func(ctx context.Context) (idempotency.Response, error) {
			_ = ctx.Done()
			return resp, nil
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			g := &idempotency.Guard{Store: idempotency.NewMemoryStore(), Timeout: tc.timeout}
			ctx := context.WithoutCancel(context.Background())
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if _, _, err := g.Do(ctx, strconv.Itoa(i), "fp", tc.fn); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
