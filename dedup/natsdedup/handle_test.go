package natsdedup_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/dedup"
	"github.com/archlab/idempotency/dedup/natsdedup"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// fakeMsg records how a message was answered, without a server.
type fakeMsg struct {
	jetstream.Msg // nil: methods not overridden panic
	hdr           nats.Header
	seq           uint64

	mu      sync.Mutex
	answers []string
	delay   time.Duration
}

func (m *fakeMsg) Headers() nats.Header { return m.hdr }
func (m *fakeMsg) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{Stream: "S", Consumer: "C", Sequence: jetstream.SequencePair{Stream: m.seq}, Timestamp: time.Unix(1767225600, 0)}, nil
}
func (m *fakeMsg) answer(a string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.answers = append(m.answers, a)
	return nil
}
func (m *fakeMsg) Ack() error                         { return m.answer("ack") }
func (m *fakeMsg) DoubleAck(context.Context) error    { return m.answer("double-ack") }
func (m *fakeMsg) Nak() error                         { return m.answer("nak") }
func (m *fakeMsg) Term() error                        { return m.answer("term") }
func (m *fakeMsg) InProgress() error                  { return m.answer("in-progress") }
func (m *fakeMsg) NakWithDelay(d time.Duration) error { m.delay = d; return m.answer("nak-delay") }

func (m *fakeMsg) got() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.answers...)
}

// answer returns the message's last answer: InProgress signals of fn's
// heartbeat come before it.
func (m *fakeMsg) last() string {
	got := m.got()
	if len(got) == 0 {
		return ""
	}
	return got[len(got)-1]
}

func withID(id string) *fakeMsg {
	h := nats.Header{}
	if id != "" {
		h.Set(jetstream.MsgIDHeader, id)
	}
	return &fakeMsg{hdr: h, seq: 7}
}

func TestHandleAnswers(t *testing.T) {
	store := idempotency.NewMemoryStore()
	w, err := dedup.New(store, &dedup.Options{RetryDelay: 2 * time.Second, Lease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	var fail bool
	h, err := natsdedup.New(w, func(context.Context, jetstream.Msg) error {
		if fail {
			return boom
		}
		return nil
	}, &natsdedup.Options{AckWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	fail = true
	m := withID("a")
	if _, err := h.Handle(ctx, m); !errors.Is(err, boom) || m.last() != "nak-delay" || m.delay != 2*time.Second {
		t.Errorf("failing fn: %v, answers %v delay %v; want nak-delay 2s", err, m.got(), m.delay)
	}
	fail = false
	m = withID("a")
	if d, err := h.Handle(ctx, m); err != nil || d.Outcome != idempotency.Executed || m.last() != "ack" {
		t.Errorf("redelivery: %+v %v %v; want processed and acked", d, err, m.got())
	}
	m = withID("a")
	if d, err := h.Handle(ctx, m); err != nil || d.Outcome != idempotency.Replayed || len(m.got()) != 1 || m.last() != "ack" {
		t.Errorf("duplicate: %+v %v %v; want dropped and acked", d, err, m.got())
	}
	// The header's id, scoped by the stream and the consumer.
	if _, err := store.Get(ctx, "S.C.id.a", time.Now()); err != nil {
		t.Errorf("id S.C.id.a not in the window: %v", err)
	}
	// Without the header, the stream sequence and the time the message was
	// stored name it.
	m = withID("")
	if _, err := h.Handle(ctx, m); err != nil || m.last() != "ack" {
		t.Fatal(err, m.got())
	}
	if _, err := store.Get(ctx, "S.C.seq.7.1767225600000000000", time.Now()); err != nil {
		t.Errorf("fallback id S.C.seq.7.1767225600000000000 not in the window: %v", err)
	}
	// A custom id that is empty: the message is terminated.
	h2, _ := natsdedup.New(w, func(context.Context, jetstream.Msg) error { return nil },
		&natsdedup.Options{MsgID: func(jetstream.Msg) string { return "" }, DoubleAck: true, AckWait: time.Second})
	m = withID("b")
	if _, err := h2.Handle(ctx, m); err == nil || m.last() != "term" {
		t.Errorf("empty id: %v %v; want term", err, m.got())
	}
	h3, _ := natsdedup.New(w, func(context.Context, jetstream.Msg) error { return nil }, &natsdedup.Options{DoubleAck: true, AckWait: time.Second})
	m = withID("c")
	if _, err := h3.Handle(ctx, m); err != nil || m.last() != "double-ack" {
		t.Errorf("DoubleAck: %v %v", err, m.got())
	}
}

// TestHandleHeartbeat: InProgress as fn starts (the message's AckWait has
// been running since the server sent it), then every Heartbeat, then the
// answer.
func TestHandleHeartbeat(t *testing.T) {
	w, _ := dedup.New(idempotency.NewMemoryStore(), &dedup.Options{Lease: 100 * time.Millisecond})
	m := withID("slow")
	var atStart []string
	// fn runs until it has seen two heartbeats (bounded).
	h, err := natsdedup.New(w, func(context.Context, jetstream.Msg) error {
		atStart = m.got()
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end) && len(m.got()) < 2; {
			time.Sleep(5 * time.Millisecond)
		}
		return nil
	}, &natsdedup.Options{AckWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Handle(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	got := m.got()
	ok := len(got) >= 3 && got[len(got)-1] == "ack"
	for _, a := range got[:max(len(got)-1, 0)] {
		ok = ok && a == "in-progress"
	}
	if !ok {
		t.Errorf("answers %v, want in-progress twice (as fn starts, then every 50ms), then ack", got)
	}
	if len(atStart) != 1 || atStart[0] != "in-progress" {
		t.Errorf("answers as fn started: %v, want one in-progress (sent before fn, not a Heartbeat later)", atStart)
	}
}

func TestNewValidates(t *testing.T) {
	w, _ := dedup.New(idempotency.NewMemoryStore(), &dedup.Options{Lease: 100 * time.Millisecond})
	fn := func(context.Context, jetstream.Msg) error { return nil }
	for name, tc := range map[string]struct {
		w    *dedup.Window
		fn   func(context.Context, jetstream.Msg) error
		opts *natsdedup.Options
	}{
		"nil window":          {nil, fn, nil},
		"nil fn":              {w, nil, nil},
		"negative ack wait":   {w, fn, &natsdedup.Options{AckWait: -1}},
		"heartbeat too large": {w, fn, &natsdedup.Options{AckWait: time.Second, Heartbeat: time.Second}},
	} {
		if _, err := natsdedup.New(tc.w, tc.fn, tc.opts); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
}
