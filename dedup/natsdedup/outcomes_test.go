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

// TestHandleAnswersEveryOutcome: the broker's answer for each thing the
// window can find or fn can do. A message whose work is done (now or
// before) is acked; one whose work is not done and may be done later is
// Nak'ed, with the delay after which it can be; one that can never be
// processed under its id is terminated.
func TestHandleAnswersEveryOutcome(t *testing.T) {
	const (
		key   = "S.C.id.m1" // the window key of withID("m1")
		lease = 4 * time.Second
	)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	boom := errors.New("downstream refused")
	for _, tc := range []struct {
		name   string
		before func(t *testing.T, s *idempotency.MemoryStore) // store state and faults
		fn     func(ctx context.Context, s *idempotency.MemoryStore) error
		ran    bool
		want   string // the message's last answer
		delay  time.Duration
		out    idempotency.Outcome
		errIs  error // nil: no error
	}{
		{name: "executed", ran: true, want: "ack", out: idempotency.Executed},
		{name: "replayed", before: func(t *testing.T, s *idempotency.MemoryStore) {
			rec, _, err := s.Begin(context.Background(), key, "dedup/v1", now, lease, time.Hour)
			if err == nil {
				err = s.Complete(context.Background(), key, rec.Token, idempotency.Response{}, now, time.Hour)
			}
			if err != nil {
				t.Fatal(err)
			}
		}, want: "ack", out: idempotency.Replayed},
		{name: "fn failed", fn: func(context.Context, *idempotency.MemoryStore) error { return boom },
			ran: true, want: "nak-delay", delay: time.Second, out: idempotency.Executed, errIs: boom},
		{name: "in flight elsewhere", before: func(t *testing.T, s *idempotency.MemoryStore) {
			if _, _, err := s.Begin(context.Background(), key, "dedup/v1", now.Add(-time.Second), lease, time.Hour); err != nil {
				t.Fatal(err)
			}
		}, want: "nak-delay", delay: lease - time.Second, out: idempotency.InFlight},
		{name: "store unavailable", before: func(t *testing.T, s *idempotency.MemoryStore) {
			s.Fault = func(string) error { return errors.New("connection refused") }
		}, want: "nak-delay", delay: 3 * time.Second, out: idempotency.Unavailable, errIs: idempotency.ErrUnavailable},
		{name: "id held by another kind of record", before: func(t *testing.T, s *idempotency.MemoryStore) {
			if _, _, err := s.Begin(context.Background(), key, "an HTTP request", now, lease, time.Hour); err != nil {
				t.Fatal(err)
			}
		}, want: "term", out: idempotency.Conflicted, errIs: idempotency.ErrConflict},
		{name: "success not stored", before: func(t *testing.T, s *idempotency.MemoryStore) {
			s.Fault = func(op string) error {
				if op == "complete" {
					return errors.New("connection reset")
				}
				return nil
			}
		}, ran: true, want: "ack", out: idempotency.Executed, errIs: idempotency.ErrUnavailable},
		{name: "fn failed, claim not released", before: func(t *testing.T, s *idempotency.MemoryStore) {
			s.Fault = func(op string) error {
				if op == "release" {
					return errors.New("connection reset")
				}
				return nil
			}
		}, fn: func(context.Context, *idempotency.MemoryStore) error { return boom },
			ran: true, want: "nak-delay", delay: lease, out: idempotency.Executed, errIs: idempotency.ErrUnavailable},
		{name: "claim lost, fn succeeded", fn: func(ctx context.Context, s *idempotency.MemoryStore) error {
			return s.Delete(ctx, key)
		}, ran: true, want: "ack", out: idempotency.Executed, errIs: idempotency.ErrLeaseLost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := idempotency.NewMemoryStore()
			if tc.before != nil {
				tc.before(t, store)
			}
			w, err := dedup.New(store, &dedup.Options{
				Lease: lease, RetryDelay: time.Second, UnavailableDelay: 3 * time.Second, Now: func() time.Time { return now },
			})
			if err != nil {
				t.Fatal(err)
			}
			ran := false
			h, err := natsdedup.New(w, func(ctx context.Context, _ jetstream.Msg) error {
				ran = true
				if tc.fn != nil {
					return tc.fn(ctx, store)
				}
				return nil
			}, &natsdedup.Options{AckWait: lease, Heartbeat: -1})
			if err != nil {
				t.Fatal(err)
			}
			m := withID("m1")
			d, err := h.Handle(context.Background(), m)
			if ran != tc.ran || d.Outcome != tc.out || m.last() != tc.want || len(m.got()) != 1 || m.delay != tc.delay {
				t.Errorf("ran %v, %+v, answers %v (delay %v); want ran %v, %s, answered %s once (delay %v)",
					ran, d, m.got(), m.delay, tc.ran, tc.out, tc.want, tc.delay)
			}
			if (tc.errIs == nil) != (err == nil) || (tc.errIs != nil && !errors.Is(err, tc.errIs)) {
				t.Errorf("error %v, want %v", err, tc.errIs)
			}
		})
	}
}
