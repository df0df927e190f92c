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
// one pipeline: one write and one read for the lot. A lone operation is
// sent at once, as before: nothing waits at low load. On Cluster (and
// Ring) each master has a queue of its own: a batch waits for its slowest
// node, so one paused master would otherwise hold up, and fail at their
// deadlines, the operations of all the others.
//
// There is no goroutine: the caller that finds the line free sends; when
// its batch is answered, it hands the queue to the first caller in it and
// returns. Each script keeps its rules: a writing script is sent at most
// once (a pipeline that holds one is never re-sent by go-redis), a
// NOSCRIPT reply (nothing ran) is followed by EVAL from its own caller.
//
// A caller whose ctx ends before its batch goes out leaves it, never sent
// (a caller handed the lead so passes it on to the next that stayed); once
// its batch is on the wire it returns when the batch is answered or at its
// ctx's end (the sender: at its deadline, see the package doc on
// cancellation), and the batch goes on (its write may or may not be
// applied). The batch's deadline is the latest of its members', so it
// never outlives the operations in it, and the caller with that deadline
// sends it, so that no sender waits past its own. Should a send panic, the
// panic goes up its sender's stack, the others get an error and the queue
// is handed on all the same.
//
// A node's queue lives as long as go-redis hands out the node's client:
// when the topology changes, go-redis replaces node clients, and the
// queues of those it no longer hands out are dropped once idle (see
// sweep).
//
// Batching needs a client that bounds its I/O by the context
// (ContextTimeoutEnabled); with one that does not, every call is sent on
// its own (see call).

// maxBatch bounds the operations of one pipeline.
const maxBatch = 128

// batcher queues operations while one is on the wire.
type batcher struct {
	c       redis.UniversalClient // sends the batches: the store's, or a Ring's shard
	mu      sync.Mutex
	sending bool // a caller is sending (a lone call or a batch)
	queue   []*queued
	// used says a call came through since the last sweep (see sweep).
	used bool
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
	// left, set under the lock, says the caller returned (its ctx ended)
	// after its batch was formed: the batch goes out without it.
	left bool
}

// errBatchAborted is the error of the operations of a batch whose send
// panicked.
var errBatchAborted = errors.New("redisstore: the batch's send panicked")

// batcherFor returns the batcher of the node that holds key, whose
// commands go through c (see client); nil when that node is not known
// (the call then goes alone and fails or is redirected as any command
// would).
func (s *Store) batcherFor(ctx context.Context, c redis.UniversalClient, key string) *batcher {
	var node *redis.Client
	switch sc := s.c.(type) {
	case *redis.ClusterClient:
		var err error
		if node, err = sc.MasterForKey(ctx, key); err != nil {
			return nil
		}
	case *redis.Ring:
		node = c.(*redis.Client) // the key's shard
	default:
		return &s.batch
	}
	if b, ok := s.nodes.Load(node); ok {
		return b.(*batcher)
	}
	// A node client not seen before: the topology changed (or the node's
	// batcher was swept while idle). Clients go-redis replaced meanwhile
	// are no longer handed out; their batchers go now.
	s.sweep()
	b, _ := s.nodes.LoadOrStore(node, &batcher{c: c, used: true})
	return b.(*batcher)
}

// sweep drops the batchers of the nodes that no call used since the last
// sweep and that are idle. go-redis replaces a node's client when the
// topology changes (a Cluster reload that drops a node, a failover to a
// new address, a Ring's SetAddrs), and a new client shows up here as a
// node not seen before, which is what runs a sweep: the hot path only
// marks its batcher used, under the lock it takes anyway. A replaced
// client still in use at one sweep goes at the next one. A live node
// whose batcher was dropped gets a new one at its next call, and a caller
// that found a batcher just before it was dropped still uses it: two
// batchers of one node send side by side for a moment, as unbatched
// calls do. A batcher with a caller sending or queued is never dropped.
func (s *Store) sweep() {
	if !s.sweeping.CompareAndSwap(false, true) {
		return // another caller is at it
	}
	defer s.sweeping.Store(false)
	s.nodes.Range(func(node, v any) bool {
		b := v.(*batcher)
		b.mu.Lock()
		drop := !b.used && !b.sending && len(b.queue) == 0
		b.used = false
		b.mu.Unlock()
		if drop {
			s.nodes.CompareAndDelete(node, b)
		}
		return true
	})
}

// batched runs sc for keys through the batcher of keys[0]'s node, whose
// commands go through c. ctx has a deadline (call sets OpTimeout).
func (s *Store) batched(ctx context.Context, c redis.UniversalClient, sc *script, keys []string, args []any) (any, error) {
	b := s.batcherFor(ctx, c, keys[0])
	if b == nil {
		return sc.run(ctx, c, keys, args)
	}
	b.mu.Lock()
	b.used = true
	if !b.sending {
		b.sending = true
		b.mu.Unlock()
		defer s.handOn(b)
		return sc.run(ctx, b.c, keys, args)
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
		q.left = lead == nil
		b.mu.Unlock()
		if lead == nil {
			// In a batch, sent without it unless already on the wire.
			return nil, ctx.Err()
		}
		// Handed the next batch: the others in it wait for this caller.
	}
	if q.lead != nil {
		if ctx.Err() != nil {
			s.passOn(b, q.lead[1:])
			return nil, ctx.Err()
		}
		s.sendBatch(b, q.lead)
	}
	return q.result(ctx, b.c)
}

// passOn hands the lead of batch, whose leader's ctx ended before it was
// sent, to the caller that stayed with the latest deadline.
func (s *Store) passOn(b *batcher, batch []*queued) {
	b.mu.Lock()
	batch = slices.DeleteFunc(batch, func(q *queued) bool { return q.left })
	if len(batch) == 0 {
		b.mu.Unlock()
		s.handOn(b)
		return
	}
	leadFirst(batch)
	batch[0].lead, batch[0].led = batch, true
	b.mu.Unlock()
	close(batch[0].done)
}

// leadFirst puts first in batch the caller with the latest deadline, who
// is to send it: the batch is on the wire until that deadline, and its
// sender waits for it, so any other sender would be held past its own.
func leadFirst(batch []*queued) {
	i := 0
	for j, q := range batch {
		if q.deadline.After(batch[i].deadline) {
			i = j
		}
	}
	batch[0], batch[i] = batch[i], batch[0]
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
func (s *Store) sendBatch(b *batcher, batch []*queued) {
	b.mu.Lock()
	batch = slices.DeleteFunc(batch, func(q *queued) bool { return q.left })
	b.mu.Unlock()
	latest := batch[0].deadline
	for _, q := range batch {
		if q.deadline.After(latest) {
			latest = q.deadline
		}
	}
	// The sender's values (tracing) go along; its cancellation does not:
	// the batch is the others' too.
	ctx, cancel := context.WithDeadline(context.WithoutCancel(batch[0].ctx), latest)
	defer cancel()
	for _, q := range batch {
		q.cmd = evalshaCmd(ctx, q.sc, q.keys, q.args)
	}
	answered := false
	defer func() {
		for _, q := range batch {
			if !answered {
				q.cmd.SetErr(errBatchAborted)
			}
			if !q.led {
				close(q.done)
			}
		}
		s.handOn(b)
	}()
	pipe := b.c.Pipeline()
	for _, q := range batch {
		if q.sc.writes {
			_ = pipe.Process(ctx, onceCmd{q.cmd})
		} else {
			_ = pipe.Process(ctx, q.cmd)
		}
	}
	_, _ = pipe.Exec(ctx) // each command holds its own answer
	answered = true
	s.batches.Add(1)
	s.batchedOps.Add(uint64(len(batch)))
}

// handOn is called by a caller whose send is answered: it ends the
// sending, or hands the next batch from the queue to its caller with the
// latest deadline.
func (s *Store) handOn(b *batcher) {
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.sending = false
		b.mu.Unlock()
		return
	}
	n := min(len(b.queue), maxBatch)
	next := slices.Clone(b.queue[:n])
	b.queue = slices.Delete(b.queue, 0, n)
	leadFirst(next)
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
