package natsdedup_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/dedup"
	"github.com/archlab/idempotency/dedup/natsdedup"
	"github.com/nats-io/nats.go/jetstream"
)

// TestLastDeliveryNakIsReported: a poison message (fn fails every time) on
// a consumer with MaxDeliver 2. Its first failure is Nak'ed and redelivered;
// its second is Nak'ed too, but JetStream will not deliver it again, so the
// Handler must say that this Nak drops the message instead of returning
// fn's error alone, as for a failure that will be retried.
func TestLastDeliveryNakIsReported(t *testing.T) {
	const ackWait = time.Second
	js, name, subject := stream(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if _, err := js.Publish(ctx, subject, []byte("poison"), jetstream.WithMsgID("poison-1")); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{
		Durable: "poison", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxDeliver: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	w, err := dedup.New(idempotency.NewMemoryStore(), &dedup.Options{Lease: ackWait / 2})
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("cannot parse the payload")
	h, err := natsdedup.New(w, func(context.Context, jetstream.Msg) error { return boom }, &natsdedup.Options{Consumer: cons})
	if err != nil {
		t.Fatal(err)
	}
	d, err := h.Handle(ctx, fetchOne(t, cons))
	if d.Action != dedup.Nak || !errors.Is(err, boom) || errors.Is(err, natsdedup.ErrMaxDeliveries) {
		t.Errorf("delivery 1 of 2: %+v, %v; want Nak with fn's error only (it will be redelivered)", d, err)
	}
	d, err = h.Handle(ctx, fetchOne(t, cons))
	if d.Action != dedup.Nak || !errors.Is(err, boom) || !errors.Is(err, natsdedup.ErrMaxDeliveries) {
		t.Errorf("delivery 2 of 2: %+v, %v; want Nak with fn's error and ErrMaxDeliveries", d, err)
	}
	// What the error says is so: the Nak brings no third delivery.
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(ackWait+ackWait/2))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		md, _ := m.Metadata()
		t.Errorf("delivered again after the last Nak (delivery %d)", md.NumDelivered)
	}
}
