package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemhttp"
)

// newReverseProxy returns the proxy to the upstream. timeout bounds one
// upstream exchange (0: none). A guarded request comes already bounded by
// the Guard's Timeout; the rest get a context.WithTimeout here. transport
// is nil (a clone of http.DefaultTransport) but in tests.
func newReverseProxy(up *url.URL, timeout time.Duration, log *slog.Logger, transport *http.Transport) http.Handler {
	if transport == nil {
		transport = http.DefaultTransport.(*http.Transport).Clone()
	}
	transport.MaxIdleConnsPerHost = 256
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up)
			pr.SetXForwarded()
			if _, guarded := idempotency.TokenFrom(pr.In.Context()); guarded {
				// The middleware has read the body whole (and the server
				// sent the client its 100 Continue): the upstream has no
				// body left to refuse, and one that does not support Expect
				// would answer 417, a stored status, for the whole window.
				pr.Out.Header.Del("Expect")
				// The middleware hands over the body from memory, and
				// the Transport sends a body it knows to be in memory in
				// one write with the head; ReverseProxy's own wrapper
				// (which keeps the Transport from closing a body still
				// arriving from the client) hides it, and costs a second
				// write and packet per request. A body in memory has
				// nothing left to arrive, and closing it does nothing.
				if pr.Out.Body != nil {
					pr.Out.Body = pr.In.Body
				}
			}
			// net/http's Transport silently resends a body-less request
			// that carries Idempotency-Key or X-Idempotency-Key when a
			// reused connection fails after it was written, trusting the
			// upstream to deduplicate. The upstream behind this proxy may
			// not: the fields are sent under their lower-case names, which
			// the Transport does not look for and HTTP treats as the same.
			for _, f := range [...]struct{ name, lower string }{
				{"Idempotency-Key", "idempotency-key"}, {"X-Idempotency-Key", "x-idempotency-key"},
			} {
				if v, ok := pr.Out.Header[f.name]; ok {
					delete(pr.Out.Header, f.name)
					pr.Out.Header[f.lower] = v
				}
			}
		},
		Transport: transport,
		ModifyResponse: func(res *http.Response) error {
			if hs, ok := res.Request.Context().Value(handshakeKey{}).(*time.Timer); ok && res.StatusCode == http.StatusSwitchingProtocols {
				hs.Stop() // the handshake is over
			}
			return nil
		},
		// Without a pool ReverseProxy allocates a 32 KiB copy buffer per
		// request, the largest allocation on the proxy's path.
		BufferPool: &bufferPool{},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			upstreamError(w, r, err, log)
		},
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !r.ProtoAtLeast(1, 1) {
			w = &informationalFilter{w}
		}
		if dl, ok := r.Context().Deadline(); timeout > 0 && (!ok || time.Until(dl) > timeout) {
			if isUpgrade(r) {
				// -upstream-timeout bounds the handshake; the connection
				// it upgrades (a WebSocket) lasts as long as its ends
				// keep it, and ReverseProxy closes it when ctx ends.
				ctx, cancel := context.WithCancelCause(r.Context())
				defer cancel(nil)
				hs := time.AfterFunc(timeout, func() { cancel(errHandshakeTimeout) })
				defer hs.Stop()
				r = r.WithContext(context.WithValue(ctx, handshakeKey{}, hs))
			} else {
				ctx, cancel := context.WithTimeout(r.Context(), timeout)
				defer cancel() // after the cutter is stopped (defers run last first)
				r = r.WithContext(ctx)
			}
		}
		if timeout <= 0 {
			// With -upstream-timeout, every response's writing is bounded
			// from its first byte (budgetWriter), which is what the cutter
			// would bound here, at most the time before that byte later,
			// for a context.AfterFunc per request less.
			c := &writeCutter{w: w}
			stop := context.AfterFunc(r.Context(), c.cut)
			defer c.stop(stop)
		}
		rp.ServeHTTP(w, r)
	})
}

// handshakeKey is the context key of an upgrade request's handshake
// timer, which ends the exchange at -upstream-timeout unless the upstream
// switched protocols by then.
type handshakeKey struct{}

// errHandshakeTimeout ends an upgrade request's exchange when the upstream
// did not switch protocols within -upstream-timeout.
var errHandshakeTimeout = fmt.Errorf("the upstream did not switch protocols within -upstream-timeout: %w", context.DeadlineExceeded)

// isUpgrade reports whether r asks to switch protocols (a WebSocket's
// handshake): an Upgrade field named in Connection.
func isUpgrade(r *http.Request) bool {
	if r.Header.Get("Upgrade") == "" {
		return false
	}
	for _, v := range r.Header["Connection"] {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "upgrade") {
				return true
			}
		}
	}
	return false
}

// writeCutter ends a write to the client that blocks past the end of the
// exchange's context (a lost lease, the client gone) when -upstream-timeout
// is 0; otherwise the response's write budget bounds such a write.
// ReverseProxy stops when its context ends, but not while it is blocked
// writing to a client that stopped reading: without a write deadline that
// write, and with it the handler, the upstream connection and the claim,
// would last as long as the client keeps its connection open. When the
// context ends, writes get cutGrace more (the 504 that may follow is a
// few hundred bytes); a write blocked past it fails, the response is cut
// off (its claim kept, as for any response cut short) and the connection
// closed. The server lifts the deadline once it has written the response,
// before the connection's next request.
type writeCutter struct {
	w    http.ResponseWriter
	mu   sync.Mutex
	done bool // the handler returned: the deadline is no longer its to set
}

const cutGrace = time.Second

func (c *writeCutter) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.done {
		_ = http.NewResponseController(c.w).SetWriteDeadline(time.Now().Add(cutGrace))
	}
}

func (c *writeCutter) stop(stop func() bool) {
	if stop() {
		return // cut never ran, and now never will
	}
	// The deadline cut set stays: it bounds the server's last flush of
	// the response, after the handler; the server lifts it after that.
	c.mu.Lock()
	defer c.mu.Unlock()
	c.done = true
}

// informationalFilter keeps from an HTTP/1.0 client the informational
// (1xx) responses that ReverseProxy relays from the upstream (103 Early
// Hints): it would take one for the final response, and RFC 9110 (section
// 15.2) forbids sending it one. 101 Switching Protocols is a final status
// here and passes.
type informationalFilter struct{ http.ResponseWriter }

func (f *informationalFilter) WriteHeader(code int) {
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		return
	}
	f.ResponseWriter.WriteHeader(code)
}

// Unwrap gives http.ResponseController (Flush, Hijack for upgrades) and
// idemhttp.KeepClaim the writer underneath.
func (f *informationalFilter) Unwrap() http.ResponseWriter { return f.ResponseWriter }

// bufferPool recycles ReverseProxy's copy buffers.
type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, 32<<10)
}

func (b *bufferPool) Put(buf []byte) { b.p.Put(&buf) }

// upstreamError answers a failed upstream exchange. A dial failure means
// nothing reached the upstream: 502, and the key is released (502 is not a
// stored status) so the retry runs at once. Anything else (a timeout, a
// reset after the request was written) may have had effects: 504 or 502,
// and the claim is kept until its lease ends (idemhttp.KeepClaim).
//
// A response that breaks off after its header was sent (the upstream resets
// the connection mid-body) does not come here: ReverseProxy aborts it with
// http.ErrAbortHandler, on which idemhttp keeps the claim too.
func upstreamError(w http.ResponseWriter, r *http.Request, err error, log *slog.Logger) {
	p := idemhttp.Problem{Type: idemhttp.ProblemBase + "upstream-unreachable", Title: "Upstream service unreachable",
		Status: http.StatusBadGateway, Detail: "the request was not sent; retrying is safe"}
	sent := !notSent(err)
	if bodyTimedOut(r, err) {
		// The client's body did not come in time (unguarded: the Transport
		// was streaming it). The upstream got a body cut short, which it
		// does not act on.
		p = idemhttp.Problem{Type: idemhttp.ProblemBase + "body-timeout", Title: "Request body timed out",
			Status: http.StatusRequestTimeout, Detail: "the request body did not arrive in time"}
		sent = false
	} else if sent {
		p = idemhttp.Problem{Type: idemhttp.ProblemBase + "upstream-failed", Title: "Upstream service failed",
			Status: http.StatusBadGateway,
			Detail: "the request was sent but no response came back; it may have taken effect. A retry with the same key waits for the lease to end."}
		if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
			p.Status = http.StatusGatewayTimeout
			p.Title = "Upstream service timed out"
		}
		// Neither stored nor released: the claim stays until its lease
		// ends. (Outside a guarded request this does nothing.)
		idemhttp.KeepClaim(w)
	}
	log.LogAttrs(r.Context(), slog.LevelWarn, "upstream error", slog.String("method", r.Method),
		slog.String("path", r.URL.Path), slog.String("key_hash", keyHash(r)), slog.Bool("sent", sent),
		slog.Int("status", p.Status), slog.String("error", err.Error()))
	idemhttp.WriteProblem(w, p)
}

// notSent reports whether err proves that the request never reached the
// upstream: the connection could not be made, or its TLS handshake
// failed.
func notSent(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns) || errors.Is(err, syscall.ECONNREFUSED) || handshakeFailed(err)
}

// handshakeFailed reports whether err is the failure of a TLS handshake
// with the upstream. The Transport writes a request only once the
// handshake is complete, so none of these follows a request the
// upstream's HTTP side has seen. Every test is of an error that only a
// handshake returns: an error that may also come later (a reset, EOF, an
// alert such as bad record MAC) keeps counting as sent.
func handshakeFailed(err error) bool {
	var verify *tls.CertificateVerificationError
	if errors.As(err, &verify) {
		return true // the upstream's certificate was not trusted
	}
	var record tls.RecordHeaderError
	if errors.As(err, &record) && record.Conn != nil {
		return true // the first record was not TLS: an http:// upstream named as https://
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "remote error" && op.Err != nil && handshakeAlerts[op.Err.Error()] {
		// The upstream refused the handshake. Under TLS 1.3 a refused
		// client certificate is read only after the request was written,
		// but the server's TLS layer never handed that request on.
		return true
	}
	// The Transport's TLSHandshakeTimeout error has an unexported type:
	// its text is all there is to recognise it by.
	for e := err; e != nil; e = errors.Unwrap(e) {
		if e.Error() == "net/http: TLS handshake timeout" {
			return true
		}
	}
	return false
}

// handshakeAlerts are the texts crypto/tls gives the alerts that a server
// sends only while it negotiates a connection (RFC 8446 section 6.2).
var handshakeAlerts = map[string]bool{
	"tls: handshake failure": true, "tls: bad certificate": true, "tls: unsupported certificate": true,
	"tls: revoked certificate": true, "tls: expired certificate": true, "tls: unknown certificate": true,
	"tls: unknown certificate authority": true, "tls: access denied": true,
	"tls: protocol version not supported": true, "tls: insufficient security level": true,
	"tls: missing extension": true, "tls: unsupported extension": true, "tls: unrecognized name": true,
	"tls: certificate required": true, "tls: no application protocol": true,
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

// redactKey hides r's Idempotency-Key in msg: a store's error may name the
// stored key it failed on, quoted (bolt's does for a damaged record):
// "<scope>\x00<key>". Only the key in that form is replaced; a short key
// (a, 1) must not turn "unavailable" or 127.0.0.1 into nonsense.
func redactKey(msg string, r *http.Request) string {
	k, err := idemhttp.ParseKey(r.Header["Idempotency-Key"])
	if err != nil {
		return msg
	}
	q := strconv.Quote(k)
	return strings.ReplaceAll(msg, `\x00`+q[1:], `\x00<key>"`)
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
		attrs = append(attrs, slog.String("error", redactKey(e.Err.Error(), e.Request)))
	}
	o.log.LogAttrs(ctx, level, "request", attrs...)
}
