package natsdedup_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/dedup"
	"github.com/archlab/idempotency/dedup/natsdedup"
	"github.com/nats-io/nats.go/jetstream"
)

// stampedMsg is a fakeMsg stored at a given time, as the ack subject of a
// real delivery says.
type stampedMsg struct {
	*fakeMsg
	stored time.Time
}

func (m stampedMsg) Metadata() (*jetstream.MsgMetadata, error) {
	md, err := m.fakeMsg.Metadata()
	if err != nil {
		return nil, err
	}
	md.Timestamp = m.stored
	return md, nil
}

// TestFallbackIDNamesOneStoredMessage: without Nats-Msg-Id, two messages
// that share a stream name and a sequence but were stored at different
// times (the stream was deleted and created again, or a second cluster or
// account has a stream of that name and shares the window's store) are
// two messages, while redeliveries of one stored message are one.
func TestFallbackIDNamesOneStoredMessage(t *testing.T) {
	w, err := dedup.New(idempotency.NewMemoryStore(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var runs int
	h, err := natsdedup.New(w, func(context.Context, jetstream.Msg) error { runs++; return nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	first := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		stored time.Time
		want   idempotency.Outcome
	}{
		{"first delivery", first, idempotency.Executed},
		{"redelivery of the same stored message", first, idempotency.Replayed},
		{"same stream and sequence, stored later", first.Add(time.Hour), idempotency.Executed},
	} {
		m := stampedMsg{withID(""), tc.stored}
		d, err := h.Handle(ctx, m)
		if err != nil || d.Outcome != tc.want || m.last() != "ack" {
			t.Errorf("%s: %+v, %v, answers %v; want %s and ack", tc.name, d, err, m.got(), tc.want)
		}
	}
	if runs != 2 {
		t.Errorf("fn ran %d times, want 2", runs)
	}
}

// TestRecreatedStreamIsProcessed runs the case above on the real server: a
// stream is deleted and created again under the same name, which starts its
// sequence at 1 again, while the consumers' window (a shared store) still
// remembers the old stream's messages. The new stream's messages must be
// processed, not acked as duplicates of the old ones, and a redelivery of
// one of them must still be dropped.
func TestRecreatedStreamIsProcessed(t *testing.T) {
	const ackWait = 500 * time.Millisecond
	js, name, subject := stream(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	store := idempotency.NewMemoryStore() // outlives the stream, as a Redis would
	w, err := dedup.New(store, &dedup.Options{Lease: ackWait / 2})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var processed []string
	h, err := natsdedup.New(w, func(_ context.Context, msg jetstream.Msg) error {
		mu.Lock()
		defer mu.Unlock()
		processed = append(processed, string(msg.Data()))
		return nil
	}, &natsdedup.Options{AckWait: ackWait})
	if err != nil {
		t.Fatal(err)
	}
	consumer := func() jetstream.Consumer {
		t.Helper()
		cons, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{
			Durable: "workers", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait,
		})
		if err != nil {
			t.Fatal(err)
		}
		return cons
	}
	handle := func(msg jetstream.Msg, want idempotency.Outcome) {
		t.Helper()
		d, err := h.Handle(ctx, msg)
		if err != nil || d.Outcome != want {
			t.Errorf("%q: %+v, %v; want %s", msg.Data(), d, err, want)
		}
	}

	if _, err := js.Publish(ctx, subject, []byte("old stream, message 1")); err != nil {
		t.Fatal(err)
	}
	handle(fetchOne(t, consumer()), idempotency.Executed)

	if err := js.DeleteStream(ctx, name); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: name, Subjects: []string{subject}, Storage: jetstream.MemoryStorage,
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, subject, []byte("new stream, message 1")); err != nil {
		t.Fatal(err)
	}
	cons := consumer()
	lost := fetchOne(t, cons) // its ack is lost: the consumer died before sending it
	again := fetchOne(t, cons)
	if md, _ := again.Metadata(); md == nil || md.NumDelivered != 2 {
		t.Fatalf("second fetch is not a redelivery: %+v", md)
	}
	handle(again, idempotency.Executed)
	handle(lost, idempotency.Replayed)

	mu.Lock()
	defer mu.Unlock()
	if len(processed) != 2 || processed[1] != "new stream, message 1" {
		t.Errorf("processed %q; want the new stream's message processed once", processed)
	}
	if keys := store.Keys(time.Now()); len(keys) != 2 {
		t.Errorf("window keys %q; want one per stored message", keys)
	}
}
