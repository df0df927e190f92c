package idempotency

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// Benchmarks of the pieces of Guard.Do's replay path, to see where its time
// goes (scripts/bench-core.sh compares the whole against the seed).

var (
	perfSinkRec Record
)

func perfStore(b *testing.B, n int) (*MemoryStore, []string, time.Time) {
	s := NewMemoryStore()
	keys := make([]string, n)
	now := time.Now()
	ctx := context.Background()
	for i := range keys {
		keys[i] = "order-" + strconv.Itoa(i)
		rec, ok, err := s.Begin(ctx, keys[i], "fp", now, time.Minute, time.Hour)
		if err != nil || !ok {
			b.Fatal(ok, err)
		}
		if err := s.Complete(ctx, keys[i], rec.Token, Response{Status: 201, Body: []byte(`{"order":"o","charged":1299}`)}, now, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	return s, keys, now
}

func BenchmarkPerfStoreReplay(b *testing.B) {
	s, keys, now := perfStore(b, 1024)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		rec, ok, err := s.Begin(ctx, keys[i%len(keys)], "fp", now, time.Minute, time.Hour)
		if err != nil || ok || rec.State != Done {
			b.Fatal(rec.State, ok, err)
		}
		perfSinkRec = rec
	}
}

func BenchmarkPerfGuardReplay(b *testing.B) {
	s, keys, now := perfStore(b, 1024)
	g := &Guard{Store: s, Lease: time.Minute, Retention: time.Hour, Now: func() time.Time { return now }}
	ctx := context.Background()
	fn := func(context.Context) (Response, error) { return Response{}, nil }
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, out, err := g.Do(ctx, keys[i%len(keys)], "fp", fn); err != nil || out != Replayed {
			b.Fatal(out, err)
		}
	}
}
