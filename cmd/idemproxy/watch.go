package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/archlab/idempotency"
)

// deleteWatcher is a store that announces deletions made through any
// process (redisstore.Store, pgstore.Store).
type deleteWatcher interface {
	WatchDeletes(ctx context.Context, forget func(key string), reset func(), report func(error)) error
}

// watchDeletes keeps cache, whose TTL is ttl, coherent with deletions made
// through other instances until the returned function is called; that
// function returns once the watcher has stopped. The feed going down is
// logged once (not at every retry), and so is its coming back.
func watchDeletes(w deleteWatcher, cache *idempotency.ReplayCache, ttl time.Duration, log *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		resets, down := 0, false
		_ = w.WatchDeletes(ctx, cache.Forget, func() {
			cache.ForgetAll()
			if resets++; resets > 1 || down {
				log.Info("replay cache: the store's deletion feed is subscribed again; the cache was emptied, since deletions in between may have been missed")
			}
			down = false
		}, func(err error) {
			if !down {
				log.Warn("replay cache: the store's deletion feed is down; until it is back, a key deleted through another instance may replay here for up to the cache's TTL",
					"ttl", ttl, "error", err)
			}
			down = true
		})
	}()
	return func() {
		cancel()
		<-done
	}
}

// redisLog sends the Redis client's own messages (a dial that failed, a
// pool that cannot fill) to the proxy's logger, so that -log-format json
// stays JSON on stderr. The client's logger is process-wide: the proxy's
// is installed when it starts serving.
type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.log.WarnContext(ctx, "redis client", "message", fmt.Sprintf(format, v...))
}
