package natsdedup_test

import (
	"context"
	"errors"
	"sync/atomic"
	"syscall"
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

// windowStores are the stores the shutdown claims name: the MemoryStore and
// one that goes over the network (Redis).
var windowStores = map[string]func(t *testing.T) idempotency.Store{
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

// TestCancelWhileFnRuns: cancelling the ctx given to the Handler cancels
// fn's ctx; a fn that returns its error is Nak'ed after the Window's
// RetryDelay with its claim released, so that JetStream's redelivery is
// processed at once.
func TestCancelWhileFnRuns(t *testing.T) {
	const ackWait = time.Second
	for name, newStore := range windowStores {
		t.Run(name, func(t *testing.T) {
			tctx, cons := oneMessage(t, "cancelfn", ackWait)
			store := newStore(t)
			w, err := dedup.New(store, &dedup.Options{Lease: ackWait, RetryDelay: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(tctx)
			defer cancel()
			var runs atomic.Int32
			h, err := natsdedup.New(w, func(fctx context.Context, _ jetstream.Msg) error {
				if runs.Add(1) > 1 {
					return nil
				}
				cancel() // the service shuts down while fn works
				select {
				case <-fctx.Done():
					return fctx.Err()
				case <-time.After(5 * time.Second):
					return errors.New("fn's ctx was not cancelled with the Handler's")
				}
			}, &natsdedup.Options{Consumer: cons})
			if err != nil {
				t.Fatal(err)
			}
			msg := fetchOne(t, cons)
			md, err := msg.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			d, err := h.Handle(ctx, msg)
			if d.Action != dedup.Nak || d.Outcome != idempotency.Executed || d.Delay != 50*time.Millisecond || !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled fn: %+v, %v; want Nak after RetryDelay with ctx's error", d, err)
			}
			key := md.Stream + "." + md.Consumer + ".id.cancelfn-1"
			if rec, err := store.Get(tctx, key, time.Now()); !errors.Is(err, idempotency.ErrNotFound) {
				t.Errorf("store after the cancel: %+v, %v; want the claim released", rec, err)
			}
			again := fetchOne(t, cons) // the Nak's redelivery, well before AckWait
			if md, _ := again.Metadata(); md == nil || md.NumDelivered != 2 {
				t.Fatalf("not a redelivery: %+v", md)
			}
			if d, err := h.Handle(tctx, again); err != nil || d.Outcome != idempotency.Executed || d.Action != dedup.Ack {
				t.Errorf("redelivery: %+v, %v; want Executed and Ack", d, err)
			}
			waitDrained(t, cons, 5*time.Second)
		})
	}
}

// TestHandleAfterCancelIsUnavailable: a message handled after the Handler's
// ctx was cancelled gets outcome Unavailable and an error wrapping
// ErrUnavailable, as the package documentation says.
func TestHandleAfterCancelIsUnavailable(t *testing.T) {
	for name, newStore := range windowStores {
		t.Run(name, func(t *testing.T) {
			w, err := dedup.New(newStore(t), &dedup.Options{Lease: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			h, err := natsdedup.New(w, func(context.Context, jetstream.Msg) error { t.Error("fn ran"); return nil }, &natsdedup.Options{AckWait: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			m := withID("late")
			d, err := h.Handle(ctx, m)
			if d.Outcome != idempotency.Unavailable || !errors.Is(err, idempotency.ErrUnavailable) || m.last() != "nak-delay" || m.delay != time.Second {
				t.Errorf("%+v, %v, answers %v (delay %v); want Unavailable, ErrUnavailable, Nak after the default 1s", d, err, m.got(), m.delay)
			}
		})
	}
}

// TestFnPanics: a panic in fn releases the key and sends nothing to the
// broker, then goes on up; JetStream redelivers the message after AckWait
// (the heartbeat has stopped), and the redelivery runs fn at once.
func TestFnPanics(t *testing.T) {
	const ackWait = time.Second
	ctx, cons := oneMessage(t, "panics", ackWait)
	store := idempotency.NewMemoryStore()
	w, err := dedup.New(store, &dedup.Options{Lease: ackWait / 2})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	h, err := natsdedup.New(w, func(context.Context, jetstream.Msg) error {
		if runs.Add(1) == 1 {
			panic("handler bug")
		}
		return nil
	}, &natsdedup.Options{Consumer: cons})
	if err != nil {
		t.Fatal(err)
	}
	msg := fetchOne(t, cons)
	md, err := msg.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	answered := &answerSpy{Msg: msg}
	func() {
		defer func() {
			if p := recover(); p != "handler bug" {
				t.Errorf("recovered %v, want fn's panic to go on up", p)
			}
		}()
		_, _ = h.Handle(ctx, answered)
	}()
	if a := answered.answers.Load(); a != 0 {
		t.Errorf("%d answers sent to the broker after the panic, want none", a)
	}
	if rec, err := store.Get(ctx, md.Stream+"."+md.Consumer+".id.panics-1", time.Now()); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("store after the panic: %+v, %v; want the key released", rec, err)
	}
	again := fetchOne(t, cons) // after AckWait
	if md, _ := again.Metadata(); md == nil || md.NumDelivered != 2 {
		t.Fatalf("not a redelivery: %+v", md)
	}
	if d, err := h.Handle(ctx, again); err != nil || d.Outcome != idempotency.Executed || d.Action != dedup.Ack {
		t.Errorf("redelivery: %+v, %v; want Executed and Ack", d, err)
	}
	waitDrained(t, cons, 5*time.Second)
}

// answerSpy counts the final answers (not InProgress) sent for a message.
type answerSpy struct {
	jetstream.Msg
	answers atomic.Int32
}

func (m *answerSpy) Ack() error { m.answers.Add(1); return m.Msg.Ack() }
func (m *answerSpy) DoubleAck(ctx context.Context) error {
	m.answers.Add(1)
	return m.Msg.DoubleAck(ctx)
}
func (m *answerSpy) Nak() error  { m.answers.Add(1); return m.Msg.Nak() }
func (m *answerSpy) Term() error { m.answers.Add(1); return m.Msg.Term() }
func (m *answerSpy) NakWithDelay(d time.Duration) error {
	m.answers.Add(1)
	return m.Msg.NakWithDelay(d)
}

// TestNakWithoutDelay: a failed message with RetryDelay 0 is Nak'ed
// plainly (redelivered at once), not with a zero delay.
func TestNakWithoutDelay(t *testing.T) {
	w, err := dedup.New(idempotency.NewMemoryStore(), &dedup.Options{Lease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	h, err := natsdedup.New(w, func(context.Context, jetstream.Msg) error { return boom }, &natsdedup.Options{AckWait: time.Second, Heartbeat: -1})
	if err != nil {
		t.Fatal(err)
	}
	m := withID("m1")
	if d, err := h.Handle(context.Background(), m); !errors.Is(err, boom) || d.Action != dedup.Nak || len(m.got()) != 1 || m.last() != "nak" {
		t.Errorf("%+v, %v, answers %v; want one plain nak", d, err, m.got())
	}
}

// TestDoubleAckReportsUnconfirmedAck: with DoubleAck, an Ack the server does
// not confirm (here it is paused, SIGSTOP, as fn finishes) is reported in
// Handle's error, where a plain Ack would report nothing. Whether or not
// the server applied it once it resumes, the message is not run again: a
// redelivery is replayed.
func TestDoubleAckReportsUnconfirmedAck(t *testing.T) {
	const ackWait = time.Second
	srv := startNATSServer(t)
	nc, _ := connectPrivate(t, srv)
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "DOUBLE", Subjects: []string{"double"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "double", []byte("charge order 8"), jetstream.WithMsgID("order-8")); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "DOUBLE", jetstream.ConsumerConfig{
		Durable: "workers", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxDeliver: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	w, err := dedup.New(idempotency.NewMemoryStore(), &dedup.Options{Lease: ackWait / 2})
	if err != nil {
		t.Fatal(err)
	}
	paused := false
	defer func() {
		if paused {
			srv.signal(syscall.SIGCONT)
		}
	}()
	var runs atomic.Int32
	h, err := natsdedup.New(w, func(context.Context, jetstream.Msg) error {
		if runs.Add(1) == 1 {
			srv.signal(syscall.SIGSTOP) // the effect is done; the server stops answering
			paused = true
		}
		return nil
	}, &natsdedup.Options{Consumer: cons, DoubleAck: true})
	if err != nil {
		t.Fatal(err)
	}
	d, err := h.Handle(ctx, fetchOne(t, cons))
	srv.signal(syscall.SIGCONT)
	paused = false
	if d.Action != dedup.Ack || d.Outcome != idempotency.Executed || err == nil {
		t.Fatalf("Handle with the server paused: %+v, %v; want Executed, Ack, and the unconfirmed ack reported", d, err)
	}
	// The ack may have been applied when the server resumed; if not, the
	// redelivery after AckWait must be replayed.
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(2*ackWait))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		if d, err := h.Handle(ctx, m); err != nil || d.Outcome != idempotency.Replayed || d.Action != dedup.Ack {
			t.Errorf("redelivery: %+v, %v; want Replayed and acked", d, err)
		}
	}
	waitDrainedCtx(t, ctx, cons)
	if n := runs.Load(); n != 1 {
		t.Errorf("fn ran %d times, want 1", n)
	}
}

// slowComplete is a store whose Complete calls during first, then answers.
type slowComplete struct {
	idempotency.Store
	during func()
}

func (s slowComplete) Complete(ctx context.Context, key string, token uint64, resp idempotency.Response, now time.Time, retention time.Duration) error {
	s.during()
	return s.Store.Complete(ctx, key, token, resp, now, retention)
}

// TestHeartbeatCoversStoringTheResult: the InProgress signals go on after
// fn returns, while its result is stored, so that a slow store does not
// let AckWait run out before the Ack.
func TestHeartbeatCoversStoringTheResult(t *testing.T) {
	m := withID("slow-store")
	var atReturn int
	inProgress := func() int {
		n := 0
		for _, a := range m.got() {
			if a == "in-progress" {
				n++
			}
		}
		return n
	}
	store := slowComplete{Store: idempotency.NewMemoryStore(), during: func() {
		// Wait (bounded) for a signal sent while the result is stored.
		for end := time.Now().Add(5 * time.Second); inProgress() <= atReturn && time.Now().Before(end); {
			time.Sleep(5 * time.Millisecond)
		}
	}}
	w, err := dedup.New(store, &dedup.Options{Lease: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	h, err := natsdedup.New(w, func(context.Context, jetstream.Msg) error {
		atReturn = inProgress()
		return nil
	}, &natsdedup.Options{AckWait: 100 * time.Millisecond, Heartbeat: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Handle(context.Background(), m); err != nil || m.last() != "ack" {
		t.Fatalf("%v, answers %v; want ack", err, m.got())
	}
	if n := inProgress(); n <= atReturn {
		t.Errorf("%d InProgress signals, %d of them by the time fn returned: none while the result was stored", n, atReturn)
	}
}
