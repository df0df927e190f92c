package idemhttp

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"sync/atomic"
)

// trailerKey prefixes the trailers of a stored response in its Header. The
// colon makes it an invalid field name, so it cannot clash with a header;
// it is net/http's own http.TrailerPrefix, which the replay uses as is.
const trailerKey = http.TrailerPrefix

// captureWriter sends the handler's response to the client as it is written
// and keeps a copy for the store: the final status, the storable header
// fields as they were when the status was sent, the body up to a bound, and
// the trailers. It is pooled with the request state, so handlers do not get
// it: they get a handlerWriter, which lets go of it when they return.
type captureWriter struct {
	w http.ResponseWriter
	m *Middleware

	status int
	header map[string][]string // storable fields, shared with the handler's map
	// outer holds the fields the response already had when the middleware
	// was reached (set by an outer handler: a request id, CORS). They
	// belong to each request, not to the stored response: they are
	// captured only if the handler changed them. nil when there were none.
	outer    map[string][]string
	body     []byte
	tooLarge bool // the body outgrew MaxStoredResponse; body is dropped
	hijacked bool
	aborted  bool // the handler panicked with http.ErrAbortHandler
	// claim>>1 counts the handlers that got the writer and those that
	// returned (serve); a handlerWriter reaches it only while claim>>1 is
	// the count it was given. claim&1: the handler called KeepClaim (store
	// nothing, release nothing). Atomic, for the goroutines handlers start.
	claim atomic.Uint64
	// gone: a write to the client failed under Options.Detach; from then
	// on the response is only captured, and writes report success, so
	// that the handler finishes and its response is stored for the retry.
	gone bool
	// cut: a write to the client failed without Detach. The handler may
	// have stopped there, so the captured body may be cut short: it is
	// not stored (result stores a marker instead).
	cut bool
	// sniff: net/http sniffs the Content-Type, which the handler left
	// unset, from the first chunk it sends; firstChunk is the length of
	// the body when a Flush sent that chunk (-1: no Flush yet).
	sniff      bool
	firstChunk int
	// trailers are the Trailer field values when the status was sent:
	// net/http ignores a declaration made later.
	trailers []string
	// chunking says whether HTTP/1.1 sends the body chunked, the only
	// framing that carries trailers: 1 always (declared trailers, or a
	// Transfer-Encoding), -1 never (a Content-Length, identity, no body),
	// 0 if the header went out before the handler was done (see finish).
	chunking int8
}

var (
	_ http.ResponseWriter = (*captureWriter)(nil)
	_ http.Flusher        = (*captureWriter)(nil)
	_ http.Hijacker       = (*captureWriter)(nil)
	_ io.ReaderFrom       = (*captureWriter)(nil)
	_ io.StringWriter     = (*captureWriter)(nil)
)

func (cw *captureWriter) reset(w http.ResponseWriter, m *Middleware) {
	cw.w, cw.m = w, m
	cw.status = 0
	cw.tooLarge, cw.hijacked, cw.aborted, cw.gone, cw.cut = false, false, false, false, false
	cw.sniff, cw.firstChunk, cw.trailers, cw.chunking = false, -1, nil, 0
	cw.body = cw.body[:0]
	clear(cw.header)
	clear(cw.outer)
	if h := w.Header(); len(h) > 0 {
		if cw.outer == nil {
			cw.outer = make(map[string][]string, len(h))
		}
		for k, v := range h {
			cw.outer[k] = v
		}
	}
}

// release drops what the writer holds of the request before it is pooled.
func (cw *captureWriter) release() {
	cw.w, cw.m = nil, nil
	cw.trailers = nil
	clear(cw.header)
	clear(cw.outer)
	if cap(cw.body) > maxPooledBuffer {
		cw.body = nil
	}
	cw.body = cw.body[:0]
}

// serve runs next with hw as its writer, for the request cw was reset for,
// and cuts hw off from cw when next returns or panics.
func (cw *captureWriter) serve(next http.Handler, hw *handlerWriter, r *http.Request) {
	token := cw.claim.Load()&^1 + 2 // a new count; not kept
	cw.claim.Store(token)
	hw.cw, hw.w, hw.token = cw, cw.w, token
	defer cw.claim.Add(2) // the bit stays, for result
	next.ServeHTTP(hw, r)
}

// kept reports whether the handler called KeepClaim.
func (cw *captureWriter) kept() bool { return cw.claim.Load()&1 != 0 }

// announced reports whether the handler sent a status that is stored or
// called KeepClaim (and did not hijack the connection): it has told the
// client its work is done, or that its outcome is unknown, so a handler
// that then ends abruptly (a panic, runtime.Goexit) keeps the claim.
func (cw *captureWriter) announced() bool {
	return !cw.hijacked && (cw.kept() || (cw.status != 0 && cw.m.storeStatus(cw.status)))
}

// keepClaim sets the kept bit if token is still cw's handler's.
func (cw *captureWriter) keepClaim(token uint64) bool {
	return cw.claim.CompareAndSwap(token, token|1) || cw.claim.Load() == token|1
}

// handlerWriter is the ResponseWriter a handler gets: it passes every call
// on to the request's captureWriter until the handler returns. After that
// the captureWriter goes back to the pool and serves other requests, which a
// goroutine the handler left holding its writer must not reach: writes then
// fail with errWriterClosed, and KeepClaim returns false. (A call that
// races with the handler's return is a data race, as it is for net/http.)
type handlerWriter struct {
	cw    *captureWriter
	w     http.ResponseWriter // cw.w, which stays the request's own
	token uint64
}

var errWriterClosed = errors.New("idemhttp: ResponseWriter used after its handler returned")

var (
	_ http.ResponseWriter = (*handlerWriter)(nil)
	_ http.Flusher        = (*handlerWriter)(nil)
	_ http.Hijacker       = (*handlerWriter)(nil)
	_ io.ReaderFrom       = (*handlerWriter)(nil)
	_ io.StringWriter     = (*handlerWriter)(nil)
)

// live reports whether hw's handler has not returned yet.
func (hw *handlerWriter) live() bool { return hw.cw.claim.Load()|1 == hw.token|1 }

// Header implements http.ResponseWriter. The map is the request's own.
func (hw *handlerWriter) Header() http.Header { return hw.w.Header() }

// WriteHeader implements http.ResponseWriter.
func (hw *handlerWriter) WriteHeader(code int) {
	if hw.live() {
		hw.cw.WriteHeader(code)
	}
}

// Write implements http.ResponseWriter.
func (hw *handlerWriter) Write(p []byte) (int, error) {
	if !hw.live() {
		return 0, errWriterClosed
	}
	return hw.cw.Write(p)
}

// WriteString implements io.StringWriter.
func (hw *handlerWriter) WriteString(s string) (int, error) {
	if !hw.live() {
		return 0, errWriterClosed
	}
	return hw.cw.WriteString(s)
}

// ReadFrom implements io.ReaderFrom.
func (hw *handlerWriter) ReadFrom(src io.Reader) (int64, error) {
	if !hw.live() {
		return 0, errWriterClosed
	}
	return hw.cw.ReadFrom(src)
}

// Flush implements http.Flusher.
func (hw *handlerWriter) Flush() { _ = hw.FlushError() }

// FlushError is Flush with its error, for http.ResponseController.
func (hw *handlerWriter) FlushError() error {
	if !hw.live() {
		return errWriterClosed
	}
	return hw.cw.FlushError()
}

// Hijack implements http.Hijacker.
func (hw *handlerWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if !hw.live() {
		return nil, nil, errWriterClosed
	}
	return hw.cw.Hijack()
}

// Unwrap returns the underlying writer, for http.ResponseController.
func (hw *handlerWriter) Unwrap() http.ResponseWriter { return hw.w }

// Header implements http.ResponseWriter.
func (cw *captureWriter) Header() http.Header { return cw.w.Header() }

// WriteHeader implements http.ResponseWriter. The first final status is
// captured with the header as it is then; informational statuses (1xx but
// 101) go to the client only, and later calls are passed on for net/http to
// report, as they would be without the middleware.
func (cw *captureWriter) WriteHeader(code int) {
	if cw.status != 0 || cw.hijacked || (code >= 100 && code < 200 && code != http.StatusSwitchingProtocols) {
		cw.w.WriteHeader(code)
		return
	}
	cw.status = code
	h := cw.w.Header()
	m := cw.m
	// As net/http decides from the header at this moment (it reads the
	// fields by their canonical names, without canonicalizing).
	_, haveType := h["Content-Type"]
	te := first(h, "Transfer-Encoding")
	cw.sniff = !haveType && code >= 200 && code != http.StatusNoContent && code != http.StatusNotModified &&
		first(h, "Content-Encoding") == "" && te == ""
	cw.trailers = h["Trailer"]
	switch {
	case code < 200 || code == http.StatusNoContent || code == http.StatusNotModified,
		first(h, "Content-Length") != "" || te == "identity":
		cw.chunking = -1
	case te != "" || len(cw.trailers) > 0:
		cw.chunking = 1
	}
	conn := false
	for k, v := range h {
		if cw.chunking == 0 && strings.HasPrefix(k, http.TrailerPrefix) {
			cw.chunking = 1 // net/http chunks a body with trailers set so
		}
		conn = conn || isConnection(k)
		if ov, ok := cw.outer[k]; ok && slices.Equal(ov, v) {
			continue // an outer handler's field, as it set it
		}
		if m.storable(k) {
			cw.header[k] = v
		}
	}
	if conn {
		// The fields Connection names are the connection's, whatever the
		// StoreHeader policy said of each name; the live response keeps
		// them, for net/http to send as it sees fit.
		for k := range cw.header {
			if connectionNamed(h, k) {
				delete(cw.header, k)
			}
		}
	}
	if m.windowHeader != "" && !cw.kept() && m.storeStatus(code) {
		// The window runs from when the result is stored, a little later:
		// the clock read now is the closest lower bound at hand, and only
		// responses that send it pay for reading it.
		h[m.windowHeader] = []string{m.window.format(m.now().Add(m.retention))}
	}
	cw.w.WriteHeader(code)
}

// isConnection reports whether k names the Connection field, in any case
// (net/http sends a field whatever the case of its name).
func isConnection(k string) bool {
	return len(k) == len("Connection") && strings.EqualFold(k, "Connection")
}

// connectionNamed reports whether the field name k is listed in h's
// Connection field (under a name in any case): such a field is hop-by-hop
// (RFC 9110, section 7.6.1), meant for the one connection it went out on.
func connectionNamed(h map[string][]string, k string) bool {
	if k == "" {
		return false
	}
	for ck, vals := range h {
		if !isConnection(ck) {
			continue
		}
		for _, v := range vals {
			for name := range strings.SplitSeq(v, ",") {
				if strings.EqualFold(strings.TrimSpace(name), k) {
					return true
				}
			}
		}
	}
	return false
}

// first is h's first value of the canonical name k, or "".
func first(h map[string][]string, k string) string {
	if v := h[k]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// Write implements http.ResponseWriter.
func (cw *captureWriter) Write(p []byte) (int, error) {
	if cw.status == 0 && !cw.hijacked {
		cw.WriteHeader(http.StatusOK)
	}
	if cw.gone {
		cw.capture(p)
		return len(p), nil
	}
	n, err := cw.w.Write(p)
	kept := p
	if errors.Is(err, http.ErrContentLength) || errors.Is(err, http.ErrBodyNotAllowed) {
		kept = p[:n] // net/http refused the rest: the client never gets it
	} else if err != nil && cw.detached() {
		n, err = len(p), nil
	}
	cw.capture(kept)
	return n, err
}

// detached reports whether a failed write to the client is to be hidden
// from the handler (Options.Detach), and if so marks the client gone;
// otherwise it marks the response cut.
func (cw *captureWriter) detached() bool {
	if cw.m.detach && !cw.hijacked {
		cw.gone = true
	} else {
		cw.cut = true
	}
	return cw.gone
}

// WriteString implements io.StringWriter, so that io.WriteString and
// fmt.Fprint reach a writer that takes strings without a conversion.
func (cw *captureWriter) WriteString(s string) (int, error) {
	if cw.status == 0 && !cw.hijacked {
		cw.WriteHeader(http.StatusOK)
	}
	var n int
	var err error
	if cw.gone {
		n = len(s)
	} else {
		n, err = io.WriteString(cw.w, s)
	}
	kept := s
	if errors.Is(err, http.ErrContentLength) || errors.Is(err, http.ErrBodyNotAllowed) {
		kept = s[:n]
	} else if err != nil && cw.detached() {
		n, err = len(s), nil
	}
	if !cw.tooLarge && kept != "" {
		if len(cw.body)+len(kept) > cw.m.maxStored {
			cw.tooLarge = true
			cw.body = cw.body[:0]
		} else {
			cw.body = append(cw.body, kept...)
		}
	}
	return n, err
}

func (cw *captureWriter) capture(p []byte) {
	if cw.tooLarge || len(p) == 0 {
		return
	}
	if len(cw.body)+len(p) > cw.m.maxStored {
		cw.tooLarge = true
		cw.body = cw.body[:0]
		return
	}
	cw.body = append(cw.body, p...)
}

// ReadFrom implements io.ReaderFrom, so that io.Copy from a file or any
// reader is captured too. It reads straight into the capture buffer and
// writes that to the client; once the response is known to be too large to
// store, it hands the rest to the underlying writer's ReadFrom (sendfile).
func (cw *captureWriter) ReadFrom(src io.Reader) (int64, error) {
	if cw.status == 0 && !cw.hijacked {
		cw.WriteHeader(http.StatusOK)
	}
	var total int64
	for !cw.tooLarge {
		if cap(cw.body)-len(cw.body) < 512 {
			cw.body = slices.Grow(cw.body, min(max(cap(cw.body), 4096), cw.m.maxStored+1-len(cw.body)+512))
		}
		buf := cw.body[len(cw.body):cap(cw.body)]
		n, rerr := src.Read(buf)
		if n > 0 {
			wn, werr := n, error(nil)
			if !cw.gone {
				wn, werr = cw.w.Write(buf[:n])
			}
			kept := n
			if errors.Is(werr, http.ErrContentLength) || errors.Is(werr, http.ErrBodyNotAllowed) {
				kept = wn
			} else if werr != nil && cw.detached() {
				wn, werr = n, nil
			}
			total += int64(wn)
			cw.body = cw.body[:len(cw.body)+kept]
			if len(cw.body) > cw.m.maxStored {
				cw.tooLarge = true
				cw.body = cw.body[:0]
			}
			if werr != nil {
				return total, werr
			}
		}
		if rerr == io.EOF {
			return total, nil
		}
		if rerr != nil {
			return total, rerr
		}
	}
	if cw.gone {
		n, err := io.Copy(io.Discard, src)
		return total + n, err
	}
	if cw.m.detach {
		// Through Write, which hides a client that goes away meanwhile.
		n, err := io.Copy(writerOnly{cw}, src)
		return total + n, err
	}
	if rf, ok := cw.w.(io.ReaderFrom); ok {
		n, err := rf.ReadFrom(src)
		return total + n, err
	}
	n, err := io.Copy(writerOnly{cw.w}, src)
	return total + n, err
}

// writerOnly hides a writer's ReadFrom from io.Copy.
type writerOnly struct{ io.Writer }

// Flush implements http.Flusher: it sends the status (200 if none was
// written) and what was written so far.
func (cw *captureWriter) Flush() { _ = cw.FlushError() }

// FlushError is Flush with its error, for http.ResponseController.
func (cw *captureWriter) FlushError() error {
	if cw.status == 0 && !cw.hijacked {
		cw.WriteHeader(http.StatusOK)
	}
	if cw.gone {
		return nil
	}
	err := http.NewResponseController(cw.w).Flush()
	if err == nil && cw.firstChunk < 0 {
		cw.firstChunk = len(cw.body)
	}
	if err != nil && !errors.Is(err, http.ErrNotSupported) && cw.detached() {
		return nil
	}
	return err
}

// Hijack implements http.Hijacker by passing the call on. A hijacked
// response cannot be captured: the middleware releases the key when the
// handler returns, so a retry runs the handler again.
func (cw *captureWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(cw.w).Hijack()
	if err == nil {
		cw.hijacked = true
	}
	return c, rw, err
}

// Unwrap returns the underlying writer, for http.ResponseController
// (deadlines, full duplex).
func (cw *captureWriter) Unwrap() http.ResponseWriter { return cw.w }

// finish completes the capture after the handler returned: the implicit 200
// of a handler that wrote nothing, and the trailers, if r's response could
// carry them.
func (cw *captureWriter) finish(r *http.Request) {
	if cw.hijacked {
		return
	}
	if cw.status == 0 {
		cw.WriteHeader(http.StatusOK)
	}
	if r.ProtoMajor < 2 {
		// net/http sends HTTP/1 trailers only in a chunked body; it sets
		// a Content-Length instead when the handler was done before the
		// header went out (no Flush, and a body that fit its 2 KiB
		// buffer). Trailers the client did not get are not replayed.
		chunked := cw.chunking > 0 || (cw.chunking == 0 && (cw.firstChunk >= 0 || len(cw.body) > 2048))
		if !chunked || !r.ProtoAtLeast(1, 1) {
			return
		}
	}
	h := cw.w.Header()
	for _, decl := range cw.trailers {
		for name := range strings.SplitSeq(decl, ",") {
			name = textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(name))
			if v, ok := h[name]; ok && name != "" {
				cw.header[trailerKey+name] = v
			}
		}
	}
	for k, v := range h {
		if strings.HasPrefix(k, trailerKey) {
			cw.header[trailerKey+textproto.CanonicalMIMEHeaderKey(k[len(trailerKey):])] = v
		}
	}
}
