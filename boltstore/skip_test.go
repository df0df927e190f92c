package boltstore

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

// endedAfterQueue is a ctx that reports itself ended from its second Err
// call on (write checks Err once before queueing; apply checks it again)
// while its Done channel never closes. It makes deterministic the race in
// which the caller's select sees the batch done before its ctx done.
type endedAfterQueue struct {
	context.Context
	calls int
}

func (c *endedAfterQueue) Err() error {
	c.calls++
	if c.calls > 1 {
		return context.Canceled
	}
	return nil
}

// A write skipped because its caller's ctx had ended must not be reported
// as applied (it was once acknowledged with nil: a lost Complete).
func TestSkippedWriteIsNotAcknowledged(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "x.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	bg := context.Background()
	now := time.Now()
	rec, ok, err := s.Begin(bg, "k", "fp", now, time.Minute, time.Hour)
	if err != nil || !ok {
		t.Fatalf("Begin: %v %v", ok, err)
	}
	err = s.Complete(&endedAfterQueue{Context: bg}, "k", rec.Token, idempotency.Response{Status: 200}, now, time.Hour)
	got, gerr := s.Get(bg, "k", now)
	if gerr != nil {
		t.Fatal(gerr)
	}
	if err == nil {
		t.Fatalf("Complete returned nil; the record is %s", got.State)
	}
	if !errors.Is(err, idempotency.ErrUnavailable) || got.State != idempotency.Processing {
		t.Fatalf("Complete = %v with the record %s; want ErrUnavailable and nothing applied", err, got.State)
	}
}

// causeAfterQueue is endedAfterQueue on a ctx cancelled with a cause of
// its own: context.Cause then returns that cause, which wraps neither
// context.Canceled nor DeadlineExceeded.
type causeAfterQueue struct {
	context.Context // cancelled, with a cause
	calls           int
}

func (c *causeAfterQueue) Err() error {
	c.calls++
	if c.calls > 1 {
		return c.Context.Err()
	}
	return nil
}

func (c *causeAfterQueue) Done() <-chan struct{} { return nil }

// A skipped write says what the package doc promises of a write whose ctx
// ended while it waited for its commit: ErrUnavailable and ctx.Err(), also
// when the ctx was cancelled with a cause (which it wraps too).
func TestSkippedWriteWrapsCtxErr(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "x.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	bg := context.Background()
	now := time.Now()
	rec, ok, err := s.Begin(bg, "k", "fp", now, time.Minute, time.Hour)
	if err != nil || !ok {
		t.Fatalf("Begin: %v %v", ok, err)
	}
	cause := errors.New("client went away")
	cctx, cancel := context.WithCancelCause(bg)
	cancel(cause)
	err = s.Complete(&causeAfterQueue{Context: cctx}, "k", rec.Token, idempotency.Response{Status: 200}, now, time.Hour)
	if !errors.Is(err, idempotency.ErrUnavailable) || !errors.Is(err, context.Canceled) || !errors.Is(err, cause) {
		t.Fatalf("Complete whose ctx ended = %v; want ErrUnavailable, context.Canceled and the cause", err)
	}
	if got, err := s.Get(bg, "k", now); err != nil || got.State != idempotency.Processing {
		t.Fatalf("Get after the skipped Complete = %+v, %v; want it still Processing", got, err)
	}
}
