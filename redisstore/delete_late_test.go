package redisstore

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

// TestDeleteTimedOutAppliedLate pins what Store.Delete documents: a Delete
// that timed out against a paused server fails with ErrUnavailable and is
// applied when the server resumes, after its caller was told it failed.
func TestDeleteTimedOutAppliedLate(t *testing.T) {
	ps := startPrivateServer(t)
	s := newStore(t, ps.client(t), Options{OpTimeout: 300 * time.Millisecond})
	ctx := context.Background()
	rec, ok, err := s.Begin(ctx, "k", "fp", time.Now(), time.Minute, time.Hour)
	if err != nil || !ok {
		t.Fatalf("Begin = %v, %v", ok, err)
	}
	if err := s.Complete(ctx, "k", rec.Token, idempotency.Response{Status: 200}, time.Now(), time.Hour); err != nil {
		t.Fatal(err)
	}
	ps.signal(syscall.SIGSTOP)
	paused := true
	defer func() {
		if paused {
			ps.signal(syscall.SIGCONT)
		}
	}()
	if err := s.Delete(ctx, "k"); !errors.Is(err, idempotency.ErrUnavailable) {
		t.Fatalf("Delete against a paused server = %v, want ErrUnavailable", err)
	}
	ps.signal(syscall.SIGCONT)
	paused = false
	// The HDEL waited in the server's socket and ran once it resumed.
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := s.Get(ctx, "k", time.Now())
		if errors.Is(err, idempotency.ErrNotFound) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Get 5s after the server resumed = %v; want ErrNotFound (the timed-out Delete applied late)", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
