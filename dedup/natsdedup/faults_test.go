package natsdedup_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/dedup"
	"github.com/archlab/idempotency/dedup/natsdedup"
	"github.com/archlab/idempotency/internal/testenv"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// lostAck is a delivery whose Ack never reaches the server, as when the
// connection drops between storing the result and acking.
type lostAck struct{ jetstream.Msg }

func (lostAck) Ack() error { return errors.New("connection lost before the ack went out") }

// TestUnfinishedMessageIsRedelivered: a message whose work is not done when
// it is answered (fn failed; the store was down, so fn did not run) comes
// back from JetStream and is then processed; one whose result was stored
// but whose ack was lost comes back and is acked without running fn again.
func TestUnfinishedMessageIsRedelivered(t *testing.T) {
	const ackWait = 500 * time.Millisecond
	for _, tc := range []struct {
		name      string
		storeDown bool // for the first delivery
		fnFails   bool // on the first delivery
		lostAck   bool // of the first delivery
		first     idempotency.Outcome
		again     idempotency.Outcome
		runs      int32
	}{
		{name: "fn failed", fnFails: true, first: idempotency.Executed, again: idempotency.Executed, runs: 2},
		{name: "store down", storeDown: true, first: idempotency.Unavailable, again: idempotency.Executed, runs: 1},
		{name: "ack lost after the result was stored", lostAck: true, first: idempotency.Executed, again: idempotency.Replayed, runs: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cons := oneMessage(t, "unfinished", ackWait)
			store := idempotency.NewMemoryStore()
			var down atomic.Bool
			down.Store(tc.storeDown)
			store.Fault = func(string) error {
				if down.Load() {
					return errors.New("connection refused")
				}
				return nil
			}
			w, err := dedup.New(store, &dedup.Options{Lease: ackWait / 2, UnavailableDelay: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			var runs atomic.Int32
			h, err := natsdedup.New(w, func(context.Context, jetstream.Msg) error {
				if runs.Add(1) == 1 && tc.fnFails {
					return errors.New("downstream refused")
				}
				return nil
			}, &natsdedup.Options{Consumer: cons})
			if err != nil {
				t.Fatal(err)
			}
			var msg jetstream.Msg = fetchOne(t, cons)
			if tc.lostAck {
				msg = lostAck{msg}
			}
			d, err := h.Handle(ctx, msg)
			if d.Outcome != tc.first || err == nil {
				t.Fatalf("first delivery: %+v, %v; want %s with an error", d, err, tc.first)
			}
			down.Store(false)
			again := fetchOne(t, cons) // waits for the redelivery
			if md, _ := again.Metadata(); md == nil || md.NumDelivered != 2 {
				t.Fatalf("second message is not a redelivery: %+v", md)
			}
			if d, err := h.Handle(ctx, again); err != nil || d.Outcome != tc.again || d.Action != dedup.Ack {
				t.Errorf("redelivery: %+v, %v; want %s and Ack", d, err, tc.again)
			}
			if n := runs.Load(); n != tc.runs {
				t.Errorf("fn ran %d times, want %d", n, tc.runs)
			}
			waitDrained(t, cons, 5*time.Second)
		})
	}
}

// natsServer is a private nats-server with JetStream on a free port,
// which a test may kill and start again on the same port and store.
type natsServer struct {
	t    *testing.T
	bin  string
	port int
	dir  string
	cmd  *exec.Cmd
}

func startNATSServer(t *testing.T) *natsServer {
	t.Helper()
	s := &natsServer{t: t, bin: testenv.Binary(t, "nats-server"), dir: t.TempDir()}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.port = l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	// Before start, which may fail the test with the server running.
	t.Cleanup(s.kill)
	s.start()
	return s
}

func (s *natsServer) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.port) }

func (s *natsServer) start() {
	s.t.Helper()
	s.cmd = exec.Command(s.bin, "-js", "-a", "127.0.0.1", "-p", fmt.Sprint(s.port), "-sd", s.dir)
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("starting nats-server: %v", err)
	}
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", s.port)); err == nil {
			_ = c.Close()
			return
		}
	}
	s.t.Fatalf("nats-server did not listen on %d", s.port)
}

// kill ends the server at once (SIGKILL), as a crash would.
func (s *natsServer) kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.cmd = nil
	}
}

// TestServerCrashBeforeAck: the NATS server dies while fn runs, so the
// Handler stores the result but cannot ack. The message must survive the
// crash (a durable consumer of a file stream), come back when the server
// is up again, and be acked as a replay: fn ran once.
func TestServerCrashBeforeAck(t *testing.T) {
	srv := startNATSServer(t)
	nc, err := nats.Connect(srv.url(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.ReconnectBufSize(-1)) // nothing sent while disconnected is kept for later
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "CRASH", Subjects: []string{"crash"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "crash", []byte("charge order 7"), jetstream.WithMsgID("order-7")); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "CRASH", jetstream.ConsumerConfig{
		Durable: "workers", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second, MaxDeliver: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	w, err := dedup.New(idempotency.NewMemoryStore(), &dedup.Options{Lease: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	type answer struct {
		d   dedup.Decision
		err error
	}
	answers := make(chan answer, 16)
	var runs atomic.Int32
	h, err := natsdedup.New(w, func(context.Context, jetstream.Msg) error {
		if runs.Add(1) == 1 {
			// The effect happens, then the server is gone, and the client
			// knows it before the ack (which could otherwise sit in its
			// write buffer and be lost unreported).
			srv.kill()
			for end := time.Now().Add(5 * time.Second); nc.IsConnected() && time.Now().Before(end); {
				time.Sleep(10 * time.Millisecond)
			}
		}
		return nil
	}, &natsdedup.Options{Consumer: cons, OnDecision: func(_ jetstream.Msg, d dedup.Decision, err error) {
		answers <- answer{d, err}
	}})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(h.MessageHandler(ctx))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { cc.Stop(); <-cc.Closed() }()
	next := func() answer {
		t.Helper()
		select {
		case a := <-answers:
			return a
		case <-ctx.Done():
			t.Fatal("no answer")
			return answer{}
		}
	}
	if a := next(); a.d.Outcome != idempotency.Executed || a.d.Action != dedup.Ack || a.err == nil {
		t.Fatalf("delivery before the crash: %+v, %v; want Executed, Ack failing", a.d, a.err)
	}
	srv.start()
	if a := next(); a.d.Outcome != idempotency.Replayed || a.d.Action != dedup.Ack || a.err != nil {
		t.Errorf("delivery after the restart: %+v, %v; want Replayed and acked", a.d, a.err)
	}
	waitDrained(t, cons, 10*time.Second)
	if n := runs.Load(); n != 1 {
		t.Errorf("fn ran %d times, want 1", n)
	}
}
