package natsdedup_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
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

// redisServer is a private redis-server on a free port, which a test may
// pause (SIGSTOP) and resume; the shared server is never touched.
type redisServer struct {
	t    *testing.T
	addr string
	cmd  *exec.Cmd
}

func startRedisServer(t *testing.T) *redisServer {
	t.Helper()
	bin := testenv.Binary(t, "redis-server")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir := t.TempDir()
	s := &redisServer{t: t, addr: fmt.Sprintf("127.0.0.1:%d", port)}
	s.cmd = exec.Command(bin, "--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no", "--protected-mode", "no")
	logf, err := os.Create(filepath.Join(dir, "redis.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.cmd.Process.Kill() // a stopped process dies of SIGKILL too
		_ = s.cmd.Wait()
	})
	c := redis.NewClient(&redis.Options{Addr: s.addr, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return s
		}
		if time.Now().After(end) {
			t.Fatalf("redis-server on %s did not start: %v", s.addr, err)
		}
	}
}

func (s *redisServer) signal(sig syscall.Signal) {
	s.t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("signal %v: %v", sig, err)
	}
}

// store returns a redisstore on the server whose calls give up after
// opTimeout.
func (s *redisServer) store(opTimeout time.Duration) *redisstore.Store {
	s.t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.addr, ContextTimeoutEnabled: true, DialTimeout: opTimeout})
	s.t.Cleanup(func() { _ = c.Close() })
	st, err := redisstore.New(c, &redisstore.Options{OpTimeout: opTimeout})
	if err != nil {
		s.t.Fatal(err)
	}
	return st
}

type decision struct {
	data string // the message's payload
	d    dedup.Decision
	err  error
}

// decisions records the Handler's answers.
type decisions struct {
	mu  sync.Mutex
	all []decision
}

func (r *decisions) add(msg jetstream.Msg, d dedup.Decision, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, decision{string(msg.Data()), d, err})
}

func (r *decisions) list() []decision {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]decision(nil), r.all...)
}

// TestStorePausedBeforeTheMessage: the window's Redis is paused (SIGSTOP)
// when a message comes. The Guard fails closed: every delivery while it is
// paused is Nak'ed, with an error wrapping ErrUnavailable, and fn does not
// run. Once Redis resumes (and executes whatever Begin it had in its
// socket, which may leave a claim nobody holds), the message is processed
// exactly once and acked.
func TestStorePausedBeforeTheMessage(t *testing.T) {
	const ackWait = time.Second
	rs := startRedisServer(t)
	w, err := dedup.New(rs.store(200*time.Millisecond), &dedup.Options{Lease: ackWait / 2, UnavailableDelay: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cons := oneMessage(t, "paused", ackWait)
	var runs atomic.Int32
	var rec decisions
	h, err := natsdedup.New(w, func(context.Context, jetstream.Msg) error { runs.Add(1); return nil },
		&natsdedup.Options{Consumer: cons, OnDecision: rec.add})
	if err != nil {
		t.Fatal(err)
	}
	rs.signal(syscall.SIGSTOP)
	paused := true
	defer func() {
		if paused {
			rs.signal(syscall.SIGCONT)
		}
	}()
	cc, err := cons.Consume(h.MessageHandler(ctx))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { cc.Stop(); <-cc.Closed() }()
	for len(rec.list()) < 3 {
		if ctx.Err() != nil {
			t.Fatalf("%d answers while the store was paused, want 3", len(rec.list()))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := runs.Load(); n != 0 {
		t.Fatalf("fn ran %d times while the store was paused", n)
	}
	rs.signal(syscall.SIGCONT)
	paused = false
	waitDrainedCtx(t, ctx, cons)
	cc.Stop()
	<-cc.Closed()
	if n := runs.Load(); n != 1 {
		t.Errorf("fn ran %d times, want 1", n)
	}
	acks := 0
	for i, a := range rec.list() {
		switch {
		case a.d.Action == dedup.Ack:
			acks++
			if a.d.Outcome != idempotency.Executed || a.err != nil {
				t.Errorf("answer %d: %+v, %v; want Executed without error", i, a.d, a.err)
			}
		case a.d.Action != dedup.Nak:
			t.Errorf("answer %d: %+v, %v; want Nak or Ack", i, a.d, a.err)
		case a.d.Outcome == idempotency.Unavailable && !errors.Is(a.err, idempotency.ErrUnavailable):
			t.Errorf("answer %d: %+v, %v; want an error wrapping ErrUnavailable", i, a.d, a.err)
		case a.d.Outcome != idempotency.Unavailable && a.d.Outcome != idempotency.InFlight:
			t.Errorf("answer %d: %+v, %v; want Unavailable, or InFlight behind a claim the paused Begin left", i, a.d, a.err)
		}
	}
	if acks != 1 {
		t.Errorf("%d acks, want 1: %+v", acks, rec.list())
	}
	for _, a := range rec.list() {
		t.Logf("%s %s %v: %v", a.d.Outcome, a.d.Action, a.d.Delay, a.err)
	}
}

// TestStorePausedWhileFnRuns: the window's Redis is paused while fn runs,
// so fn's success cannot be stored. On purpose, the message is acked (its
// effect happened; a Nak would have it run again at once) and the error,
// wrapping ErrUnavailable, is reported by Handle and to OnDecision.
func TestStorePausedWhileFnRuns(t *testing.T) {
	const ackWait = time.Second
	rs := startRedisServer(t)
	w, err := dedup.New(rs.store(200*time.Millisecond), &dedup.Options{Lease: ackWait / 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cons := oneMessage(t, "pausedfn", ackWait)
	var rec decisions
	h, err := natsdedup.New(w, func(context.Context, jetstream.Msg) error {
		rs.signal(syscall.SIGSTOP)
		return nil
	}, &natsdedup.Options{Consumer: cons, OnDecision: rec.add})
	if err != nil {
		t.Fatal(err)
	}
	d, err := h.Handle(ctx, fetchOne(t, cons))
	rs.signal(syscall.SIGCONT)
	if d.Action != dedup.Ack || d.Outcome != idempotency.Executed || !errors.Is(err, idempotency.ErrUnavailable) {
		t.Errorf("Handle: %+v, %v; want Executed, Ack and an error wrapping ErrUnavailable", d, err)
	}
	if got := rec.list(); len(got) != 1 || got[0].err == nil || got[0].err.Error() != fmt.Sprint(err) {
		t.Errorf("OnDecision got %+v, want the one answer with Handle's error %v", got, err)
	}
	waitDrainedCtx(t, ctx, cons)
}

// TestStorePausedPastTheLease: the window's Redis is paused while fn runs,
// for longer than the lease. The renewals fail, so fn's ctx ends before
// another consumer could take the message over; fn stops there with ctx's
// error, and the release fails too. The message is Nak'ed for at least the
// lease (its claim may stay that long), with an error wrapping
// ErrUnavailable, and processed when it comes again after the resume.
func TestStorePausedPastTheLease(t *testing.T) {
	const (
		ackWait = time.Second
		lease   = 600 * time.Millisecond
	)
	rs := startRedisServer(t)
	w, err := dedup.New(rs.store(200*time.Millisecond), &dedup.Options{Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cons := oneMessage(t, "pausedlease", ackWait)
	var runs, effects atomic.Int32
	h, err := natsdedup.New(w, func(ctx context.Context, _ jetstream.Msg) error {
		if runs.Add(1) > 1 {
			effects.Add(1)
			return nil
		}
		rs.signal(syscall.SIGSTOP)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Second):
			return errors.New("fn's ctx was not cancelled while the lease could not be renewed")
		}
	}, &natsdedup.Options{Consumer: cons})
	if err != nil {
		t.Fatal(err)
	}
	d, err := h.Handle(ctx, fetchOne(t, cons))
	rs.signal(syscall.SIGCONT)
	if d.Action != dedup.Nak || d.Outcome != idempotency.Executed || d.Delay < lease ||
		!errors.Is(err, context.Canceled) || !errors.Is(err, idempotency.ErrUnavailable) {
		t.Fatalf("Handle: %+v, %v; want Nak for at least the lease %v, with fn's ctx error and the release's", d, err, lease)
	}
	again := fetchOne(t, cons) // after the Nak's delay
	if d, err := h.Handle(ctx, again); err != nil || d.Outcome != idempotency.Executed || d.Action != dedup.Ack {
		t.Errorf("redelivery: %+v, %v; want Executed and Ack", d, err)
	}
	if r, e := runs.Load(), effects.Load(); r != 2 || e != 1 {
		t.Errorf("fn ran %d times with %d effects, want 2 and 1", r, e)
	}
	waitDrainedCtx(t, ctx, cons)
}
