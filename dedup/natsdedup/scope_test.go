package natsdedup_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/dedup"
	"github.com/archlab/idempotency/dedup/natsdedup"
	"github.com/nats-io/nats.go/jetstream"
)

// TestDefaultIDsAreScopedByStreamAndConsumer: one store, no Prefix, shared
// by two consumers of one stream (billing and mailer, each of which must
// process every message) and by a consumer of a second stream whose
// producer reuses a business id. JetStream scopes Nats-Msg-Id to a stream
// and gives every consumer every message; the window must not ack one
// consumer's message as processed because another consumer, or a message
// of another stream, used the same id. (Duplicates within one consumer are
// still dropped: TestExactlyOnceEffects.)
func TestDefaultIDsAreScopedByStreamAndConsumer(t *testing.T) {
	js, orders, ordersSubject := stream(t, 0)
	_, refunds, refundsSubject := stream(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	publish := func(subject, data string, opts ...jetstream.PublishOpt) {
		t.Helper()
		if _, err := js.Publish(ctx, subject, []byte(data), opts...); err != nil {
			t.Fatal(err)
		}
	}
	publish(ordersSubject, "order 42 placed", jetstream.WithMsgID("42"))
	publish(ordersSubject, "no id")
	publish(refundsSubject, "refund 42 issued", jetstream.WithMsgID("42"))

	w, err := dedup.New(idempotency.NewMemoryStore(), &dedup.Options{Lease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	runs := map[string]int{}
	h, err := natsdedup.New(w, func(_ context.Context, msg jetstream.Msg) error {
		md, err := msg.Metadata()
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		runs[fmt.Sprintf("%s %q", md.Consumer, msg.Data())]++
		return nil
	}, &natsdedup.Options{AckWait: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	consume := func(streamName, durable string, n int) {
		t.Helper()
		cons, err := js.CreateOrUpdateConsumer(ctx, streamName, jetstream.ConsumerConfig{
			Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		for range n {
			msg := fetchOne(t, cons)
			if d, err := h.Handle(ctx, msg); err != nil || d.Outcome != idempotency.Executed {
				t.Errorf("%s on %s, %q: %+v, %v; want Executed", durable, streamName, msg.Data(), d, err)
			}
		}
	}
	consume(orders, "billing", 2)
	consume(orders, "mailer", 2)
	consume(refunds, "billing", 1)

	mu.Lock()
	defer mu.Unlock()
	want := map[string]int{
		`billing "order 42 placed"`: 1, `billing "no id"`: 1, `billing "refund 42 issued"`: 1,
		`mailer "order 42 placed"`: 1, `mailer "no id"`: 1,
	}
	for k, n := range want {
		if runs[k] != n {
			t.Errorf("%s: ran %d times, want %d", k, runs[k], n)
		}
	}
}
