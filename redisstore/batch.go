package redisstore

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Batching. Under load, one round trip per operation costs more in system
// calls (a write and a read on each side, and go-redis's connection check)
// than in work. So operations that arrive while another is on the wire
// wait for it, and the next of them to be woken sends all that waited as
// one pipeline: one write and one read for the lot, whatever their keys
// (on Cluster, go-redis splits a pipeline by node). A lone operation is
// sent at once, as before: nothing waits at low load.
//
// There is no goroutine: the caller that finds the line free sends; when
// its batch is answered, it hands the queue to the first caller in it and
// returns. Each script keeps its rules: a writing script is sent at most
// once (a pipeline that holds one is never re-sent by go-redis), a
// NOSCRIPT reply (nothing ran) is followed by EVAL from its own caller.
//
// A caller whose ctx ends while it waits in the queue is taken out, never
// sent; once its batch is on the wire it returns at its ctx's end like any
// call, and the batch goes on (its write may or may not be applied). The
// batch's deadline is the latest of its members', so it never outlives the
// operations in it; the caller that sends it may return that late.
//
// Batching needs a client that bounds its I/O by the context
// (ContextTimeoutEnabled); with one that does not, every call is sent on
// its own (see call).

// maxBatch bounds the operations of one pipeline.
const maxBatch = 128

// batcher queues operations while one is on the wire.
type batcher struct {
	mu      sync.Mutex
	sending bool // a caller is sending (a lone call or a batch)
	queue   []*queued
}

// queued is one operation waiting for, or in, a batch.
type queued struct {
	sc       *script
	keys     []string
	args     []any
	ctx      context.Context
	deadline time.Time

	cmd *redis.Cmd // the EVALSHA sent for it
	// done is closed when cmd has its answer, or when lead is set.
	done chan struct{}
	// lead, set under the batcher's lock, is the batch this caller must
	// send (itself first); led says done was closed for it.
	lead []*queued
	led  bool
}

// batched runs sc for keys through the batcher. ctx has a deadline (call
// sets OpTimeout).
func (s *Store) batched(ctx context.Context, sc *script, keys []string, args []any) (any, error) {
	b := &s.batch
	b.mu.Lock()
	if !b.sending {
		b.sending = true
		b.mu.Unlock()
		v, err := sc.run(ctx, s.c, keys, args)
		s.handOn()
		return v, err
	}
	q := &queued{sc: sc, keys: keys, args: args, ctx: ctx, done: make(chan struct{})}
	q.deadline, _ = ctx.Deadline()
	b.queue = append(b.queue, q)
	b.mu.Unlock()
	select {
	case <-q.done:
	case <-ctx.Done():
		b.mu.Lock()
		if i := slices.Index(b.queue, q); i >= 0 {
			b.queue = slices.Delete(b.queue, i, i+1)
			b.mu.Unlock()
			return nil, ctx.Err() // never sent
		}
		lead := q.lead
		b.mu.Unlock()
		if lead == nil {
			// In a batch on the wire; its sender sees it through.
			return nil, ctx.Err()
		}
		// Handed the next batch: the others in it wait for this caller.
	}
	if q.lead != nil {
		s.sendBatch(q.lead)
	}
	return q.result(ctx, s.c)
}

// result is the answer to q once its batch was answered; a NOSCRIPT reply
// means nothing ran, so the script goes again as EVAL from here.
func (q *queued) result(ctx context.Context, c redis.UniversalClient) (any, error) {
	v, err := q.cmd.Result()
	if err != nil && isNoScript(err) {
		return q.sc.eval(ctx, c, q.keys, q.args)
	}
	return v, err
}

// sendBatch sends batch as one pipeline, wakes its members and hands on
// the queue.
func (s *Store) sendBatch(batch []*queued) {
	latest := batch[0].deadline
	for _, q := range batch {
		if q.deadline.After(latest) {
			latest = q.deadline
		}
	}
	// The sender's values (tracing) go along; its cancellation does not:
	// the batch is the others' too.
	ctx, cancel := context.WithDeadline(context.WithoutCancel(batch[0].ctx), latest)
	pipe := s.c.Pipeline()
	for _, q := range batch {
		q.cmd = evalshaCmd(ctx, q.sc, q.keys, q.args)
		if q.sc.writes {
			_ = pipe.Process(ctx, onceCmd{q.cmd})
		} else {
			_ = pipe.Process(ctx, q.cmd)
		}
	}
	_, _ = pipe.Exec(ctx) // each command holds its own answer
	cancel()
	s.batches.Add(1)
	s.batchedOps.Add(uint64(len(batch)))
	for _, q := range batch {
		if !q.led {
			close(q.done)
		}
	}
	s.handOn()
}

// handOn is called by a caller whose send is answered: it ends the
// sending, or hands the queue to its first caller as the next batch.
func (s *Store) handOn() {
	b := &s.batch
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.sending = false
		b.mu.Unlock()
		return
	}
	n := min(len(b.queue), maxBatch)
	next := slices.Clone(b.queue[:n])
	b.queue = slices.Delete(b.queue, 0, n)
	next[0].lead, next[0].led = next, true
	b.mu.Unlock()
	close(next[0].done)
}

// evalshaCmd is the EVALSHA of sc, routed on Cluster by its first key.
func evalshaCmd(ctx context.Context, sc *script, keys []string, args []any) *redis.Cmd {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, "evalsha", sc.Hash(), len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	a = append(a, args...)
	cmd := redis.NewCmd(ctx, a...)
	cmd.SetFirstKeyPos(3)
	return cmd
}

// eval runs sc as EVAL (sent once if it writes).
func (sc *script) eval(ctx context.Context, c redis.UniversalClient, keys []string, args []any) (any, error) {
	if sc.writes {
		return sendOnce(ctx, c, "eval", sc.src, keys, args)
	}
	return sc.Eval(ctx, c, keys, args...).Result()
}

func isNoScript(err error) bool {
	return errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT")
}
