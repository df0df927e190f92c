package natsdedup_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/dedup"
	"github.com/archlab/idempotency/dedup/natsdedup"
	"github.com/nats-io/nats.go/jetstream"
)

// BenchmarkConsume measures messages per second consumed from a JetStream
// stream on the test server, acked by a plain handler against the window's
// handler on a MemoryStore. Publishing is not timed.
func BenchmarkConsume(b *testing.B) {
	for _, guarded := range []bool{false, true} {
		name := "Plain"
		if guarded {
			name = "Window"
		}
		b.Run(name, func(b *testing.B) {
			benchConsume(b, guarded)
		})
	}
}

func benchConsume(b *testing.B, guarded bool) {
	js, name, subject := stream(b, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	n := b.N
	for i := range n {
		if _, err := js.PublishAsync(subject, []byte("m"), jetstream.WithMsgID(strconv.Itoa(i))); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		b.Fatal("publish timed out")
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		b.Fatal(err)
	}
	var done atomic.Int64
	all := make(chan struct{})
	count := func() {
		if done.Add(1) == int64(n) {
			close(all)
		}
	}
	handler := func(msg jetstream.Msg) { _ = msg.Ack(); count() }
	if guarded {
		w, _ := dedup.New(idempotency.NewMemoryStore(), nil)
		h, err := natsdedup.New(w, func(context.Context, jetstream.Msg) error { return nil }, nil)
		if err != nil {
			b.Fatal(err)
		}
		handler = func(msg jetstream.Msg) {
			if _, err := h.Handle(ctx, msg); err != nil {
				b.Error(err)
			}
			count()
		}
	}
	b.ResetTimer()
	cc, err := cons.Consume(handler)
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Stop()
	select {
	case <-all:
	case <-ctx.Done():
		b.Fatal("consume timed out")
	}
	b.StopTimer()
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "msgs/s")
}
