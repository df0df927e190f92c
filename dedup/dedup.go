// Package dedup is a consumer-side dedup window for at-least-once message
// delivery, built on idempotency.Guard: a message whose processing
// succeeded is acknowledged and dropped when it comes again inside the
// window, one whose processing failed is processed again, and one being
// processed by another consumer is negatively acknowledged with a delay.
//
// The window takes any idempotency.Store: the MemoryStore for one process,
// or an engine store (boltstore, redisstore, pgstore) shared by every
// consumer of a queue, which is what makes competing consumers and
// consumer restarts safe. The natsdedup subpackage adapts it to NATS
// JetStream.
//
// # What each layer deduplicates
//
// Brokers offer deduplication on the publish side, which this window does
// not replace:
//
//   - NATS JetStream drops a published message whose Nats-Msg-Id header it
//     saw within the stream's duplicate window (StreamConfig.Duplicates, 2
//     minutes by default). It covers a publisher retrying a publish whose
//     acknowledgement was lost, within that window. It does not cover
//     redelivery to consumers (AckWait expiry, Nak, a consumer dying before
//     it acks, an ack lost on the way back), nor a publisher that retries
//     after the window, nor two publishers giving one logical event two ids.
//   - Amazon SQS FIFO queues drop a message whose deduplication id (given,
//     or the SHA-256 of the body with content-based deduplication) was
//     accepted in the previous 5 minutes. Same scope: publish side only; a
//     received message whose visibility timeout expires is delivered again.
//   - Kafka's idempotent producer (enable.idempotence) numbers each
//     producer's batches per partition, so the broker drops a batch resent
//     after a lost acknowledgement. It holds for one producer session only
//     (a restarted producer without a transactional.id gets a new producer
//     id), and says nothing about consumers, which reprocess everything
//     after their last committed offset when they restart or rebalance.
//
// This window covers the consumer side: whatever the broker delivers twice,
// for whatever reason, runs the handler once per message id inside
// Options.Window, as long as the id names the logical message. That is why
// the id should come from the producer (a Nats-Msg-Id set from a business
// key, an event id), not from the broker's delivery: a broker sequence
// number dedups redeliveries of one stored message, but not a duplicate the
// producer stored twice.
//
// # Guarantees and limits
//
// fn runs at most once per id at a time, and at most once successfully per
// id inside the window. A success stored in the window is the evidence; if
// the store loses it (MemoryStore restarted, the record expired), a late
// redelivery runs fn again. If a consumer dies while fn runs, its claim
// blocks the id until its lease ends, then another consumer takes it over
// and runs fn again: fn's side effects must be made conditional on the
// fencing token (idempotency.TokenFrom) or be idempotent themselves for
// exactly-once effects across that case.
//
// The window fails closed: while the store cannot be reached, messages are
// Nak'ed and fn does not run. A claim whose answer was lost (the store
// applied the Begin, the caller saw a timeout or its ctx cancelled) is held
// by nobody and blocks the id until its lease ends, like a dead consumer's.
// When fn succeeds but its success cannot be stored (the store failed
// after the claim, or the claim was lost), Process still says Ack, and
// returns the error: the effect happened, and a Nak would run fn again at
// once. Nothing then records the success, so a copy of the message that
// comes after the claim's lease (a redelivery after a lost ack, a
// duplicate) runs fn again: report the error, and make the effect
// idempotent where that matters.
package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/archlab/idempotency"
)

// Action is what the consumer should tell the broker.
type Action string

const (
	// Ack: the message was processed, now or earlier; acknowledge it.
	Ack Action = "ACK"
	// Nak: process it again later, after Decision.Delay (0: at once).
	Nak Action = "NAK"
	// Term: the message can never be processed under its id (the id was
	// used by a different kind of message); stop redelivering it.
	Term Action = "TERM"
)

// Decision is the answer of Process.
type Decision struct {
	Action Action
	// Delay is how long to wait before a redelivery, for Nak.
	Delay time.Duration
	// Outcome is the Guard's outcome: Executed (fn ran now), Replayed (a
	// duplicate of a processed message), InFlight, Conflicted, Unavailable.
	Outcome idempotency.Outcome
}

// Options configure New; nil means all defaults.
type Options struct {
	// Window is how long a processed message id is remembered (0: 24h).
	// Redeliveries and duplicates later than that run fn again. It should
	// exceed the broker's longest redelivery horizon (for JetStream,
	// AckWait times MaxDeliver plus backoffs) and must be at least Lease
	// (New refuses a shorter one with idempotency.ErrInvalidConfig).
	Window time.Duration
	// Lease is how long a consumer's claim excludes the others while fn
	// runs (0: idempotency.DefaultLease, 30s). The claim is renewed while fn
	// runs; Lease bounds how long a consumer that died mid-message blocks
	// the id, and the Nak delay given to a duplicate. It should not outlast
	// the broker's redelivery timeout (natsdedup refuses a Lease longer
	// than the consumer's AckWait).
	Lease time.Duration
	// RenewEvery is the lease renewal interval (0: Lease/3; negative: none).
	RenewEvery time.Duration
	// Prefix is prepended to every message id in the store, to keep several
	// queues or consumer groups apart in one store ("" : none).
	Prefix string
	// RetryDelay is the Nak delay after fn failed (0: at once).
	RetryDelay time.Duration
	// UnavailableDelay is the Nak delay when the store cannot be reached
	// (0: 1s).
	UnavailableDelay time.Duration
	// MinDelay is the least Nak delay for a message in flight elsewhere, so
	// that a holder near the end of its lease is not polled in a loop
	// (0: 10ms).
	MinDelay time.Duration
	// Now is the clock given to the store (nil: time.Now).
	Now func() time.Time
}

// ErrNoID is returned (wrapped) by Process for an empty message id, with
// Term and the outcome Conflicted: a message without an id cannot be
// deduplicated, and redelivering it cannot help. fn does not run.
var ErrNoID = errors.New("dedup: empty message id")

// Window deduplicates messages by id. It is safe for concurrent use.
type Window struct {
	guard *idempotency.Guard
	opts  Options
}

// fingerprint is the same for every message: the id alone names it.
const fingerprint = "dedup/v1"

// New returns a Window on store, with its options validated.
func New(store idempotency.Store, opts *Options) (*Window, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if store == nil {
		return nil, fmt.Errorf("%w: dedup: nil store", idempotency.ErrInvalidConfig)
	}
	switch {
	case o.RetryDelay < 0:
		return nil, fmt.Errorf("%w: dedup: RetryDelay %v is negative", idempotency.ErrInvalidConfig, o.RetryDelay)
	case o.UnavailableDelay < 0:
		return nil, fmt.Errorf("%w: dedup: UnavailableDelay %v is negative", idempotency.ErrInvalidConfig, o.UnavailableDelay)
	case o.MinDelay < 0:
		return nil, fmt.Errorf("%w: dedup: MinDelay %v is negative", idempotency.ErrInvalidConfig, o.MinDelay)
	case o.Window < 0:
		return nil, fmt.Errorf("%w: dedup: Window %v is negative", idempotency.ErrInvalidConfig, o.Window)
	}
	// Checked here rather than left to the Guard, whose error would name
	// its Retention, an option a dedup user never set.
	if window, lease := withDefault(o.Window, idempotency.DefaultRetention), withDefault(o.Lease, idempotency.DefaultLease); lease.d > 0 && window.d < lease.d {
		return nil, fmt.Errorf("%w: dedup: Window %v is shorter than Lease %v", idempotency.ErrInvalidConfig, window, lease)
	}
	if o.UnavailableDelay == 0 {
		o.UnavailableDelay = time.Second
	}
	if o.MinDelay == 0 {
		o.MinDelay = 10 * time.Millisecond
	}
	g, err := idempotency.NewGuard(store, &idempotency.Options{
		Lease: o.Lease, Retention: o.Window, RenewEvery: o.RenewEvery, Now: o.Now,
	})
	if err != nil {
		return nil, fmt.Errorf("dedup: %w", err)
	}
	return &Window{guard: g, opts: o}, nil
}

// setting is a duration option as New sees it: set, or the default that
// its zero value stands for.
type setting struct {
	d   time.Duration
	def bool
}

func withDefault(d, def time.Duration) setting {
	if d == 0 {
		return setting{def, true}
	}
	return setting{d, false}
}

func (s setting) String() string {
	if s.def {
		return s.d.String() + " (default)"
	}
	return s.d.String()
}

// Process runs fn for the message msgID unless it was processed inside the
// window, and says what to tell the broker:
//
//   - fn ran and succeeded: Ack, nil. If its success could not be stored
//     (the store failed, or the claim was lost), still Ack, on purpose (the
//     effect happened; a Nak would run fn again at once), with an error
//     wrapping idempotency.ErrNotStored, and idempotency.ErrUnavailable
//     or idempotency.ErrLeaseLost.
//     Nothing records the success: a redelivery or duplicate that comes
//     after the claim's lease runs fn again.
//   - msgID was processed before: Ack, nil; fn does not run.
//   - fn failed: Nak after Options.RetryDelay, and fn's error. The id is
//     released, so the redelivery runs fn again without waiting for the
//     lease. If the release could not reach the store, the error says so
//     too (it wraps idempotency.ErrNotReleased and ErrUnavailable) and the
//     Nak waits at least the lease, after which the claim may be taken
//     over. If the claim was lost while fn ran, the error says so
//     too; the id is not released (another consumer may hold it).
//   - msgID is claimed by another consumer (or by a consumer that died, or
//     by a Begin whose answer was lost): Nak with the time left on its
//     lease (at least Options.MinDelay), nil; fn does not run.
//   - the store cannot be reached, or ctx is done before the claim or
//     while it is made: Nak after Options.UnavailableDelay, and an error
//     wrapping idempotency.ErrUnavailable; fn does not run. A claim the
//     store granted is released; one whose Begin failed may still have
//     been made (see the package doc).
//   - msgID is held by a record of another kind: Term, and an error
//     wrapping idempotency.ErrConflict.
//
// fn runs with a context carrying the fencing token (idempotency.TokenFrom)
// that is cancelled when ctx is, when another consumer takes the id over,
// shortly before the lease runs out while renewals cannot reach the store,
// and when fn returns. A cancel that lands just after the claim (after the
// Guard's last look at ctx) can reach fn as it starts. An empty msgID is refused
// (Term, Conflicted, ErrNoID): a message without an id cannot be
// deduplicated.
func (w *Window) Process(ctx context.Context, msgID string, fn func(ctx context.Context) error) (Decision, error) {
	if msgID == "" {
		return Decision{Action: Term, Outcome: idempotency.Conflicted}, ErrNoID
	}
	var fnErr error
	var standIn *fnFailed
	res, err := w.guard.Run(ctx, w.opts.Prefix+msgID, fingerprint, func(ctx context.Context) (idempotency.Response, error) {
		if fnErr = fn(ctx); fnErr != nil {
			// Processed again on redelivery: the message's work is not done,
			// and fn is the one to know whether a partial effect must be
			// undone first. The Guard gets a stand-in, taken out again
			// below: what fn's error wraps must not pass for the Guard's
			// own errors, nor the mark reach the caller.
			standIn = &fnFailed{fnErr}
			return idempotency.Response{}, idempotency.Retryable(standIn)
		}
		return idempotency.Response{}, nil
	})
	d := Decision{Outcome: res.Outcome}
	switch res.Outcome {
	case idempotency.Replayed:
		d.Action = Ack
		return d, nil
	case idempotency.InFlight:
		d.Action = Nak
		d.Delay = max(res.LeaseUntil.Sub(w.now()), w.opts.MinDelay)
		return d, nil
	case idempotency.Conflicted:
		d.Action = Term
		return d, fmt.Errorf("dedup: message id %q: %w", msgID, err)
	case idempotency.Unavailable:
		d.Action = Nak
		d.Delay = w.opts.UnavailableDelay
		return d, err
	}
	// Executed.
	if fnErr != nil {
		d.Action = Nak
		d.Delay = w.opts.RetryDelay
		// err is the stand-in (released), the stand-in joined with the
		// release's error, or the lease's loss joined with the stand-in
		// (not released), which the Guard then carries with its mark
		// hidden: whatever carries the stand-in is fn's error, already
		// first in errs.
		errs := []error{fnErr}
		keep := func(e error) {
			if f := (*fnFailed)(nil); !errors.As(e, &f) || f != standIn {
				errs = append(errs, e)
			}
		}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				keep(e)
			}
		} else if err != nil {
			keep(err)
		}
		if len(errs) == 1 {
			return d, fnErr
		}
		if errors.Is(err, idempotency.ErrNotReleased) && errors.Is(err, idempotency.ErrUnavailable) {
			// The release failed, the claim still this consumer's (not
			// ErrLeaseLost): it stays until its lease ends. The stand-in
			// wraps nothing, so only the Guard's errors are asked.
			d.Delay = max(d.Delay, w.Lease())
		}
		return d, errors.Join(errs...)
	}
	// fn succeeded. A non-nil err says its success could not be recorded
	// (store unavailable, lease lost): still Ack, the effect happened.
	d.Action = Ack
	return d, err
}

// fnFailed stands for fn's error before the Guard, which needs to know
// only that fn failed.
type fnFailed struct{ err error }

func (e *fnFailed) Error() string { return e.err.Error() }

func (w *Window) now() time.Time {
	if w.opts.Now != nil {
		return w.opts.Now()
	}
	return time.Now()
}

// Lease returns how long a consumer's claim excludes the others:
// Options.Lease, or idempotency.DefaultLease when that was 0. An adapter
// checks it against the broker's redelivery timeout (natsdedup: AckWait):
// a lease that outlasts it makes the broker redeliver a dead consumer's
// message while the claim still blocks it.
func (w *Window) Lease() time.Duration {
	if w.opts.Lease > 0 {
		return w.opts.Lease
	}
	return idempotency.DefaultLease
}
