// Package natsdedup runs NATS JetStream consumers through a dedup.Window:
// a message handler that processes each logical message once, and turns the
// window's decision into Ack, Nak (with delay) or Term.
//
// # Message ids
//
// The message id is the Nats-Msg-Id header, the id JetStream's own
// publish-side duplicate window uses, so one id names a logical message from
// the producer to the consumer. It is scoped the way JetStream scopes it:
// the window key is "<stream>.<consumer>.id.<Nats-Msg-Id>" (after the
// Window's Prefix). JetStream drops duplicates per stream only, so
// producers of two streams may well give two different messages one id (a
// business key), and every consumer of a stream is a subscriber of its own
// that must process each message (billing and mailing on one orders
// stream). Without the scope, a window shared by
// them (one Redis, no Prefix) would ack one's message unprocessed as a
// duplicate of the other's. Competing instances of one durable consumer
// share its name, and so its keys.
//
// An ephemeral consumer left to the server to name gets a new name, and so
// a new scope, each time it is created: a service that makes one at start
// dedups nothing across its own restarts. The new consumer starts from its
// DeliverPolicy, not from the old one's acks, so with DeliverAll every
// message comes again and runs again (with DeliverNew, the messages the old
// one had not acked are never delivered: that loss is the consumer's, not
// the window's). Use a durable consumer, whose acks and name outlive the
// process, or give the ephemeral consumer a Name and create it under that
// name again, or set Options.MsgID.
//
// A message without the header falls back to
// "<stream>.<consumer>.seq.<stream sequence>.<stored at, Unix ns>": that
// deduplicates redeliveries of one stored message (AckWait expiry, Nak, a
// consumer that died before acking, a lost ack), but not two stored copies
// of one logical message, which only a producer-chosen id can name. The
// time the message was stored is part of it because a sequence alone names
// a stored message only within one life of one stream: a stream deleted and
// created again starts from 1, and a window that outlives the stream (a
// shared store) would ack its new messages unprocessed.
//
// Stream and consumer names cannot contain a dot (they are tokens of the
// ack subject), so the scope cannot be forged by an id. What the scope does
// not separate is two accounts, domains or clusters that use the same
// stream and consumer names: give each its own dedup.Options.Prefix when
// they share a store. Options.MsgID takes the id from elsewhere (a business
// key in the payload or another header) and is used as it is, unscoped:
// include what must keep consumers apart, or dedup across streams and
// consumers on purpose.
//
// # AckWait, heartbeats and the lease
//
// While fn runs, the handler sends InProgress as fn starts and then every
// Heartbeat (AckWait/2 by default) until the result is stored, so that
// JetStream does not redeliver a message that is still being worked on. The
// first signal goes out at once because AckWait runs from when the server
// sent the message, not from when fn starts: Consume pulls messages ahead
// into a client buffer (PullMaxMessages, 500 by default), where a message
// waits behind the ones before it. A message that waited longer than
// AckWait there has been redelivered already; keep PullMaxMessages times
// the handler's usual time under AckWait.
//
// The heartbeat is paced by the consumer's AckWait, which New reads from
// Options.Consumer (or takes from Options.AckWait). New also refuses a
// Window whose lease is longer than AckWait. When a consumer dies
// mid-message, JetStream redelivers after AckWait and the window lets the
// redelivery run once the dead consumer's lease has ended. A lease longer
// than AckWait makes every such redelivery find the claim still held: it is
// Nak'ed with the time left on the lease and the message runs on a later
// delivery. Nothing runs twice and nothing is acked unprocessed, but the
// takeover waits for the lease instead of AckWait, and the bounced
// redelivery counts against MaxDeliver: with MaxDeliver 2 the message is
// never processed at all. Even with Lease at most AckWait, the dead
// consumer's last lease renewal may have come after its last InProgress, so
// one redelivery may still be bounced; a Lease of at most AckWait minus
// Heartbeat rules that out (up to clock and network delays), which matters
// with a small MaxDeliver.
//
// # Requirements and limits
//
//   - The consumer must use AckExplicit (New checks it when given
//     Options.Consumer). With AckAll, the Ack of a later message also
//     acknowledges an earlier one that was Nak'ed as in flight (it is then
//     never redelivered); with AckNone, Nak does nothing.
//   - A message Nak'ed on its last delivery (MaxDeliver) is not delivered
//     again: a poison message, whose fn always fails, is dropped after
//     MaxDeliver tries, and a redelivery that comes while the message is
//     processed (the heartbeat was late or lost) is Nak'ed as in flight and
//     uses up a delivery too, so that a holder that then fails sends a Nak
//     the server no longer acts on. Handle reports such a Nak with
//     ErrMaxDeliveries when it knows MaxDeliver (Options.Consumer); the
//     server publishes a MAX_DELIVERIES advisory. Leave MaxDeliver
//     unlimited (-1, the default) with a RetryDelay or a BackOff that paces
//     a poison message, or give it room, and alert on either signal.
//   - A panic in fn releases the key and sends nothing to the broker (the
//     message is redelivered after AckWait), then goes on up: a message
//     that always panics crashes each consumer that receives it; recover
//     in fn if that is not what you want.
//
// # When the store fails
//
// The window fails closed. A message whose claim the store cannot make
// (down, paused, slower than its own timeout) is Nak'ed after the Window's
// UnavailableDelay with an error wrapping idempotency.ErrUnavailable, and
// fn does not run; it is processed once the store answers again. A Begin
// that failed so may still have been applied (the store got it, the answer
// was lost): its claim then blocks the message until its lease ends,
// counted from when Begin was sent, and a redelivery before that is Nak'ed
// as in flight, with the time left on the lease.
//
// A message whose fn succeeded but whose result could not be stored (the
// store failed after the claim, or the claim was lost) is acked all the
// same, on purpose: its effect happened, and a Nak would run fn again at
// once. Handle returns the error (wrapping idempotency.ErrUnavailable or
// idempotency.ErrLeaseLost) and OnDecision gets it: log it, alert on it.
// Until a result is stored nothing remembers that the message was
// processed, so a copy that comes after the claim's lease ends (the ack
// was lost too and JetStream redelivers after AckWait, or the producer
// stored the message twice) runs fn again. A fn whose effect must not
// happen twice even then makes it idempotent, or conditional on the
// fencing token (idempotency.TokenFrom).
//
// # Shutdown
//
// The Handler owns no goroutine between messages; the heartbeat of a
// message ends before Handle returns. To stop, call the ConsumeContext's
// Stop (messages pulled but not handled are redelivered after AckWait) or
// Drain (they are handled first), and wait on its Closed channel before
// closing the connection: an answer sent on a closed connection is lost,
// and the message is redelivered after AckWait (replayed if its result was
// stored, processed again if not).
//
// Cancelling the ctx given to MessageHandler cancels fn's ctx; a fn that
// returns its error is Nak'ed after the Window's RetryDelay with its claim
// released. A message handled after the cancel is Nak'ed after the
// Window's UnavailableDelay (outcome Unavailable: the store's calls fail
// with the done ctx) without running fn or leaving a claim, since this
// module's stores look at ctx before they send a call. A Handler left
// running with a done ctx so Naks every message it gets, each at the cost
// of a delivery (counted against MaxDeliver): stop consuming first.
//
// A cancel that lands while the store's Begin is under way can go two
// ways, because a call already sent is not recalled by a cancel (go-redis
// bounds it only by its deadline, redisstore's OpTimeout; pgx cancels the
// query, which the server may have committed by then):
//
//   - The Begin claims the message and answers: the Guard does not start
//     fn with a done ctx. It releases the claim, the outcome is
//     Unavailable, and the message is Nak'ed after UnavailableDelay, to be
//     processed by whoever gets the redelivery.
//   - The Begin fails (the deadline, the cancelled query) after the store
//     applied it: the outcome is Unavailable, fn does not run, the message
//     is Nak'ed after UnavailableDelay, and the claim stays, since nobody
//     holds its token to release it, until its lease ends, a Lease after
//     the Begin was sent. A redelivery before then is Nak'ed as in flight
//     with the time left on the lease (one more delivery, counted against
//     MaxDeliver), and the one after it processes the message: about one
//     Lease after the cancelled Begin. If the Nak was lost with the
//     connection, JetStream redelivers after AckWait, counted from the
//     delivery; the lease, at most AckWait but counted from the later
//     Begin, may bounce that redelivery once more.
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

// ErrMaxDeliveries is returned (wrapped, beside the error that made the
// Handler Nak) when a message was Nak'ed on its last delivery by the
// consumer's MaxDeliver: JetStream will not deliver it again, so unless a
// consumer processing it elsewhere (InFlight) acks it, it is dropped
// unprocessed; the server only publishes a MAX_DELIVERIES advisory. Alert
// on it; the message can be read from the stream by its sequence and
// republished once its cause is fixed. A Handler knows MaxDeliver only
// when built with Options.Consumer.
var ErrMaxDeliveries = errors.New("natsdedup: Nak'ed on the last delivery allowed by MaxDeliver: the message will not be redelivered")

// Options configure New; nil means all defaults.
type Options struct {
	// MsgID returns a message's id ("": none, the message is terminated),
	// used as it is. nil: "<stream>.<consumer>.id.<Nats-Msg-Id>", or
	// without the header "<stream>.<consumer>.seq.<stream sequence>.<stored
	// at, Unix ns>" (see the package documentation).
	MsgID func(msg jetstream.Msg) string
	// Consumer is the consumer whose messages the Handler answers (nil:
	// AckWait says). New reads its configuration from the cached info,
	// without a request: AckWait is the shortest of the consumer's AckWait
	// and BackOff intervals (BackOff times redeliveries in AckWait's
	// place), a consumer that does not use AckExplicit is refused, and
	// MaxDeliver tells the Handler which delivery is the last (see
	// ErrMaxDeliveries). A Handler shared by several consumers must be
	// built from the one with the shortest AckWait and the smallest
	// MaxDeliver.
	Consumer jetstream.Consumer
	// AckWait is the consumer's AckWait, when Consumer is not given
	// (0: DefaultAckWait, JetStream's default). It sets the default
	// Heartbeat, and the Window's lease must not be longer. It must not be
	// longer than the consumer's real AckWait, or JetStream redelivers
	// messages while they are processed. Must be 0 when Consumer is set.
	AckWait time.Duration
	// Heartbeat is the interval of InProgress signals while fn runs, the
	// first of which is sent as fn starts (0: AckWait/2; negative: none).
	// It must be shorter than AckWait.
	Heartbeat time.Duration
	// DoubleAck waits for the server to confirm each Ack, so that a lost ack
	// is reported in Handle's error. The message is then redelivered after
	// AckWait either way, and the window replays it (acks it without
	// running fn). Off by default.
	DoubleAck bool
	// OnDecision, when set, is called after each message was answered, with
	// the window's decision and the error of processing or of the answer.
	// It is the place for logging and metrics.
	OnDecision func(msg jetstream.Msg, d dedup.Decision, err error)
}

// Handler processes JetStream messages through a dedup.Window. It is safe
// for concurrent use, so several consumers may share one.
type Handler struct {
	w          *dedup.Window
	fn         func(ctx context.Context, msg jetstream.Msg) error
	o          Options
	maxDeliver int // the consumer's MaxDeliver (<= 0: unlimited or unknown)
}

// New returns a Handler that runs fn for each message the window has not
// seen processed. fn's error makes the message be redelivered and processed
// again; fn runs with a context that carries the claim's fencing token
// (idempotency.TokenFrom) and is cancelled if the claim is lost.
//
// New refuses (idempotency.ErrInvalidConfig) a Window whose lease is
// longer than the consumer's AckWait, a Consumer without AckExplicit or
// without cached info, and Options that contradict each other (AckWait
// given with a Consumer, a Heartbeat not shorter than AckWait).
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
	maxDeliver := 0
	if o.Consumer != nil {
		if o.AckWait != 0 {
			return nil, fmt.Errorf("%w: natsdedup: AckWait %v given with a Consumer, whose AckWait is used; set one of them", idempotency.ErrInvalidConfig, o.AckWait)
		}
		ackWait, err := consumerAckWait(o.Consumer)
		if err != nil {
			return nil, err
		}
		o.AckWait = ackWait
		maxDeliver = o.Consumer.CachedInfo().Config.MaxDeliver
	}
	if o.AckWait == 0 {
		o.AckWait = DefaultAckWait
	}
	if lease := w.Lease(); lease > o.AckWait {
		return nil, fmt.Errorf("%w: natsdedup: the Window's Lease %v is longer than the consumer's AckWait %v: "+
			"JetStream would redeliver a dead consumer's message while its claim still blocks it, and the "+
			"redelivery would be Nak'ed at the cost of a delivery; give the Window a Lease of at most %v",
			idempotency.ErrInvalidConfig, lease, o.AckWait, o.AckWait)
	}
	if o.Heartbeat == 0 {
		o.Heartbeat = o.AckWait / 2
	}
	if o.Heartbeat >= o.AckWait {
		return nil, fmt.Errorf("%w: natsdedup: Heartbeat %v is not shorter than AckWait %v", idempotency.ErrInvalidConfig, o.Heartbeat, o.AckWait)
	}
	return &Handler{w: w, fn: fn, o: o, maxDeliver: maxDeliver}, nil
}

// consumerAckWait reads how long JetStream waits for c's acks, and checks
// that c acks explicitly.
func consumerAckWait(c jetstream.Consumer) (time.Duration, error) {
	info := c.CachedInfo()
	if info == nil {
		return 0, fmt.Errorf("%w: natsdedup: Consumer has no cached info", idempotency.ErrInvalidConfig)
	}
	cfg := info.Config
	if cfg.AckPolicy != jetstream.AckExplicitPolicy {
		return 0, fmt.Errorf("%w: natsdedup: consumer %q uses %v; the window needs AckExplicit (a Nak'ed duplicate would be acked by a later message's Ack, or never redelivered)",
			idempotency.ErrInvalidConfig, info.Name, cfg.AckPolicy)
	}
	ackWait := cfg.AckWait
	for _, b := range cfg.BackOff {
		if b > 0 && (ackWait <= 0 || b < ackWait) {
			ackWait = b
		}
	}
	return ackWait, nil
}

// MessageHandler returns a jetstream.MessageHandler for Consume that
// processes every message with ctx.
func (h *Handler) MessageHandler(ctx context.Context) jetstream.MessageHandler {
	return func(msg jetstream.Msg) { _, _ = h.Handle(ctx, msg) }
}

// Handle processes one message and answers it: Ack, Nak or NakWithDelay, or
// Term. It returns the window's decision and any error of processing or of
// sending the answer, joined with ErrMaxDeliveries when a Nak went out on
// the last delivery the consumer's MaxDeliver allows.
func (h *Handler) Handle(ctx context.Context, msg jetstream.Msg) (dedup.Decision, error) {
	id := h.msgID(msg)
	// The heartbeat starts with fn and lasts until the result is stored (or
	// fn panicked), so that storing it is covered too.
	var stop func()
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	d, err := h.w.Process(ctx, id, func(ctx context.Context) error {
		if h.o.Heartbeat > 0 {
			stop = heartbeat(msg, h.o.Heartbeat)
		}
		return h.fn(ctx, msg)
	})
	if stop != nil {
		stop()
		stop = nil
	}
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
	if d.Action == dedup.Nak && h.maxDeliver > 0 {
		// JetStream drops a message that has had its MaxDeliver deliveries
		// once it is Nak'ed (or its AckWait ends, if the Nak was lost),
		// telling only its advisory subject.
		if md, merr := msg.Metadata(); merr == nil && md.NumDelivered >= uint64(h.maxDeliver) {
			err = errors.Join(err, fmt.Errorf("natsdedup: %q: delivery %d of MaxDeliver %d: %w", id, md.NumDelivered, h.maxDeliver, ErrMaxDeliveries))
		}
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
	md, err := msg.Metadata()
	if err != nil {
		return "" // not a JetStream message: terminated by the window
	}
	// Both names are tokens of the ack subject, so neither holds a dot.
	scope := md.Stream + "." + md.Consumer + "."
	if id := msg.Headers().Get(jetstream.MsgIDHeader); id != "" {
		return scope + "id." + id
	}
	// The sequence alone is reused by a stream created again under the same
	// name; the time the message was stored is not, and every delivery of
	// one stored message carries the same.
	return scope + "seq." + strconv.FormatUint(md.Sequence.Stream, 10) + "." + strconv.FormatInt(md.Timestamp.UnixNano(), 10)
}

// heartbeat sends InProgress at once, then every interval until the
// returned stop is called; stop returns once no signal is being sent.
func heartbeat(msg jetstream.Msg, every time.Duration) (stop func()) {
	// At once: the message's AckWait has run since the server sent it, and
	// it may have waited in the client's buffer for most of it. A failed
	// signal is not fatal: the window's lease still holds off a
	// redelivered duplicate.
	_ = msg.InProgress()
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
				_ = msg.InProgress()
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}
