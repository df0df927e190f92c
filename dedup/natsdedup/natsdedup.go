// Package natsdedup runs NATS JetStream consumers through a dedup.Window:
// a message handler that processes each logical message once, and turns the
// window's decision into Ack, Nak (with delay) or Term.
//
// The message id is the Nats-Msg-Id header, the id JetStream's own
// publish-side duplicate window uses, so one id names a logical message from
// the producer to the consumer. A message without the header falls back to
// "<stream>/<stream sequence>/<stored at, Unix ns>": that deduplicates
// redeliveries of one stored message (AckWait expiry, Nak, a consumer that
// died before acking, a lost ack), but not two stored copies of one logical
// message, which only a producer-chosen id can name. The time the message
// was stored is part of it because a sequence alone names a stored message
// only within one life of one stream: a stream deleted and created again
// starts from 1, and another cluster or account may have a stream of the
// same name, and a window that outlives the stream (a shared store) would
// ack their messages unprocessed. Options.MsgID can take the id from
// elsewhere (a business key in the payload or another header).
//
// While fn runs longer than half the consumer's AckWait, the handler sends
// InProgress every AckWait/2 so that JetStream does not redeliver a message
// that is still being worked on. The window's own lease protects the
// message too when a redelivery happens anyway: the duplicate is Nak'ed
// with the time left on the lease.
//
// Requirements and limits:
//   - The consumer must use AckExplicit. With AckAll, the Ack of a later
//     message also acknowledges an earlier one that was Nak'ed as in flight
//     (it is then never redelivered); with AckNone, Nak does nothing.
//   - Options.AckWait must be the consumer's AckWait (or shorter): the
//     heartbeat is paced by it. A redelivery that comes anyway is Nak'ed as
//     in flight, but counts against the consumer's MaxDeliver: once the
//     deliveries are used up, a handler that then fails sends a Nak the
//     server no longer acts on, and the message is dropped unprocessed.
//     Leave MaxDeliver unlimited (-1, the default), or give it room for the
//     in-flight redeliveries of your longest handler, and watch the
//     server's MAX_DELIVERIES advisories.
//   - A panic in fn releases the key and sends nothing to the broker (the
//     message is redelivered after AckWait), then goes on up: a message
//     that always panics crashes each consumer that receives it; recover
//     in fn if that is not what you want.
//
// JetStream's publish-side duplicate window and the consumer-side window
// are compared in the dedup package documentation.
package natsdedup

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/dedup"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultAckWait is JetStream's default consumer AckWait.
const DefaultAckWait = 30 * time.Second

// Options configure New; nil means all defaults.
type Options struct {
	// MsgID returns a message's id ("": none, the message is terminated).
	// nil: the Nats-Msg-Id header, else "<stream>/<stream sequence>/<stored
	// at, Unix ns>".
	MsgID func(msg jetstream.Msg) string
	// AckWait is the consumer's AckWait (0: DefaultAckWait). It sets the
	// default Heartbeat.
	AckWait time.Duration
	// Heartbeat is the interval of InProgress signals while fn runs
	// (0: AckWait/2; negative: none).
	Heartbeat time.Duration
	// DoubleAck waits for the server to confirm each Ack, so that a lost ack
	// is reported instead of causing a redelivery (which the window would
	// drop anyway). Off by default.
	DoubleAck bool
	// OnDecision, when set, is called after each message was answered, with
	// the window's decision and the error of processing or of the answer.
	// It is the place for logging and metrics.
	OnDecision func(msg jetstream.Msg, d dedup.Decision, err error)
}

// Handler processes JetStream messages through a dedup.Window. It is safe
// for concurrent use, so several consumers may share one.
type Handler struct {
	w  *dedup.Window
	fn func(ctx context.Context, msg jetstream.Msg) error
	o  Options
}

// New returns a Handler that runs fn for each message the window has not
// seen processed. fn's error makes the message be redelivered and processed
// again; fn runs with a context that carries the claim's fencing token
// (idempotency.TokenFrom) and is cancelled if the claim is lost.
func New(w *dedup.Window, fn func(ctx context.Context, msg jetstream.Msg) error, opts *Options) (*Handler, error) {
	if w == nil || fn == nil {
		return nil, fmt.Errorf("%w: natsdedup: nil Window or fn", idempotency.ErrInvalidConfig)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.AckWait < 0 {
		return nil, fmt.Errorf("%w: natsdedup: AckWait %v is negative", idempotency.ErrInvalidConfig, o.AckWait)
	}
	if o.AckWait == 0 {
		o.AckWait = DefaultAckWait
	}
	if o.Heartbeat == 0 {
		o.Heartbeat = o.AckWait / 2
	}
	if o.Heartbeat >= o.AckWait {
		return nil, fmt.Errorf("%w: natsdedup: Heartbeat %v is not shorter than AckWait %v", idempotency.ErrInvalidConfig, o.Heartbeat, o.AckWait)
	}
	return &Handler{w: w, fn: fn, o: o}, nil
}

// MessageHandler returns a jetstream.MessageHandler for Consume that
// processes every message with ctx.
func (h *Handler) MessageHandler(ctx context.Context) jetstream.MessageHandler {
	return func(msg jetstream.Msg) { _, _ = h.Handle(ctx, msg) }
}

// Handle processes one message and answers it: Ack, Nak or NakWithDelay, or
// Term. It returns the window's decision and any error of processing or of
// sending the answer.
func (h *Handler) Handle(ctx context.Context, msg jetstream.Msg) (dedup.Decision, error) {
	id := h.msgID(msg)
	d, err := h.w.Process(ctx, id, func(ctx context.Context) error {
		if h.o.Heartbeat < 0 {
			return h.fn(ctx, msg)
		}
		stop := heartbeat(msg, h.o.Heartbeat)
		defer stop()
		return h.fn(ctx, msg)
	})
	var aerr error
	switch d.Action {
	case dedup.Ack:
		if h.o.DoubleAck {
			aerr = msg.DoubleAck(context.WithoutCancel(ctx))
		} else {
			aerr = msg.Ack()
		}
	case dedup.Nak:
		if d.Delay > 0 {
			aerr = msg.NakWithDelay(d.Delay)
		} else {
			aerr = msg.Nak()
		}
	default:
		aerr = msg.Term()
	}
	if aerr != nil {
		err = errors.Join(err, fmt.Errorf("natsdedup: %s %q: %w", d.Action, id, aerr))
	}
	if h.o.OnDecision != nil {
		h.o.OnDecision(msg, d, err)
	}
	return d, err
}

// msgID applies Options.MsgID or the default rule.
func (h *Handler) msgID(msg jetstream.Msg) string {
	if h.o.MsgID != nil {
		return h.o.MsgID(msg)
	}
	if id := msg.Headers().Get(jetstream.MsgIDHeader); id != "" {
		return id
	}
	md, err := msg.Metadata()
	if err != nil {
		return "" // not a JetStream message: terminated by the window
	}
	// The sequence alone is reused by a stream created again under the same
	// name; the time the message was stored is not, and every delivery of
	// one stored message carries the same.
	return md.Stream + "/" + strconv.FormatUint(md.Sequence.Stream, 10) + "/" + strconv.FormatInt(md.Timestamp.UnixNano(), 10)
}

// heartbeat sends InProgress every interval until the returned stop is
// called; stop returns once no signal is being sent.
func heartbeat(msg jetstream.Msg, every time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				// A failed signal is not fatal: the window's lease still
				// holds off a redelivered duplicate.
				_ = msg.InProgress()
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}
