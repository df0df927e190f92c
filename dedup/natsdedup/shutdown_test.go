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

// beginHook calls began when Begin is called and after when it has
// answered.
type beginHook struct {
	idempotency.Store
	began, after func()
}

func (s beginHook) Begin(ctx context.Context, key, fingerprint string, now time.Time, lease, retention time.Duration) (idempotency.Record, bool, error) {
	if s.began != nil {
		s.began()
	}
	rec, ok, err := s.Store.Begin(ctx, key, fingerprint, now, lease, retention)
	if s.after != nil {
		s.after()
	}
	return rec, ok, err
}

// TestCancelDuringBeginClaimed: the shutdown's cancel lands while Begin is
// on its way and the store claims the message anyway (a call on the wire
// is not stopped by a cancel). The Guard does not start fn with its ctx
// already done: it releases the claim and answers Unavailable, so the
// message is Nak'ed after UnavailableDelay and the redelivery runs it.
func TestCancelDuringBeginClaimed(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store := idempotency.NewMemoryStore()
	w, err := dedup.New(beginHook{Store: store, after: cancel}, &dedup.Options{Lease: time.Second,
		RetryDelay: 20 * time.Millisecond, UnavailableDelay: 30 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var runs int
	h, err := natsdedup.New(w, func(ctx context.Context, _ jetstream.Msg) error {
		runs++
		return ctx.Err()
	}, &natsdedup.Options{AckWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	m := withID("cancelled")
	d, err := h.Handle(ctx, m)
	if runs != 0 || d.Action != dedup.Nak || d.Outcome != idempotency.Unavailable || !errors.Is(err, context.Canceled) ||
		m.last() != "nak-delay" || m.delay != 30*time.Millisecond {
		t.Fatalf("fn ran %d times; %+v, %v, answers %v (delay %v); want fn not run, Unavailable, Nak after UnavailableDelay",
			runs, d, err, m.got(), m.delay)
	}
	if rec, err := store.Get(context.Background(), "S.C.id.cancelled", time.Now()); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("store after the cancelled Handle: %+v, %v; want the claim released", rec, err)
	}
	again := withID("cancelled")
	if d, err := h.Handle(context.Background(), again); err != nil || d.Outcome != idempotency.Executed || again.last() != "ack" || runs != 1 {
		t.Errorf("redelivery: %+v, %v, answers %v, fn ran %d times; want Executed, acked, one run", d, err, again.got(), runs)
	}
}

// TestCancelDuringBeginLeavesClaim: the shutdown's cancel lands while Begin
// is on the wire to a Redis that does not answer (paused), which executes
// it later. Handle gives up at the store's OpTimeout (go-redis does not
// stop a call under way for a cancel) and Naks after UnavailableDelay
// without running fn, but the claim was made and nobody holds its token to
// release it: redeliveries inside its lease are Nak'ed as in flight, with
// the time left on it, and the message runs once the lease has ended.
func TestCancelDuringBeginLeavesClaim(t *testing.T) {
	const (
		ackWait = 2 * time.Second
		lease   = ackWait
	)
	rs := startRedisServer(t)
	store := rs.store(300 * time.Millisecond)
	// Loads the scripts: a first Begin would be sent as EVALSHA and be
	// refused (NOSCRIPT) when the server resumes.
	if _, _, err := store.Begin(context.Background(), "warm-up", "x", time.Now(), time.Second, time.Second); err != nil {
		t.Fatal(err)
	}
	began := make(chan struct{}, 1)
	w, err := dedup.New(beginHook{Store: store, began: func() {
		select {
		case began <- struct{}{}:
		default:
		}
	}}, &dedup.Options{Lease: lease, UnavailableDelay: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	tctx, cons := oneMessage(t, "cancelbegin", ackWait)
	var runs atomic.Int32
	var rec decisions
	h, err := natsdedup.New(w, func(context.Context, jetstream.Msg) error { runs.Add(1); return nil },
		&natsdedup.Options{Consumer: cons, OnDecision: rec.add})
	if err != nil {
		t.Fatal(err)
	}
	msg := fetchOne(t, cons)
	md, err := msg.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	id := md.Stream + "." + md.Consumer + ".id.cancelbegin-1"
	rs.signal(syscall.SIGSTOP)
	ctx, cancel := context.WithCancel(tctx)
	type result struct {
		d   dedup.Decision
		err error
	}
	done := make(chan result, 1)
	go func() {
		d, err := h.Handle(ctx, msg)
		done <- result{d, err}
	}()
	<-began
	time.Sleep(50 * time.Millisecond) // the Begin is on the wire
	cancel()
	r := <-done
	rs.signal(syscall.SIGCONT)
	if runs.Load() != 0 || r.d.Action != dedup.Nak || r.d.Outcome != idempotency.Unavailable || !errors.Is(r.err, idempotency.ErrUnavailable) {
		t.Fatalf("cancelled during Begin: fn ran %d times; %+v, %v; want Unavailable, Nak, fn not run", runs.Load(), r.d, r.err)
	}
	// The resumed server runs the Begin it had been sent; a Get sent at the
	// same moment may be answered before it.
	var got idempotency.Record
	for end := time.Now().Add(time.Second); ; time.Sleep(10 * time.Millisecond) {
		got, err = store.Get(tctx, id, time.Now())
		if err == nil && got.State == idempotency.Processing {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("store after the resume: %+v, %v; want the claim the cancelled Begin made", got, err)
		}
	}

	cc, err := cons.Consume(h.MessageHandler(tctx))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { cc.Stop(); <-cc.Closed() }()
	waitDrainedCtx(t, tctx, cons)
	cc.Stop()
	<-cc.Closed()
	if n := runs.Load(); n != 1 {
		t.Errorf("fn ran %d times, want 1", n)
	}
	all := rec.list()
	inFlight := 0
	for _, a := range all[1:] {
		if a.d.Outcome == idempotency.InFlight {
			inFlight++
			if a.d.Action != dedup.Nak || a.d.Delay <= 0 || a.d.Delay > lease {
				t.Errorf("redelivery behind the claim: %+v; want Nak with the time left on the lease", a.d)
			}
		}
	}
	if last := all[len(all)-1]; inFlight == 0 || last.d.Outcome != idempotency.Executed || last.d.Action != dedup.Ack {
		t.Errorf("answers %+v; want redeliveries Nak'ed as in flight, then Executed and Ack", all)
	}
}
