package natsdedup_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/dedup"
	"github.com/archlab/idempotency/dedup/natsdedup"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// signal sends sig to the running server.
func (s *natsServer) signal(sig syscall.Signal) {
	s.t.Helper()
	if s.cmd == nil || s.cmd.Process == nil {
		s.t.Fatalf("signal %v: nats-server is not running", sig)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("signal %v: %v", sig, err)
	}
}

// connectPrivate connects to a private server and keeps reconnecting to it
// for as long as the test runs.
func connectPrivate(t *testing.T, srv *natsServer) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(srv.url(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.PingInterval(500*time.Millisecond), nats.MaxPingsOutstanding(2))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// TestServerFaultsUnderLoad: a consumer works through a file stream while
// its nats-server is killed (SIGKILL) and started again, then paused
// (SIGSTOP) for longer than AckWait and resumed. The killed server forgets
// the acks it had not yet written and redelivers those messages, whose
// effect happened; the paused one finds answers and AckWait timers due at
// once when it resumes, while the client may have given up on the
// connection. Every message's effect must happen exactly once, and the
// consumer must end with nothing pending: no message acked unprocessed,
// none lost.
func TestServerFaultsUnderLoad(t *testing.T) {
	const (
		n       = 120
		ackWait = time.Second
	)
	srv := startNATSServer(t)
	_, js := connectPrivate(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "LOAD", Subjects: []string{"load"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	id := func(i int) string { return fmt.Sprintf("order-%03d", i) }
	for i := range n {
		if _, err := js.Publish(ctx, "load", []byte(id(i)), jetstream.WithMsgID(id(i))); err != nil {
			t.Fatal(err)
		}
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "LOAD", jetstream.ConsumerConfig{
		Durable: "workers", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxDeliver: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	w, err := dedup.New(idempotency.NewMemoryStore(), &dedup.Options{Lease: ackWait / 2})
	if err != nil {
		t.Fatal(err)
	}
	led := newLedger()
	var effects atomic.Int32
	h, err := natsdedup.New(w, func(ctx context.Context, msg jetstream.Msg) error {
		time.Sleep(10 * time.Millisecond)
		led.effect(string(msg.Data()))
		effects.Add(1)
		return nil
	}, &natsdedup.Options{Consumer: cons, OnDecision: func(msg jetstream.Msg, d dedup.Decision, _ error) {
		led.delivered(string(msg.Data()), d.Outcome)
	}})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(h.MessageHandler(ctx), jetstream.PullMaxMessages(20))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { cc.Stop(); <-cc.Closed() }()
	waitEffects := func(k int32) {
		t.Helper()
		for effects.Load() < k {
			if ctx.Err() != nil {
				t.Fatalf("%d effects, waiting for %d", effects.Load(), k)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	waitEffects(n / 4)
	srv.kill()
	time.Sleep(300 * time.Millisecond)
	srv.start()

	waitEffects(n / 2)
	srv.signal(syscall.SIGSTOP)
	time.Sleep(ackWait + ackWait/2)
	srv.signal(syscall.SIGCONT)

	// The consumer reports drained once its acks are in; a redelivery the
	// server sent before then is answered by now.
	waitDrainedCtx(t, ctx, cons)
	cc.Stop()
	<-cc.Closed()

	got, deliveries, outcomes := led.snapshot()
	for i := range n {
		if got[id(i)] != 1 {
			t.Errorf("%s: effect happened %d times, want 1 (delivered %d times)", id(i), got[id(i)], deliveries[id(i)])
		}
	}
	if len(got) != n {
		t.Errorf("effects for %d ids, want %d", len(got), n)
	}
	if outcomes[idempotency.Replayed] == 0 {
		// The killed server forgets the acks it had not yet written, and
		// redelivers those messages: without one, the test proved nothing.
		t.Errorf("no processed message was redelivered (outcomes %v): the faults were not felt", outcomes)
	}
	t.Logf("outcomes %v", outcomes)
}

// waitDrainedCtx waits until cons has nothing pending or unacked, or fails
// the test when ctx ends.
func waitDrainedCtx(t *testing.T, ctx context.Context, cons jetstream.Consumer) {
	t.Helper()
	for {
		ictx, cancel := context.WithTimeout(ctx, time.Second)
		info, err := cons.Info(ictx)
		cancel()
		if err == nil && info.NumPending == 0 && info.NumAckPending == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("consumer not drained: %+v, %v", info, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
