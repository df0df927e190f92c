package natsdedup_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/dedup"
	"github.com/archlab/idempotency/dedup/natsdedup"
	"github.com/archlab/idempotency/internal/testenv"
	"github.com/archlab/idempotency/redisstore"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
)

// stream creates a memory stream with a unique name and subject, deleted
// when the test ends.
func stream(t testing.TB, dupWindow time.Duration) (jetstream.JetStream, string, string) {
	t.Helper()
	nc, err := nats.Connect(testenv.NATSURL(t))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "DEDUP_" + strings.ToUpper(hex.EncodeToString(b[:]))
	subject := "dedup." + name
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: name, Subjects: []string{subject}, Storage: jetstream.MemoryStorage, Duplicates: dupWindow,
	}); err != nil {
		t.Fatalf("create stream: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, name); err != nil {
			t.Errorf("delete stream %s: %v", name, err)
		}
	})
	return js, name, subject
}

// ledger counts effects and deliveries per logical id.
type ledger struct {
	mu         sync.Mutex
	effects    map[string]int
	deliveries map[string]int
	outcomes   map[idempotency.Outcome]int
}

func newLedger() *ledger {
	return &ledger{effects: map[string]int{}, deliveries: map[string]int{}, outcomes: map[idempotency.Outcome]int{}}
}

func (l *ledger) effect(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.effects[id]++
}

func (l *ledger) delivered(id string, o idempotency.Outcome) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.deliveries[id]++
	l.outcomes[o]++
}

func (l *ledger) snapshot() (effects, deliveries map[string]int, outcomes map[idempotency.Outcome]int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	effects, deliveries, outcomes = map[string]int{}, map[string]int{}, map[idempotency.Outcome]int{}
	for k, v := range l.effects {
		effects[k] = v
	}
	for k, v := range l.deliveries {
		deliveries[k] = v
	}
	for k, v := range l.outcomes {
		outcomes[k] = v
	}
	return effects, deliveries, outcomes
}

// waitDrained waits until the consumer has nothing pending or unacked.
func waitDrained(t *testing.T, cons jetstream.Consumer, deadline time.Duration) {
	t.Helper()
	end := time.Now().Add(deadline)
	for time.Now().Before(end) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		info, err := cons.Info(ctx)
		cancel()
		if err == nil && info.NumPending == 0 && info.NumAckPending == 0 && info.NumWaiting >= 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("consumer not drained after %v", deadline)
}

// TestExactlyOnceEffects publishes N logical messages, some twice (one copy
// inside JetStream's duplicate window, dropped by the server, and one after
// it, stored), lets a consumer die holding a message, makes another message
// outlive AckWait, and runs two competing consumers on one durable. Every
// logical message's effect must happen exactly once.
//
// It runs on the MemoryStore and on Redis (redisstore), the store a fleet of
// consumers would share.
func TestExactlyOnceEffects(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		exactlyOnce(t, func(string) idempotency.Store { return idempotency.NewMemoryStore() })
	})
	t.Run("redis", func(t *testing.T) {
		opt, err := redis.ParseURL(testenv.RedisURL(t))
		if err != nil {
			t.Fatal(err)
		}
		client := redis.NewClient(opt)
		t.Cleanup(func() { _ = client.Close() })
		exactlyOnce(t, func(prefix string) idempotency.Store {
			s, err := redisstore.New(client, &redisstore.Options{Prefix: "idemtest:dedup:" + prefix + ":"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				keys, _ := client.Keys(ctx, "idemtest:dedup:"+prefix+":*").Result()
				if len(keys) > 0 {
					client.Del(ctx, keys...)
				}
			})
			return s
		})
	})
}

func exactlyOnce(t *testing.T, newStore func(prefix string) idempotency.Store) {
	const (
		n       = 30
		ackWait = time.Second
	)
	js, name, subject := stream(t, 100*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()

	id := func(i int) string { return fmt.Sprintf("order-%02d", i) }
	publish := func(i int) *jetstream.PubAck {
		ack, err := js.Publish(ctx, subject, []byte(id(i)), jetstream.WithMsgID(id(i)))
		if err != nil {
			t.Fatalf("publish %s: %v", id(i), err)
		}
		return ack
	}
	for i := range n {
		publish(i)
	}
	// Inside the server's duplicate window: dropped at publish.
	for i := range 3 {
		if ack := publish(i); !ack.Duplicate {
			t.Fatalf("publish-side dedup did not drop %s inside the window", id(i))
		}
	}
	// After the window: stored again, so consumers see them twice.
	time.Sleep(150 * time.Millisecond)
	stored := n
	for i := 0; i < n; i += 2 {
		if ack := publish(i); ack.Duplicate {
			t.Fatalf("%s dropped after the window; the test needs it stored twice", id(i))
		}
		stored++
	}

	cons, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{
		Durable: "workers", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxDeliver: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	store := newStore(name)
	led := newLedger()

	// A consumer that dies mid-message: it claims the message, never acks
	// and never finishes. Its window does not renew (a dead process
	// cannot), so its claim lapses after its lease.
	zombieWindow, err := dedup.New(store, &dedup.Options{Lease: 400 * time.Millisecond, RenewEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	victim := make(chan string, 1)
	unblock := make(chan struct{})
	zombie, err := natsdedup.New(zombieWindow, func(ctx context.Context, msg jetstream.Msg) error {
		select {
		case victim <- string(msg.Data()):
		default:
		}
		<-unblock
		return errors.New("killed") // no effect: it died before doing it
	}, &natsdedup.Options{AckWait: ackWait, Heartbeat: -1})
	if err != nil {
		t.Fatal(err)
	}
	zcc, err := cons.Consume(zombie.MessageHandler(context.Background()), jetstream.PullMaxMessages(1))
	if err != nil {
		t.Fatal(err)
	}
	var victimID string
	select {
	case victimID = <-victim:
	case <-ctx.Done():
		t.Fatal("zombie consumer got no message")
	}
	zcc.Stop()
	// Unblocked at the end only; its late answer is rejected by fencing.
	t.Cleanup(func() { close(unblock) })

	// Two live consumers on the same durable and the same window. Their
	// lease is short enough that a Nak's delay (the time left on it) keeps
	// the test fast; it is renewed while fn runs.
	w, err := dedup.New(store, &dedup.Options{Lease: ackWait})
	if err != nil {
		t.Fatal(err)
	}
	slowID := id(5)
	if slowID == victimID {
		slowID = id(7)
	}
	var slowOnce atomic.Bool
	work := func(ctx context.Context, msg jetstream.Msg) error {
		lid := string(msg.Data())
		if lid == slowID && slowOnce.CompareAndSwap(false, true) {
			// Outlive AckWait without InProgress: JetStream redelivers it
			// while it is processed.
			time.Sleep(ackWait + ackWait/2)
		}
		led.effect(lid)
		return nil
	}
	var handlerErrs atomic.Int32
	opts := &natsdedup.Options{AckWait: ackWait, Heartbeat: -1, OnDecision: func(msg jetstream.Msg, d dedup.Decision, err error) {
		led.delivered(string(msg.Data()), d.Outcome)
		if err != nil {
			handlerErrs.Add(1)
		}
	}}
	for range 2 {
		h, err := natsdedup.New(w, work, opts)
		if err != nil {
			t.Fatal(err)
		}
		cc, err := cons.Consume(h.MessageHandler(ctx), jetstream.PullMaxMessages(4))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cc.Stop)
	}
	waitDrained(t, cons, 20*time.Second)
	time.Sleep(100 * time.Millisecond) // let the last OnDecision calls land

	effects, deliveries, outcomes := led.snapshot()
	for i := range n {
		if effects[id(i)] != 1 {
			t.Errorf("%s: effect happened %d times, want exactly 1 (delivered %d times)", id(i), effects[id(i)], deliveries[id(i)])
		}
	}
	if len(effects) != n {
		t.Errorf("effects for %d ids, want %d", len(effects), n)
	}
	total := 0
	for _, d := range deliveries {
		total += d
	}
	if total < stored+1 {
		t.Errorf("live consumers got %d deliveries for %d stored messages; the test did not force redeliveries", total, stored)
	}
	if deliveries[slowID] < 2 {
		t.Errorf("slow message %s delivered %d times; AckWait did not expire during its processing", slowID, deliveries[slowID])
	}
	if outcomes[idempotency.Replayed] < stored-n {
		t.Errorf("%d duplicates dropped by the window, want at least the %d stored duplicates", outcomes[idempotency.Replayed], stored-n)
	}
	if handlerErrs.Load() != 0 {
		t.Errorf("%d deliveries ended with an error", handlerErrs.Load())
	}
	t.Logf("stored %d messages for %d ids; victim %s; deliveries %d; outcomes %v", stored, n, victimID, total, outcomes)
}

// TestHeartbeatHoldsOffRedelivery: fn runs for 2.5×AckWait; InProgress every
// AckWait/2 keeps JetStream from redelivering it.
func TestHeartbeatHoldsOffRedelivery(t *testing.T) {
	const ackWait = 800 * time.Millisecond
	ctx, cons := oneMessage(t, "slow", ackWait)
	w, err := dedup.New(idempotency.NewMemoryStore(), &dedup.Options{Lease: ackWait / 2})
	if err != nil {
		t.Fatal(err)
	}
	var deliveries, runs atomic.Int32
	h, err := natsdedup.New(w, func(ctx context.Context, msg jetstream.Msg) error {
		runs.Add(1)
		time.Sleep(ackWait*2 + ackWait/2)
		return nil
	}, &natsdedup.Options{AckWait: ackWait, OnDecision: func(jetstream.Msg, dedup.Decision, error) { deliveries.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(h.MessageHandler(ctx))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
	waitDrained(t, cons, 10*time.Second)
	time.Sleep(ackWait) // a redelivery, if any, would arrive by now
	if d, r := deliveries.Load(), runs.Load(); d != 1 || r != 1 {
		t.Errorf("delivered %d times, ran %d times; want 1 and 1 (InProgress should hold off redelivery)", d, r)
	}
}

// TestStreamSequenceFallback: without Nats-Msg-Id the id is the stream
// sequence (and the time the message was stored), scoped by the stream and
// the consumer (here "seq"), so two publishes of the same payload are two
// messages.
func TestStreamSequenceFallback(t *testing.T) {
	js, name, subject := stream(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for range 2 {
		if _, err := js.Publish(ctx, subject, []byte("same payload")); err != nil {
			t.Fatal(err)
		}
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{Durable: "seq", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	store := idempotency.NewMemoryStore()
	w, _ := dedup.New(store, nil)
	var runs atomic.Int32
	h, err := natsdedup.New(w, func(context.Context, jetstream.Msg) error { runs.Add(1); return nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(h.MessageHandler(ctx))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
	waitDrained(t, cons, 10*time.Second)
	if r := runs.Load(); r != 2 {
		t.Errorf("ran %d times, want 2", r)
	}
	keys := store.Keys(time.Now())
	want := []string{name + ".seq.seq.1.", name + ".seq.seq.2."}
	if len(keys) != 2 || !strings.HasPrefix(keys[0], want[0]) || !strings.HasPrefix(keys[1], want[1]) {
		t.Errorf("window keys %q, want them to start with %q", keys, want)
	}
}
