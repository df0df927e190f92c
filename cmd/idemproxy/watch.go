package main

import (
	"context"
	"log/slog"

	"github.com/archlab/idempotency"
)

// deleteWatcher is a store that announces deletions made through any
// process (redisstore.Store).
type deleteWatcher interface {
	WatchDeletes(ctx context.Context, forget func(key string), reset func()) error
}

// watchDeletes keeps cache coherent with deletions made through other
// instances until the returned function is called; it returns once the
// watcher has stopped.
func watchDeletes(w deleteWatcher, cache *idempotency.ReplayCache, log *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		resets := 0
		_ = w.WatchDeletes(ctx, cache.Forget, func() {
			cache.ForgetAll()
			if resets++; resets > 1 {
				log.Warn("replay cache emptied: the store's deletion feed was resubscribed, deletions in between may have been missed")
			}
		})
	}()
	return func() {
		cancel()
		<-done
	}
}
