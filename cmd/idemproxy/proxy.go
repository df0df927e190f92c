package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemhttp"
)

// reqState travels in the context of one proxied request, from the outer
// handler through the middleware and the Guard to the upstream call and the
// store, so that an upstream failure can decide the fate of the claim.
type reqState struct {
	// keep is set when the upstream may have acted on the request but its
	// response is lost (timeout, reset, a body cut short): the claim must
	// then stay until its lease ends, never be released for an at-once retry.
	keep atomic.Bool
	// abandon cancels the context the middleware sees as the request's,
	// which makes idemhttp keep the claim of a response it does not store.
	abandon context.CancelFunc
}

type reqStateKey struct{}

func stateFrom(ctx context.Context) *reqState {
	st, _ := ctx.Value(reqStateKey{}).(*reqState)
	return st
}

// detach is the outermost proxy handler. It gives the request a context that
// ignores the client going away, so an upstream call once started finishes
// and its response is stored for the retry.
//
// It does what idemhttp's Options.Detach does, by hand, because Detach also
// turns off idemhttp's only way to keep a claim for a response it does not
// store (the request context being done when the handler returns), and the
// proxy needs exactly that after an upstream timeout.
func detach(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
		defer cancel()
		st := &reqState{abandon: cancel}
		h.ServeHTTP(w, r.WithContext(context.WithValue(ctx, reqStateKey{}, st)))
	})
}

// claimKeeper refuses to release the claim of a request whose upstream may
// have acted (reqState.keep): the key stays Processing until its lease ends,
// as after a crash. idemhttp releases the key of a handler that panics, and
// ReverseProxy panics (http.ErrAbortHandler) when the upstream breaks off in
// the middle of the body, after it has done the work.
type claimKeeper struct{ idempotency.Store }

func (s claimKeeper) Release(ctx context.Context, key string, token uint64) error {
	if st := stateFrom(ctx); st != nil && st.keep.Load() {
		return nil // kept; the lease ends by itself
	}
	return s.Store.Release(ctx, key, token)
}

func (s claimKeeper) Complete(ctx context.Context, key string, token uint64, resp idempotency.Response, now time.Time, retention time.Duration) error {
	if st := stateFrom(ctx); st != nil && st.keep.Load() {
		// A response cut short must not be replayed as if it were whole.
		return errUpstreamBroken
	}
	return s.Store.Complete(ctx, key, token, resp, now, retention)
}

var errUpstreamBroken = errors.New("idemproxy: upstream response incomplete; claim kept until its lease ends")

// newReverseProxy returns the proxy to the upstream. timeout bounds one
// upstream exchange (0: none).
func newReverseProxy(up *url.URL, timeout time.Duration, log *slog.Logger) http.Handler {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = 256
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up)
			pr.SetXForwarded()
			// net/http's Transport silently resends a body-less request
			// that carries Idempotency-Key when a reused connection fails
			// after it was written, trusting the upstream to deduplicate.
			// The upstream behind this proxy may not: the header is sent
			// under its lower-case name, which the Transport does not look
			// for and HTTP treats as the same field.
			if v, ok := pr.Out.Header["Idempotency-Key"]; ok {
				delete(pr.Out.Header, "Idempotency-Key")
				pr.Out.Header["idempotency-key"] = v
			}
		},
		Transport: transport,
		ModifyResponse: func(resp *http.Response) error {
			if st := stateFrom(resp.Request.Context()); st != nil {
				resp.Body = &watchedBody{ReadCloser: resp.Body, st: st}
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			upstreamError(w, r, err, log)
		},
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	if timeout <= 0 {
		return rp
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), timeout)
		defer cancel()
		rp.ServeHTTP(w, r.WithContext(ctx))
	})
}

// watchedBody marks the request when the upstream's body breaks off.
type watchedBody struct {
	io.ReadCloser
	st *reqState
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		b.st.keep.Store(true)
	}
	return n, err
}

// upstreamError answers a failed upstream exchange. A dial failure means
// nothing reached the upstream: 502, and the key is released (502 is not a
// stored status) so the retry runs at once. Anything else (a timeout, a
// reset after the request was written) may have had effects: 504 or 502,
// and the claim is kept until its lease ends.
func upstreamError(w http.ResponseWriter, r *http.Request, err error, log *slog.Logger) {
	p := idemhttp.Problem{Type: idemhttp.ProblemBase + "upstream-unreachable", Title: "Upstream service unreachable",
		Status: http.StatusBadGateway, Detail: "the request was not sent; retrying is safe"}
	sent := !notSent(err)
	if sent {
		p = idemhttp.Problem{Type: idemhttp.ProblemBase + "upstream-failed", Title: "Upstream service failed",
			Status: http.StatusBadGateway,
			Detail: "the request was sent but no response came back; it may have taken effect. A retry with the same key waits for the lease to end."}
		if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
			p.Status = http.StatusGatewayTimeout
			p.Title = "Upstream service timed out"
		}
		if st := stateFrom(r.Context()); st != nil {
			st.keep.Store(true)
			defer st.abandon() // after the response is written: idemhttp then keeps the claim
		}
	}
	log.LogAttrs(r.Context(), slog.LevelWarn, "upstream error", slog.String("method", r.Method),
		slog.String("path", r.URL.Path), slog.String("key_hash", keyHash(r)), slog.Bool("sent", sent),
		slog.Int("status", p.Status), slog.String("error", err.Error()))
	idemhttp.WriteProblem(w, p)
}

// notSent reports whether err proves that the request never reached the
// upstream: the connection could not be made.
func notSent(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns) || errors.Is(err, syscall.ECONNREFUSED)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// keyHash is what logs show of a request's Idempotency-Key: a short
// SHA-256 prefix, enough to correlate lines, useless to replay the key.
func keyHash(r *http.Request) string {
	vals := r.Header["Idempotency-Key"]
	if len(vals) == 0 {
		vals = r.Header["idempotency-key"]
	}
	if len(vals) == 0 {
		return ""
	}
	k, err := idemhttp.ParseKey(vals)
	if err != nil {
		return "invalid"
	}
	sum := sha256.Sum256([]byte(k))
	return hex.EncodeToString(sum[:6])
}

// logObserver logs each guarded request and hands it on to the metrics.
type logObserver struct {
	m   *metrics
	log *slog.Logger
}

func (o logObserver) Observe(e idemhttp.Event) {
	o.m.Observe(e)
	level := slog.LevelDebug
	switch e.Outcome {
	case idemhttp.Executed, idemhttp.Replayed, idemhttp.InFlight:
	case idemhttp.Unavailable, idemhttp.NotStored, idemhttp.LeaseLost, idemhttp.Abandoned:
		level = slog.LevelWarn
	default:
		level = slog.LevelInfo
	}
	ctx := context.Background()
	if !o.log.Enabled(ctx, level) {
		return
	}
	attrs := []slog.Attr{slog.String("outcome", string(e.Outcome)), slog.String("method", e.Request.Method),
		slog.String("path", e.Request.URL.Path), slog.String("key_hash", keyHash(e.Request)),
		slog.Int("status", e.Status), slog.Duration("latency", e.Latency)}
	if e.Err != nil {
		attrs = append(attrs, slog.String("error", e.Err.Error()))
	}
	o.log.LogAttrs(ctx, level, "request", attrs...)
}
