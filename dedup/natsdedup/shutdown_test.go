package natsdedup_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/dedup"
	"github.com/archlab/idempotency/dedup/natsdedup"
	"github.com/archlab/idempotency/internal/testenv"
	"github.com/archlab/idempotency/redisstore"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
)

// TestHandleAfterCancel: a message that reaches the Handler after its ctx
// was cancelled (a service shutting down, with messages still in the
// client's buffer) is Nak'ed without running fn and leaves no claim in the
// store, so that the redelivery is processed at once by whoever gets it.
func TestHandleAfterCancel(t *testing.T) {
	stores := map[string]func(t *testing.T) idempotency.Store{
		"memory": func(*testing.T) idempotency.Store { return idempotency.NewMemoryStore() },
		"redis": func(t *testing.T) idempotency.Store {
			opt, err := redis.ParseURL(testenv.RedisURL(t))
			if err != nil {
				t.Fatal(err)
			}
			client := redis.NewClient(opt)
			t.Cleanup(func() { _ = client.Close() })
			s, err := redisstore.New(client, &redisstore.Options{Prefix: testenv.Unique("idemtest:natsdedup:") + ":"})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	}
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			store := newStore(t)
			w, err := dedup.New(store, &dedup.Options{Lease: time.Second, UnavailableDelay: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			ran := false
			h, err := natsdedup.New(w, func(context.Context, jetstream.Msg) error { ran = true; return nil }, &natsdedup.Options{AckWait: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			m := withID("late")
			d, _ := h.Handle(ctx, m)
			if ran || d.Action != dedup.Nak || m.last() != "nak-delay" || m.delay != 2*time.Second {
				t.Errorf("ran %v, %+v, answers %v (delay %v); want fn not run, Nak after the UnavailableDelay", ran, d, m.got(), m.delay)
			}
			if _, err := store.Get(context.Background(), "S.C.id.late", time.Now()); !errors.Is(err, idempotency.ErrNotFound) {
				t.Errorf("store after the cancelled Handle: %v, want no record", err)
			}
		})
	}
}
