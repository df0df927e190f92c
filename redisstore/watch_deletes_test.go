package redisstore

import (
	"context"
	"errors"
	"testing"
	"time"
)

// watcher runs WatchDeletes on s until the test ends, reporting each
// forgotten key and each reset on channels.
type watcher struct {
	forgot chan string
	resets chan struct{}
	done   chan error
	cancel context.CancelFunc
}

func watch(t *testing.T, s *Store) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{forgot: make(chan string, 100), resets: make(chan struct{}, 100), done: make(chan error, 1), cancel: cancel}
	go func() {
		w.done <- s.WatchDeletes(ctx, func(k string) { w.forgot <- k }, func() { w.resets <- struct{}{} })
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-w.done:
		case <-time.After(5 * time.Second):
			t.Error("WatchDeletes did not return within 5s of its context's end")
		}
	})
	w.wantReset(t)
	return w
}

func (w *watcher) wantReset(t *testing.T) {
	t.Helper()
	select {
	case <-w.resets:
	case <-time.After(5 * time.Second):
		t.Fatal("no reset within 5s: the subscription was not made")
	}
}

func (w *watcher) wantForgot(t *testing.T, key string) {
	t.Helper()
	select {
	case k := <-w.forgot:
		if k != key {
			t.Fatalf("forgot %q, want %q", k, key)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%q was not forgotten within 5s of its deletion", key)
	}
}

func mustDelete(t *testing.T, s *Store, key string) {
	t.Helper()
	if err := s.Delete(context.Background(), key); err != nil {
		t.Fatal(err)
	}
}

func TestWatchDeletes(t *testing.T) {
	c1, c2 := sharedClient(t), sharedClient(t)
	prefix := randomPrefix(t)
	watched := newStore(t, c1, Options{Prefix: prefix})
	other := newStore(t, c2, Options{Prefix: prefix}) // another process, in effect
	elsewhere := newStore(t, c2, Options{})           // another prefix
	w := watch(t, watched)

	mustDelete(t, other, "a")
	w.wantForgot(t, "a")
	mustDelete(t, watched, "b") // its own deletions too
	w.wantForgot(t, "b")
	mustDelete(t, elsewhere, "not-mine")
	mustDelete(t, other, "c")
	w.wantForgot(t, "c") // not "not-mine"
}

// TestWatchDeletesResubscribes: a subscription cut by the server is made
// again, with a reset (deletions announced meanwhile are lost), and
// deletions reach the watcher again.
func TestWatchDeletesResubscribes(t *testing.T) {
	ps := startPrivateServer(t)
	s := newStore(t, ps.client(t), Options{})
	w := watch(t, s)
	admin := ps.client(t)
	if err := admin.Do(context.Background(), "client", "kill", "type", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	w.wantReset(t)
	mustDelete(t, s, "after")
	w.wantForgot(t, "after")

	// A server gone for a while: the watcher keeps trying, and is back
	// with a reset when the server is.
	ps.kill()
	time.Sleep(2 * watchRetry)
	ps.start()
	w.wantReset(t)
	mustDelete(t, s, "back")
	w.wantForgot(t, "back")
}

func TestWatchDeletesEndsWithContext(t *testing.T) {
	s := newStore(t, sharedClient(t), Options{})
	w := watch(t, s)
	w.cancel()
	select {
	case err := <-w.done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("WatchDeletes = %v, want context.Canceled", err)
		}
		w.done <- err // for the cleanup
	case <-time.After(5 * time.Second):
		t.Fatal("WatchDeletes did not return after its context was cancelled")
	}
}

func TestWatchDeletesCluster(t *testing.T) {
	c1, c2 := clusterClient(t), clusterClient(t)
	prefix := randomPrefix(t)
	watched := newStore(t, c1, Options{Prefix: prefix})
	other := newStore(t, c2, Options{Prefix: prefix})
	w := watch(t, watched)
	// Keys in several slots: the deletion reaches the watcher whichever
	// master holds the key.
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		mustDelete(t, other, k)
		w.wantForgot(t, k)
	}
}
