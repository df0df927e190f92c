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

// TestNewRefusesLeaseLongerThanAckWait: a Window whose lease outlasts the
// consumer's AckWait makes JetStream redeliver a dead consumer's message
// while its claim still blocks it. That redelivery is Nak'ed and spends a
// delivery: with MaxDeliver 2 the message is then never processed. New
// refuses the configuration instead.
func TestNewRefusesLeaseLongerThanAckWait(t *testing.T) {
	fn := func(context.Context, jetstream.Msg) error { return nil }
	for _, tc := range []struct {
		name    string
		lease   time.Duration
		opts    *natsdedup.Options
		refused bool
	}{
		{"defaults", 0, nil, false},
		{"lease equal to AckWait", time.Second, &natsdedup.Options{AckWait: time.Second}, false},
		{"lease shorter than AckWait", 400 * time.Millisecond, &natsdedup.Options{AckWait: time.Second}, false},
		{"default lease, short AckWait", 0, &natsdedup.Options{AckWait: 5 * time.Second}, true},
		{"lease longer than AckWait", 2 * time.Second, &natsdedup.Options{AckWait: time.Second}, true},
		{"lease longer than default AckWait", time.Minute, nil, true},
		{"no heartbeat, lease longer", 2 * time.Second, &natsdedup.Options{AckWait: time.Second, Heartbeat: -1}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := dedup.New(idempotency.NewMemoryStore(), &dedup.Options{Lease: tc.lease, Window: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			_, err = natsdedup.New(w, fn, tc.opts)
			if tc.refused && !errors.Is(err, idempotency.ErrInvalidConfig) {
				t.Errorf("New: %v, want ErrInvalidConfig (Lease %v > AckWait)", err, w.Lease())
			}
			if !tc.refused && err != nil {
				t.Errorf("New: %v, want accepted", err)
			}
		})
	}
}

// oneMessage publishes one message with a Nats-Msg-Id to a fresh stream and
// returns a durable AckExplicit consumer of it with the given AckWait and
// unlimited deliveries, and a context for the test.
func oneMessage(t *testing.T, durable string, ackWait time.Duration) (context.Context, jetstream.Consumer) {
	t.Helper()
	js, name, subject := stream(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	if _, err := js.Publish(ctx, subject, []byte(durable), jetstream.WithMsgID(durable+"-1")); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{
		Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxDeliver: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	return ctx, cons
}

// fetchOne pulls one message from cons, failing the test if none comes.
func fetchOne(t *testing.T, cons jetstream.Consumer) jetstream.Msg {
	t.Helper()
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		return m
	}
	t.Fatalf("no message: %v", batch.Error())
	return nil
}

// redelivered pulls without waiting: a message here was redelivered by
// JetStream (the stream holds no other).
func redelivered(t *testing.T, cons jetstream.Consumer) jetstream.Msg {
	t.Helper()
	batch, err := cons.FetchNoWait(1)
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		return m
	}
	return nil
}

// TestBufferedMessageIsNotRedeliveredWhileProcessed: a message that waited
// in the client before its handler started (Consume pulls messages ahead
// into a buffer) has had part of its AckWait run out already. The first
// InProgress must go out when fn starts, not Heartbeat later: here the
// message waits 0.8×AckWait, then fn works 1.2×AckWait, and JetStream must
// not redeliver it meanwhile.
func TestBufferedMessageIsNotRedeliveredWhileProcessed(t *testing.T) {
	const ackWait = time.Second
	ctx, cons := oneMessage(t, "buffered", ackWait)
	w, err := dedup.New(idempotency.NewMemoryStore(), &dedup.Options{Lease: ackWait / 2})
	if err != nil {
		t.Fatal(err)
	}
	var again jetstream.Msg
	h, err := natsdedup.New(w, func(context.Context, jetstream.Msg) error {
		time.Sleep(ackWait + ackWait/5) // the work
		again = redelivered(t, cons)
		return nil
	}, &natsdedup.Options{AckWait: ackWait})
	if err != nil {
		t.Fatal(err)
	}
	msg := fetchOne(t, cons)
	time.Sleep(ackWait * 4 / 5) // waiting in the client's buffer behind other messages
	if d, err := h.Handle(ctx, msg); err != nil || d.Outcome != idempotency.Executed {
		t.Fatalf("Handle: %+v, %v; want Executed", d, err)
	}
	if again != nil {
		md, _ := again.Metadata()
		t.Errorf("JetStream redelivered the message while fn ran (delivery %d): the first InProgress came too late", md.NumDelivered)
	}
}

// cachedConsumer is a jetstream.Consumer whose only method is CachedInfo.
type cachedConsumer struct {
	jetstream.Consumer // nil: other methods panic
	info               *jetstream.ConsumerInfo
}

func (c cachedConsumer) CachedInfo() *jetstream.ConsumerInfo { return c.info }

// TestNewReadsTheConsumersConfig: given the consumer, New takes its AckWait
// (or its shortest BackOff interval, which replaces AckWait for
// redeliveries) and refuses what the window cannot work with.
func TestNewReadsTheConsumersConfig(t *testing.T) {
	fn := func(context.Context, jetstream.Msg) error { return nil }
	consumer := func(cfg jetstream.ConsumerConfig) jetstream.Consumer {
		return cachedConsumer{info: &jetstream.ConsumerInfo{Name: "workers", Config: cfg}}
	}
	explicit := func(ackWait time.Duration, backOff ...time.Duration) jetstream.Consumer {
		return consumer(jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, BackOff: backOff})
	}
	for _, tc := range []struct {
		name    string
		lease   time.Duration
		opts    natsdedup.Options
		refused bool
	}{
		{"AckWait 1s, lease 1s", time.Second, natsdedup.Options{Consumer: explicit(time.Second)}, false},
		{"AckWait 1s, default lease", 0, natsdedup.Options{Consumer: explicit(time.Second)}, true},
		{"AckWait 30s, default lease", 0, natsdedup.Options{Consumer: explicit(30 * time.Second)}, false},
		{"BackOff shorter than lease", time.Second, natsdedup.Options{Consumer: explicit(5*time.Second, 500*time.Millisecond, 5*time.Second)}, true},
		{"BackOff", 500 * time.Millisecond, natsdedup.Options{Consumer: explicit(5*time.Second, 500*time.Millisecond, 5*time.Second)}, false},
		{"AckAll", time.Second, natsdedup.Options{Consumer: consumer(jetstream.ConsumerConfig{AckPolicy: jetstream.AckAllPolicy, AckWait: time.Minute})}, true},
		{"AckNone", time.Second, natsdedup.Options{Consumer: consumer(jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy, AckWait: time.Minute})}, true},
		{"no cached info", time.Second, natsdedup.Options{Consumer: cachedConsumer{}}, true},
		{"Consumer and AckWait", time.Second, natsdedup.Options{Consumer: explicit(time.Second), AckWait: time.Second}, true},
		{"Heartbeat not shorter than the consumer's AckWait", 100 * time.Millisecond, natsdedup.Options{Consumer: explicit(time.Second), Heartbeat: time.Second}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := dedup.New(idempotency.NewMemoryStore(), &dedup.Options{Lease: tc.lease, Window: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			_, err = natsdedup.New(w, fn, &tc.opts)
			if tc.refused && !errors.Is(err, idempotency.ErrInvalidConfig) {
				t.Errorf("New: %v, want ErrInvalidConfig", err)
			}
			if !tc.refused && err != nil {
				t.Errorf("New: %v, want accepted", err)
			}
		})
	}
}

// TestHeartbeatPacedByTheConsumersAckWait: a Handler given the consumer, and
// no AckWait, paces its heartbeat by the consumer's AckWait (1s here, not
// the 30s default), so a message processed for 2.5×AckWait is not
// redelivered meanwhile.
func TestHeartbeatPacedByTheConsumersAckWait(t *testing.T) {
	const ackWait = time.Second
	ctx, cons := oneMessage(t, "paced", ackWait)
	w, err := dedup.New(idempotency.NewMemoryStore(), &dedup.Options{Lease: ackWait / 2})
	if err != nil {
		t.Fatal(err)
	}
	var again jetstream.Msg
	h, err := natsdedup.New(w, func(context.Context, jetstream.Msg) error {
		time.Sleep(ackWait*2 + ackWait/2) // the work
		again = redelivered(t, cons)
		return nil
	}, &natsdedup.Options{Consumer: cons})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := h.Handle(ctx, fetchOne(t, cons)); err != nil || d.Outcome != idempotency.Executed {
		t.Fatalf("Handle: %+v, %v; want Executed", d, err)
	}
	if again != nil {
		t.Error("JetStream redelivered the message while fn ran: the heartbeat was not paced by the consumer's AckWait")
	}
	// The default lease (30s) outlasts this consumer's AckWait: refused.
	long, _ := dedup.New(idempotency.NewMemoryStore(), nil)
	if _, err := natsdedup.New(long, func(context.Context, jetstream.Msg) error { return nil }, &natsdedup.Options{Consumer: cons}); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("New with a 30s lease on a 1s AckWait consumer: %v, want ErrInvalidConfig", err)
	}
}
