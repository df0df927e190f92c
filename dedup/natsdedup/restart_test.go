package natsdedup_test

import (
	"context"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/dedup"
	"github.com/archlab/idempotency/dedup/natsdedup"
	"github.com/nats-io/nats.go/jetstream"
)

// TestConsumerRecreated: a consumer processes a message, its ack is lost,
// and the consumer is made again (a restarted service binds to its
// durable, or creates its ephemeral consumer anew, which then delivers the
// stream from the start). The default ids are scoped by the consumer's
// name, so the message is replayed when the name is kept (a durable, or an
// ephemeral consumer given a Name) and runs again when the server names a
// new ephemeral consumer: the limit the package documentation states.
func TestConsumerRecreated(t *testing.T) {
	const ackWait = 500 * time.Millisecond
	for _, tc := range []struct {
		name string
		cfg  jetstream.ConsumerConfig
		want idempotency.Outcome
	}{
		{"durable", jetstream.ConsumerConfig{Durable: "workers"}, idempotency.Replayed},
		{"named ephemeral", jetstream.ConsumerConfig{Name: "workers", InactiveThreshold: time.Minute}, idempotency.Replayed},
		{"server-named ephemeral", jetstream.ConsumerConfig{InactiveThreshold: time.Minute}, idempotency.Executed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			js, name, subject := stream(t, 0)
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			if _, err := js.Publish(ctx, subject, []byte("order 9"), jetstream.WithMsgID("order-9")); err != nil {
				t.Fatal(err)
			}
			w, err := dedup.New(idempotency.NewMemoryStore(), &dedup.Options{Lease: ackWait / 2})
			if err != nil {
				t.Fatal(err)
			}
			runs := 0
			h, err := natsdedup.New(w, func(context.Context, jetstream.Msg) error { runs++; return nil }, &natsdedup.Options{AckWait: ackWait})
			if err != nil {
				t.Fatal(err)
			}
			cfg := tc.cfg
			cfg.AckPolicy, cfg.AckWait = jetstream.AckExplicitPolicy, ackWait
			consumer := func() jetstream.Consumer {
				t.Helper()
				c, err := js.CreateOrUpdateConsumer(ctx, name, cfg)
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			cons := consumer()
			if d, _ := h.Handle(ctx, lostAck{fetchOne(t, cons)}); d.Outcome != idempotency.Executed {
				t.Fatalf("first delivery: %+v, want Executed", d)
			}
			if tc.cfg.Durable == "" {
				// The ephemeral consumer goes with the process that made it.
				if err := js.DeleteConsumer(ctx, name, cons.CachedInfo().Name); err != nil {
					t.Fatal(err)
				}
			}
			cons = consumer()
			if d, err := h.Handle(ctx, fetchOne(t, cons)); err != nil || d.Outcome != tc.want || d.Action != dedup.Ack {
				t.Errorf("after the consumer was made again: %+v, %v; want %s and Ack", d, err, tc.want)
			}
		})
	}
}
