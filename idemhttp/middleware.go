package idemhttp

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/certid"
	"github.com/archlab/idempotency/internal/keepclaim"
)

// Defaults for the zero values of Options.
const (
	DefaultMaxBody           = 1 << 20
	DefaultMaxStoredResponse = 1 << 20
	// DefaultWindowHeader names the response header that says until when
	// the key is remembered (an IMF-fixdate). It is not standardized.
	DefaultWindowHeader = "Idempotency-Expires"
	// ReplayedHeader marks a replayed response (value "true").
	ReplayedHeader = "Idempotent-Replayed"
)

// ErrResponseTooLarge is the Event.Err of an Executed request whose
// response outgrew Options.MaxStoredResponse: it was delivered, and a marker
// was stored in its place, so a retry gets ProblemNotReplayable.
var ErrResponseTooLarge = errors.New("idemhttp: response too large to store")

var (
	errHijacked         = errors.New("idemhttp: connection hijacked, nothing to store")
	errStatusRelease    = errors.New("idemhttp: status not stored, key released")
	errClientGone       = errors.New("idemhttp: client went away and the status is not stored; claim kept until the lease ends")
	errHandlerCut       = errors.New("idemhttp: the handler's context ended (the Guard's Timeout) and the status is not stored; claim kept until the lease ends")
	errPanic            = errors.New("idemhttp: handler panicked, key released")
	errPanicKept        = errors.New("idemhttp: handler panicked and the key could not be released; claim kept until the lease ends")
	errAborted          = errors.New("idemhttp: handler aborted the response (http.ErrAbortHandler); claim kept until the lease ends")
	errPanicAfterStatus = errors.New("idemhttp: handler panicked after it sent a status that is stored (or called KeepClaim); claim kept until the lease ends")
	errGoexitKept       = errors.New("idemhttp: handler called runtime.Goexit after it sent a status that is stored (or called KeepClaim); claim kept until the lease ends")
	errBodyTooLarge     = errors.New("idemhttp: request body too large")
)

// ErrClaimKept is the Event.Err of a request whose handler called
// KeepClaim: the response was sent but not stored, and the key stays
// claimed until its lease ends (Outcome Abandoned).
var ErrClaimKept = errors.New("idemhttp: the handler kept the claim; response not stored, key held until the lease ends")

// markerKey, in a stored Header, marks a response that was too large to
// store. Like trailerKey its colon makes it an invalid field name.
const markerKey = "Idemhttp:Marker"

var tooLargeMarker = map[string][]string{markerKey: {"response-too-large"}}

// cutMarker marks a response that was cut short: a write to the client
// failed (without Detach), and the handler may have stopped there.
var cutMarker = map[string][]string{markerKey: {"response-cut"}}

// errResponseCut is the Event.Err of an Executed request whose response
// was cut short; cutMarker was stored in its place.
var errResponseCut = errors.New("idemhttp: a write to the client failed, the response may be cut short; stored as not replayable")

// Options configure New; nil means all defaults. Every zero value is usable.
type Options struct {
	// Methods are the guarded methods (nil: POST and PATCH). Others pass
	// through untouched. Methods are case-sensitive (RFC 9110, section
	// 9.1) and matched as the client sent them, so New refuses a standard
	// method not spelled in upper case ("post" would guard no POST), and
	// an empty, non-nil list, which would guard nothing. Other methods
	// (WebDAV's, custom ones) are taken as spelled.
	Methods []string
	// Required makes a guarded request without Idempotency-Key a 400
	// (missing-key) instead of passing it through unguarded.
	Required bool
	// Scope returns the namespace of a request's key, typically the
	// authenticated principal or tenant. The stored key is
	// Scope(r) + "\x00" + key, so one caller's response is never replayed to
	// another (a key holds no NUL, so the last NUL splits them). nil:
	// DefaultScope (the Authorization header or the TLS client
	// certificate's identity, hashed).
	Scope func(r *http.Request) string
	// FingerprintHeaders are the request header fields that, with the
	// method, path, canonical query and body, make the fingerprint. nil:
	// Content-Type; an empty non-nil slice: none.
	FingerprintHeaders []string
	// MaxBody bounds the request body read to fingerprint it (0:
	// DefaultMaxBody). A larger body gets 413 and the handler does not run.
	MaxBody int64
	// MaxStoredResponse bounds the stored body (0: DefaultMaxStoredResponse).
	// A larger response is delivered and the key completed with a marker:
	// retries get 409 response-not-replayable, they do not run again.
	MaxStoredResponse int
	// StoreStatus says whether a response with this status is stored and
	// replayed. When it is not, the key is released so a retry runs at once
	// (but see the package doc about clients that go away). nil:
	// DefaultStoreStatus.
	StoreStatus func(status int) bool
	// StoreHeader says whether a response header field is stored and
	// replayed. It gets the field's canonical name, whatever the case the
	// handler set it in. nil: DefaultStoreHeader. The window header,
	// Idempotent-Replayed, Connection and the fields that Connection names
	// (hop-by-hop, RFC 9110 section 7.6.1) are never stored, whatever it
	// says.
	StoreHeader func(name string) bool
	// ConflictStatus is the status for a key reused with another request:
	// 422 (the default, per the draft) or 409 (draft issue #42).
	ConflictStatus int
	// Wait, when positive, makes a request that finds its key in flight
	// wait up to that long for the first one to finish and replay its
	// response (or run, if the first released the key) instead of getting
	// 409 at once.
	Wait time.Duration
	// Detach runs the handler with a context that is not cancelled when the
	// client goes away (it is still cancelled if the lease is lost), so an
	// operation started is finished and its response stored. Writes to a
	// client that is gone are then captured and report success, so that a
	// handler that stops at a write error (httputil.ReverseProxy) finishes.
	Detach bool
	// UnavailableRetryAfter is the Retry-After of a 503 when the store is
	// unavailable (0: 1s). It is rounded up to whole seconds.
	UnavailableRetryAfter time.Duration
	// WindowHeader names the response header advertising when the key
	// leaves the window ("": DefaultWindowHeader, "-": none).
	WindowHeader string
	// Observer, if set, sees the outcome of every guarded request.
	Observer Observer
}

// Middleware guards handlers with an idempotency.Guard. Build it with New;
// it is safe for concurrent use.
type Middleware struct {
	guard          *idempotency.Guard
	methods        []string
	required       bool
	scope          func(*http.Request) string
	fpHeaders      []string
	maxBody        int64
	maxStored      int
	storePolicy    func(int) bool
	storeHeader    func(string) bool
	conflictStatus int
	conflictDetail string
	wait           time.Duration
	detach         bool
	retryAfter503  string
	windowHeader   string
	observer       Observer
	retention      time.Duration
	window         dateCache
}

// standardMethod returns the method of RFC 9110 (or PATCH, RFC 5789) that
// meth spells in any case, or "".
func standardMethod(meth string) string {
	for _, std := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace} {
		if strings.EqualFold(meth, std) {
			return std
		}
	}
	return ""
}

// New returns a Middleware running guarded requests through guard. Options
// are validated here; an error wraps idempotency.ErrInvalidConfig.
func New(guard *idempotency.Guard, opts *Options) (*Middleware, error) {
	if guard == nil {
		return nil, fmt.Errorf("%w: idemhttp: guard is nil", idempotency.ErrInvalidConfig)
	}
	if err := guard.Validate(); err != nil {
		return nil, fmt.Errorf("idemhttp: guard: %w", err)
	}
	if opts == nil {
		opts = &Options{}
	}
	m := &Middleware{
		guard: guard, required: opts.Required, scope: opts.Scope,
		maxBody: opts.MaxBody, maxStored: opts.MaxStoredResponse,
		storePolicy: opts.StoreStatus, storeHeader: opts.StoreHeader,
		conflictStatus: opts.ConflictStatus, wait: opts.Wait, detach: opts.Detach,
		windowHeader: opts.WindowHeader, observer: opts.Observer,
		retention: guard.Retention,
	}
	invalid := func(format string, args ...any) (*Middleware, error) {
		return nil, fmt.Errorf("%w: idemhttp: "+format, append([]any{idempotency.ErrInvalidConfig}, args...)...)
	}
	if m.retention == 0 {
		m.retention = idempotency.DefaultRetention
	}
	m.methods = []string{http.MethodPost, http.MethodPatch}
	if opts.Methods != nil {
		if len(opts.Methods) == 0 {
			return invalid("Methods is empty: it would guard no request (nil means POST and PATCH)")
		}
		m.methods = nil
		for _, meth := range opts.Methods {
			if !validToken(meth) {
				return invalid("method %q is not a token", meth)
			}
			if std := standardMethod(meth); std != "" && std != meth {
				return invalid("method %q is not %s: methods are case-sensitive, and %q would guard no %s request", meth, std, meth, std)
			}
			m.methods = append(m.methods, meth)
		}
	}
	m.fpHeaders = []string{"Content-Type"}
	if opts.FingerprintHeaders != nil {
		m.fpHeaders = []string{}
		for _, name := range opts.FingerprintHeaders {
			if !validToken(name) {
				return invalid("fingerprint header %q is not a field name", name)
			}
			m.fpHeaders = append(m.fpHeaders, textproto.CanonicalMIMEHeaderKey(name))
		}
	}
	// What a key-reused problem names as the parts that differ.
	parts := append([]string{"method", "path", "query"}, m.fpHeaders...)
	m.conflictDetail = strings.Join(parts, ", ") + " or body differ from those of the first request with this key: use a new key for a new request"
	switch {
	case m.maxBody < 0:
		return invalid("MaxBody %d is negative", m.maxBody)
	case m.maxBody == 0:
		m.maxBody = DefaultMaxBody
	}
	switch {
	case m.maxStored < 0:
		return invalid("MaxStoredResponse %d is negative", m.maxStored)
	case m.maxStored == 0:
		m.maxStored = DefaultMaxStoredResponse
	}
	switch m.conflictStatus {
	case 0:
		m.conflictStatus = http.StatusUnprocessableEntity
	case http.StatusUnprocessableEntity, http.StatusConflict:
	default:
		return invalid("ConflictStatus %d is neither 409 nor 422", m.conflictStatus)
	}
	if m.wait < 0 {
		return invalid("Wait %v is negative", m.wait)
	}
	switch ra := opts.UnavailableRetryAfter; {
	case ra < 0:
		return invalid("UnavailableRetryAfter %v is negative", ra)
	case ra == 0:
		m.retryAfter503 = "1"
	default:
		m.retryAfter503 = strconv.FormatInt(int64((ra+time.Second-1)/time.Second), 10)
	}
	switch m.windowHeader {
	case "":
		m.windowHeader = DefaultWindowHeader
	case "-":
		m.windowHeader = ""
	default:
		if !validToken(m.windowHeader) {
			return invalid("WindowHeader %q is not a field name", m.windowHeader)
		}
		m.windowHeader = textproto.CanonicalMIMEHeaderKey(m.windowHeader)
	}
	return m, nil
}

// Handler returns next guarded by m. Its signature fits chi's and most
// routers' middleware: r.Use(m.Handler).
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(next, w, r) })
}

// StoreKey returns the key the middleware stores for a request whose scope
// (Options.Scope, or DefaultScope) is scope and whose Idempotency-Key, as
// ParseKey returns it, is key. Operator tools use it to find a request's
// record in the store (Store.Get, Delete, Release).
func StoreKey(scope, key string) string { return scope + "\x00" + key }

// KeepClaim marks the guarded request that w answers: the response the
// handler writes is sent but not stored, and the key is not released either.
// The claim is kept until its lease ends, as after a crash, and only then
// may a retry run the handler again (meanwhile retries get 409). Call it
// when the operation may have taken effect but its outcome is unknown, for
// example when a proxied upstream timed out after the request was sent;
// call it before writing the status, so that the response does not
// advertise a window (Options.WindowHeader) for a key that is not stored.
// It works on the ResponseWriter the middleware handed to the handler, or
// on one that wraps it and has an Unwrap() http.ResponseWriter method. It
// reports whether w belongs to a guarded request whose handler has not
// returned; for any other writer, or once the handler returned (from a
// goroutine it started), it does nothing and returns false. The Observer
// sees Abandoned with ErrClaimKept.
func KeepClaim(w http.ResponseWriter) bool {
	for {
		if hw, ok := w.(*handlerWriter); ok {
			return hw.cw.keepClaim(hw.token)
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return false
		}
		w = u.Unwrap()
	}
}

// DefaultStoreStatus stores and replays 2xx, 3xx and 4xx responses except
// 408, 425 and 429, which, like 5xx, say "try again": their key is released.
func DefaultStoreStatus(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status >= 200 && status < 500
}

// DefaultStoreHeader stores every response header field but the hop-by-hop
// ones (Connection, Keep-Alive, Proxy-*, TE, Trailer, Transfer-Encoding,
// Upgrade), Date and Content-Length (net/http sets them again on replay),
// and Set-Cookie: a session cookie must not be handed out again days later,
// after the client rotated or ended its session, nor sit in the store.
// Names are compared in their canonical form: field names are
// case-insensitive, and a handler may set w.Header()["set-cookie"]. The
// fields that a response's Connection names are hop-by-hop too; a name
// alone does not tell them, so the middleware leaves them out itself,
// whatever the policy.
func DefaultStoreHeader(name string) bool {
	switch textproto.CanonicalMIMEHeaderKey(name) {
	case "Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization",
		"Te", "Trailer", "Transfer-Encoding", "Upgrade", "Date", "Content-Length", "Set-Cookie":
		return false
	}
	return true
}

// DefaultScope namespaces keys by the caller's credentials, as a truncated
// SHA-256 so that no credential reaches the store: the request's
// Authorization header or, for a request without one, the identity in its
// TLS client certificate (mTLS, as between services): the certificate's
// issuer, subject and alternative names, which stay the same when the
// certificate is renewed (the issuer counts, so the same names from two
// trusted CAs are two callers). Requests with neither share the anonymous
// scope "". A retry sent after the caller's token was renewed is in another
// scope and runs again. Set Options.Scope when callers are told apart
// otherwise (session cookies, an auth middleware's context value) or by a
// principal that outlives its tokens.
func DefaultScope(r *http.Request) string {
	var scratch []byte
	return string(appendDefaultScope(nil, &scratch, r))
}

// appendDefaultScope appends DefaultScope(r) to b, using *scratch (and
// keeping it, grown) to hash the credentials without allocating.
func appendDefaultScope(b []byte, scratch *[]byte, r *http.Request) []byte {
	s := (*scratch)[:0]
	prefix := "auth:"
	if auth := r.Header["Authorization"]; len(auth) > 0 {
		for _, a := range auth {
			s = append(s, a...)
			s = append(s, '\n')
		}
	} else if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		prefix = "tls:"
		s = certid.Append(s, r.TLS.PeerCertificates[0])
	} else {
		return b
	}
	*scratch = s
	sum := sha256.Sum256(s)
	b = append(b, prefix...)
	return hex.AppendEncode(b, sum[:16])
}

func (m *Middleware) storable(name string) bool {
	// net/http takes only "Trailer:" as the trailer prefix, but sends every
	// other field whatever the case of its name; so the policy sees the
	// canonical name (which costs nothing when name already is).
	if strings.HasPrefix(name, trailerKey) {
		return false
	}
	name = textproto.CanonicalMIMEHeaderKey(name)
	// Trailer is rebuilt on replay from the stored trailers. Connection
	// is the connection's, and so are the fields it names (which
	// captureWriter.WriteHeader drops, since they are known only from it).
	if name == ReplayedHeader || name == m.windowHeader || name == "Trailer" || name == "Connection" {
		return false
	}
	if m.storeHeader != nil {
		return m.storeHeader(name)
	}
	return DefaultStoreHeader(name)
}

func (m *Middleware) storeStatus(status int) bool {
	if m.storePolicy != nil {
		return m.storePolicy(status)
	}
	return DefaultStoreStatus(status)
}

func (m *Middleware) now() time.Time {
	if m.guard.Now != nil {
		return m.guard.Now()
	}
	return time.Now()
}

func (m *Middleware) guards(method string) bool {
	for _, g := range m.methods {
		if method == g {
			return true
		}
	}
	return false
}

// state is the per-request scratch space, pooled: buffers for the body, the
// stored key, the fingerprint and the captured response.
type state struct {
	fp      fingerprinter
	cw      captureWriter
	bodyBuf []byte
	key     []byte
	// token is the claim's fencing token once the handler runs.
	token uint64
	// goexitKept: the handler called runtime.Goexit after it sent a
	// stored status or called KeepClaim, and the Guard kept the claim.
	goexitKept bool
}

// maxPooledBuffer bounds the buffers kept in the pool; a larger one (after
// a large body or response) is left to the collector.
const maxPooledBuffer = 64 << 10

var statePool = sync.Pool{New: func() any {
	st := &state{}
	st.fp.h = sha256.New()
	st.cw.header = make(map[string][]string, 8)
	return st
}}

func (st *state) release() {
	st.cw.release()
	if cap(st.bodyBuf) > maxPooledBuffer {
		st.bodyBuf = nil
	}
	st.bodyBuf = st.bodyBuf[:0]
	st.key = st.key[:0]
	statePool.Put(st)
}

// readBody reads the request body, up to max bytes, into st.bodyBuf.
func (st *state) readBody(r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if r.ContentLength > limit {
		return nil, errBodyTooLarge
	}
	b := st.bodyBuf[:0]
	// Room for the declared length (+1 to see EOF without growing), up to
	// maxPooledBuffer: a declared length is a claim, not bytes received,
	// and a client that declares MaxBody and stalls must not hold that
	// much memory; a larger body grows the buffer as it arrives.
	if want := min(r.ContentLength+1, maxPooledBuffer); r.ContentLength > 0 && int64(cap(b)) < want {
		b = make([]byte, 0, want)
	}
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Body.Read(b[len(b):min(int64(cap(b)), limit+1)])
		b = b[:len(b)+n]
		if int64(len(b)) > limit {
			st.bodyBuf = b
			return nil, errBodyTooLarge
		}
		if err == io.EOF {
			st.bodyBuf = b
			return b, nil
		}
		if err != nil {
			st.bodyBuf = b
			return nil, err
		}
	}
}

// exchange is what a handler gets of its own: its writer and a reader over
// its copy of the body, with room for a small body inline, so that both
// cost one allocation (and the body's io.ReadCloser a second, of 16 bytes).
type exchange struct {
	hw     handlerWriter
	body   bytes.Reader
	inline [512]byte
}

// newExchange returns an exchange whose body is a copy of b that nothing
// else will reuse.
func newExchange(b []byte) *exchange {
	ex := &exchange{}
	if len(b) <= len(ex.inline) {
		ex.body.Reset(ex.inline[:copy(ex.inline[:], b)])
	} else {
		ex.body.Reset(slices.Clone(b))
	}
	return ex
}

// handlerBody gives the handler the body the middleware read. It is an
// io.NopCloser over a *bytes.Reader, not a type of the package's own:
// net/http's Transport knows those two hold their bytes in memory, and
// sends the head and the body of a request it forwards (a handler that
// proxies, idemproxy's) in one write, where for any other reader it
// flushes the head on its own first, one more system call and packet per
// request.
func (ex *exchange) handlerBody() io.ReadCloser { return io.NopCloser(&ex.body) }

func (m *Middleware) serve(next http.Handler, w http.ResponseWriter, r *http.Request) {
	if !m.guards(r.Method) {
		next.ServeHTTP(w, r)
		return
	}
	vals := r.Header["Idempotency-Key"]
	if len(vals) == 0 && !m.required {
		next.ServeHTTP(w, r)
		return
	}
	var start time.Time
	if m.observer != nil {
		start = time.Now()
	}
	key, err := ParseKey(vals)
	if err != nil {
		p := ProblemInvalidKey
		if errors.Is(err, errKeyMissing) {
			p = ProblemMissingKey
		} else {
			p.Detail = err.Error()
		}
		WriteProblem(w, p)
		m.observe(r, BadRequest, p.Status, start, err)
		return
	}
	st := statePool.Get().(*state)
	body, err := st.readBody(r, m.maxBody)
	if err != nil {
		p, o := ProblemBodyUnreadable, BadRequest
		var outer *http.MaxBytesError // an outer http.MaxBytesReader's limit
		switch {
		case errors.Is(err, errBodyTooLarge):
			p, o = ProblemBodyTooLarge, TooLarge
			p.Detail = "the body exceeds " + strconv.FormatInt(m.maxBody, 10) + " bytes"
		case errors.As(err, &outer):
			p, o = ProblemBodyTooLarge, TooLarge
			p.Detail = "the body exceeds " + strconv.FormatInt(outer.Limit, 10) + " bytes"
		}
		WriteProblem(w, p)
		st.release()
		m.observe(r, o, p.Status, start, err)
		return
	}
	// The stored key and the fingerprint share one allocation: the store
	// keeps both for as long as the record lives.
	if m.scope != nil {
		st.key = append(st.key[:0], m.scope(r)...)
	} else {
		st.key = appendDefaultScope(st.key[:0], &st.fp.head, r)
	}
	st.key = append(st.key, 0)
	st.key = append(st.key, key...)
	n := len(st.key)
	st.key = st.fp.appendFingerprint(st.key, r, m.fpHeaders, body)
	keyFP := string(st.key)
	storeKey, fp := keyFP[:n], keyFP[n:]

	ctx := r.Context()
	if m.detach {
		ctx = context.WithoutCancel(ctx)
	}
	cw := &st.cw
	cw.reset(w, m)
	finished := false
	var panicked *handlerPanic // passed on once the Guard kept the claim
	st.token, st.goexitKept = 0, false
	defer func() {
		if finished {
			return
		}
		if st.goexitKept {
			// runtime.Goexit after a stored status or KeepClaim: the
			// Guard kept the claim, as for a panic then.
			m.observe(r, Abandoned, cw.status, start, errGoexitKept)
			return
		}
		m.afterPanic(r, storeKey, st.token, cw.status, start)
	}()
	fn := func(ctx context.Context) (resp idempotency.Response, err error) {
		st.token, _ = idempotency.TokenFrom(ctx)
		r2 := r.WithContext(ctx)
		// The handler's writer and body may be used after the handler
		// returns (an http.Transport copies a proxied request's body from
		// its own write loop, which can outlive RoundTrip; a goroutine may
		// keep the writer), so the handler gets its own, not the pooled
		// capture writer and buffer.
		var hw *handlerWriter
		if body != nil {
			ex := newExchange(body)
			r2.Body, hw = ex.handlerBody(), &ex.hw
			// The length is known now: a handler that forwards the
			// request sends it with a Content-Length, not chunked (but
			// for a body with trailers, which only chunked carries).
			if len(r.Trailer) == 0 {
				r2.ContentLength, r2.TransferEncoding = int64(len(body)), nil
			}
		} else {
			hw = &handlerWriter{}
		}
		served := false
		defer func() {
			// http.ErrAbortHandler is how a handler (ReverseProxy, when the
			// upstream breaks off mid-body) says the response is cut short
			// after the work may have been done: keep the claim, store
			// nothing, and abort the response once the Guard is through.
			// Any other panic after the handler sent a status that is
			// stored (it announced the work done; the client, which gets a
			// response cut short, retries) or called KeepClaim is the same
			// case, and goes on once the Guard is through. Any other panic
			// goes on from here, so its stack is intact, and the Guard
			// releases the key.
			v := recover()
			if v == nil {
				if served || !cw.announced() {
					return // fn returns, or the Guard releases the key
				}
				// runtime.Goexit (t.FailNow, a library giving up so), which
				// nothing can hold: the Guard is asked to keep the claim
				// when it sees fn end, as the panic's case below does.
				if f := keepclaim.From(ctx); f != nil {
					f.Set()
					st.goexitKept = true
				}
				return
			}
			switch {
			case v == http.ErrAbortHandler:
				cw.aborted = true
				resp, err = idempotency.Response{}, errAborted
			case cw.announced():
				panicked = &handlerPanic{value: v, stack: debug.Stack()}
				resp, err = idempotency.Response{}, fmt.Errorf("%w: %v", errPanicAfterStatus, v)
			default:
				panic(v)
			}
		}()
		cw.serve(next, hw, r2)
		served = true
		return m.result(cw, r, ctx)
	}
	res, err := m.guard.Run(ctx, storeKey, fp, fn)
	if res.Outcome == idempotency.InFlight && m.wait > 0 {
		res, err = m.waitFor(ctx, storeKey, fp, fn, res, err)
	}
	finished = true
	if cw.aborted {
		status := cw.status
		st.release()
		m.observe(r, Abandoned, status, start, err)
		panic(http.ErrAbortHandler)
	}
	if panicked != nil {
		status := cw.status
		st.release()
		m.observe(r, Abandoned, status, start, err)
		panic(panicked)
	}

	var outcome Outcome
	status := 0
	switch res.Outcome {
	case idempotency.Executed:
		status = cw.status
		switch {
		case err == nil:
			outcome = Executed
			if cw.tooLarge {
				err = ErrResponseTooLarge
			} else if cw.cut {
				err = errResponseCut
			}
		case errors.Is(err, idempotency.ErrLeaseLost):
			outcome = LeaseLost
		case errors.Is(err, errClientGone), errors.Is(err, errHandlerCut), errors.Is(err, ErrClaimKept):
			outcome = Abandoned
		case idempotency.IsRetryable(err):
			// Released: the Guard takes the mark off when the release
			// fails, and says so with ErrNotReleased (below).
			outcome = Released
		case errors.Is(err, idempotency.ErrNotStored), errors.Is(err, idempotency.ErrNotReleased):
			// The response could not be stored, or the key released for a
			// status that is not stored (the claim stays until its lease
			// ends).
			outcome = NotStored
		default:
			// Not expected: every error fn returns is matched above, and
			// the Guard adds to it only what the cases above match.
			outcome = NotStored
		}
	case idempotency.Replayed:
		outcome, status = m.replay(w, res)
	case idempotency.InFlight:
		p := ProblemInFlight
		secs := int64((res.LeaseUntil.Sub(m.now()) + time.Second - 1) / time.Second)
		w.Header()["Retry-After"] = []string{strconv.FormatInt(max(secs, 1), 10)}
		WriteProblem(w, p)
		outcome, status = InFlight, p.Status
	case idempotency.Conflicted:
		p := ProblemKeyReused
		p.Status, p.Detail = m.conflictStatus, m.conflictDetail
		WriteProblem(w, p)
		outcome, status = Conflict, p.Status
	default:
		p := ProblemUnavailable
		w.Header()["Retry-After"] = []string{m.retryAfter503}
		WriteProblem(w, p)
		outcome, status = Unavailable, p.Status
	}
	st.release()
	if m.observer != nil {
		m.observe(r, outcome, status, start, err)
	}
}

// result turns the captured response into what the Guard stores, or into
// an error that tells the Guard not to store it. hctx is the handler's
// context.
func (m *Middleware) result(cw *captureWriter, r *http.Request, hctx context.Context) (idempotency.Response, error) {
	cw.finish(r)
	if cw.hijacked {
		return idempotency.Response{}, idempotency.Retryable(errHijacked)
	}
	if cw.kept() {
		return idempotency.Response{}, ErrClaimKept
	}
	if !m.storeStatus(cw.status) {
		if !m.detach && r.Context().Err() != nil {
			// The client is gone and the handler gave up: it may have done
			// part of the work, so the retry must not run it at once.
			return idempotency.Response{}, errClientGone
		}
		if hctx.Err() != nil {
			// The Guard ended the handler's context (its Timeout; a lost
			// lease is decided by the Guard before this error counts): the
			// handler gave up partway, as above.
			return idempotency.Response{}, errHandlerCut
		}
		return idempotency.Response{}, idempotency.Retryable(errStatusRelease)
	}
	if cw.tooLarge {
		return idempotency.Response{Status: cw.status, Header: tooLargeMarker}, nil
	}
	if cw.cut {
		return idempotency.Response{Status: cw.status, Header: cutMarker}, nil
	}
	if cw.sniff && cw.firstChunk >= 0 && cw.firstChunk < min(len(cw.body), 512) && m.storable("Content-Type") {
		// A Flush sent a first chunk shorter than net/http's sniffing
		// window: the type the client got was sniffed from it (none from
		// an empty one, which a nil value keeps on replay), whereas the
		// replay, written at once, would be sniffed from more.
		var ct []string
		if cw.firstChunk > 0 {
			ct = []string{http.DetectContentType(cw.body[:cw.firstChunk])}
		}
		cw.header["Content-Type"] = ct
	}
	return idempotency.Response{Status: cw.status, Header: cw.header, Body: cw.body}, nil
}

// handlerPanic is a handler's panic passed on after the Guard kept its
// claim, as golang.org/x/sync/singleflight passes one on from another
// goroutine: the stack where it was raised is gone by then, so it travels
// in the message, which net/http logs. Unwrap gives the value if it was an
// error.
type handlerPanic struct {
	value any
	stack []byte
}

func (p *handlerPanic) Error() string {
	return fmt.Sprintf("%v\n\nidemhttp: the handler panicked after it sent a stored status or called KeepClaim; claim kept. Its stack:\n%s", p.value, p.stack)
}

func (p *handlerPanic) Unwrap() error {
	err, _ := p.value.(error)
	return err
}

// waitFor polls the key while it is in flight, for at most m.wait.
func (m *Middleware) waitFor(ctx context.Context, key, fp string, fn func(context.Context) (idempotency.Response, error),
	res idempotency.Result, err error) (idempotency.Result, error) {
	deadline := time.Now().Add(m.wait)
	delay := 5 * time.Millisecond
	t := time.NewTimer(0)
	defer t.Stop()
	<-t.C
	for res.Outcome == idempotency.InFlight {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		t.Reset(min(delay, left))
		delay = min(2*delay, 200*time.Millisecond)
		select {
		case <-ctx.Done():
			return res, err
		case <-t.C:
		}
		res, err = m.guard.Run(ctx, key, fp, fn)
	}
	return res, err
}

// replay writes a stored response.
func (m *Middleware) replay(w http.ResponseWriter, res idempotency.Result) (Outcome, int) {
	resp := res.Response
	if v, ok := resp.Header[markerKey]; ok {
		p := ProblemNotReplayable
		p.OriginalStatus = resp.Status
		p.Detail = "the request ran; its response exceeded the stored size limit"
		if len(v) == 1 && v[0] == cutMarker[markerKey][0] {
			p.Detail = "the request ran; its response was cut short when the client went away"
		}
		WriteProblem(w, p)
		return NotReplayable, p.Status
	}
	h := w.Header()
	var trailers []string
	conn := false
	for k, v := range resp.Header {
		if strings.HasPrefix(k, trailerKey) {
			trailers = append(trailers, k[len(trailerKey):])
			continue
		}
		conn = conn || isConnection(k)
		h[k] = v
	}
	if conn {
		// Stored before Connection was always left out (a StoreHeader
		// policy that kept it): it and the fields it names were the first
		// response's connection's.
		for k := range resp.Header {
			if isConnection(k) || connectionNamed(resp.Header, k) {
				delete(h, k)
			}
		}
	}
	if trailers != nil {
		h["Trailer"] = trailers
	} else if len(resp.Body) > 2048 && resp.Status != http.StatusNoContent && resp.Status != http.StatusNotModified {
		// net/http sets Content-Length itself only for a body that fits
		// its buffer (2 KiB); a larger one would go out chunked.
		h["Content-Length"] = []string{strconv.Itoa(len(resp.Body))}
	}
	// The two fields the middleware adds share one backing array; each
	// slice is capped at its own element, so an append to one (Header.Add)
	// copies instead of writing over the other.
	if m.windowHeader != "" && !res.ExpiresAt.IsZero() {
		vals := []string{"true", m.window.format(res.ExpiresAt)}
		h[ReplayedHeader], h[m.windowHeader] = vals[0:1:1], vals[1:2:2]
	} else {
		h[ReplayedHeader] = []string{"true"}
	}
	w.WriteHeader(resp.Status)
	if len(resp.Body) > 0 {
		_, _ = w.Write(resp.Body)
	}
	for _, name := range trailers {
		h[name] = resp.Header[trailerKey+name]
	}
	return Replayed, resp.Status
}

// afterPanic runs when the handler panicked (with anything but
// http.ErrAbortHandler) or called runtime.Goexit, before it sent a stored
// status or called KeepClaim, once the Guard has tried to release the
// claim named by token. The Guard cannot report a Release
// that failed then, so the middleware releases it once more: a claim left
// behind by a store blip would make every retry wait out the lease. If the
// store still refuses, the claim stays until its lease ends, and the
// Observer sees Abandoned instead of Released.
func (m *Middleware) afterPanic(r *http.Request, key string, token uint64, status int, start time.Time) {
	if token == 0 {
		// The panic came before the handler ran: nothing was claimed.
		m.observe(r, Released, status, start, errPanic)
		return
	}
	err := m.guard.Store.Release(context.WithoutCancel(r.Context()), key, token)
	if err != nil && !errors.Is(err, idempotency.ErrLeaseLost) {
		// ErrLeaseLost: the Guard's Release went through (or the key was
		// taken over); either way this claim no longer holds it.
		// ErrNotReleased, as the Guard says of a Release of its own that
		// failed.
		m.observe(r, Abandoned, status, start, errors.Join(errPanicKept, fmt.Errorf("%w: %w", idempotency.ErrNotReleased, err)))
		return
	}
	m.observe(r, Released, status, start, errPanic)
}

func (m *Middleware) observe(r *http.Request, o Outcome, status int, start time.Time, err error) {
	if m.observer == nil {
		return
	}
	m.observer.Observe(Event{Request: r, Outcome: o, Status: status, Latency: time.Since(start), Err: err})
}

// dateCache formats IMF-fixdates, reusing the last one: the window header
// of requests in the same second costs no allocation for the string.
type dateCache struct{ last atomic.Pointer[dateEntry] }

type dateEntry struct {
	sec int64
	s   string
}

func (c *dateCache) format(t time.Time) string {
	sec := t.Unix()
	if e := c.last.Load(); e != nil && e.sec == sec {
		return e.s
	}
	s := t.UTC().Format(http.TimeFormat)
	c.last.Store(&dateEntry{sec: sec, s: s})
	return s
}

// validToken reports whether s is an RFC 9110 token (method, field name).
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}
