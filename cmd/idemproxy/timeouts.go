package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"
)

// errBodyTimeout is the error a request body's Read returns once
// -body-timeout has passed before the body arrived whole.
var errBodyTimeout = errors.New("the request body did not arrive within -body-timeout")

// deadlineBody bounds the arrival of a streamed request body (one that the
// Transport copies upstream as it comes), so that a client that trickles
// its body cannot hold a connection, a goroutine and an upstream connection
// for as long as it likes. It sets the client connection's read deadline
// when the handler starts and moves it on with each read, so that the
// timeout bounds each pause, not the whole body, and a large upload still
// passes (http.Server.ReadTimeout would bound the upload as a whole); the
// server lifts the deadline when the body has been read to its end. (A
// guarded body, at most -max-body, is read whole by the middleware before
// anything else: it gets one deadline and no wrapper, see serve.)
//
// The body may be read after the handler returned (an http.Transport's
// write loop); the connection may then serve another request, so the
// deadline is moved only while the handler runs.
type deadlineBody struct {
	io.ReadCloser
	rc      *http.ResponseController
	timeout time.Duration

	mu       sync.Mutex
	deadline time.Time
	// eof: the body was read to its end; done: the handler returned.
	eof, done bool
}

func newDeadlineBody(w http.ResponseWriter, body io.ReadCloser, timeout time.Duration) *deadlineBody {
	rc := http.NewResponseController(w)
	b := &deadlineBody{ReadCloser: body, rc: rc, timeout: timeout, deadline: time.Now().Add(timeout)}
	if err := rc.SetReadDeadline(b.deadline); err != nil {
		b.done = true // a writer without deadlines: nothing to move
	}
	return b
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	if !b.eof && !b.done {
		b.deadline = time.Now().Add(b.timeout)
		_ = b.rc.SetReadDeadline(b.deadline)
	}
	b.mu.Unlock()
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == io.EOF:
		// The server has lifted the deadline as it hit the end.
		b.mu.Lock()
		b.eof = true
		b.mu.Unlock()
	case errors.Is(err, os.ErrDeadlineExceeded):
		err = fmt.Errorf("%w: %w", errBodyTimeout, err)
	}
	return n, err
}

// handlerDone is called when the handler returns. A deadline still set (the
// body was not read to its end) then bounds the server's draining of the
// rest; the server sets the connection's next deadline itself.
func (b *deadlineBody) handlerDone() {
	b.mu.Lock()
	b.done = true
	b.mu.Unlock()
}

// deadlineBodyKey is the context key of a request's deadlineBody: the
// Body that ReverseProxy's ErrorHandler gets is a wrapper of its own.
type deadlineBodyKey struct{}

// bodyTimedOut reports whether err, which ended the upstream exchange of r,
// comes from r's body failing to arrive within -body-timeout. The server
// cancels r's context as the deadline passes, and the exchange may end on
// that before the body's Read reports the timeout.
func bodyTimedOut(r *http.Request, err error) bool {
	if errors.Is(err, errBodyTimeout) {
		return true
	}
	b, ok := r.Context().Value(deadlineBodyKey{}).(*deadlineBody)
	if !ok || !errors.Is(err, context.Canceled) {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.eof && !time.Now().Before(b.deadline)
}

// budgetWriter bounds the writing of a response from its first byte (a
// status, an informational one included, or body bytes) to budget: past
// it, a write to a client that stopped reading fails, and the handler
// returns. It is counted from the first byte, not from the request, so
// that what comes before the response (a body that takes its time, a wait
// for another request's claim, a slow store) does not cut the response of
// an upstream call that ran.
//
// The deadline is not lifted when the handler returns: the server writes
// the last bytes of the response (up to its 4 KiB buffer) after that, and
// a client that stopped reading just then would hold that write, the
// connection and its goroutine for good. The server lifts it itself once
// the response is written, before the connection's next request
// (TestFinalFlushBounded holds net/http to that).
type budgetWriter struct {
	http.ResponseWriter
	budget time.Duration
	set    bool // the deadline is set (the first byte was written)
}

func (b *budgetWriter) start() {
	if !b.set {
		b.set = true
		_ = http.NewResponseController(b.ResponseWriter).SetWriteDeadline(time.Now().Add(b.budget))
	}
}

func (b *budgetWriter) WriteHeader(code int) {
	b.start()
	b.ResponseWriter.WriteHeader(code)
}

func (b *budgetWriter) Write(p []byte) (int, error) {
	b.start()
	return b.ResponseWriter.Write(p)
}

// ReadFrom keeps net/http's own ReadFrom (sendfile, its buffers) for a
// writer that copies a body in.
func (b *budgetWriter) ReadFrom(r io.Reader) (int64, error) {
	b.start()
	if rf, ok := b.ResponseWriter.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{b.ResponseWriter}, r)
}

// Unwrap gives http.ResponseController (Flush, Hijack for upgrades, the
// deadlines) and idemhttp the writer underneath.
func (b *budgetWriter) Unwrap() http.ResponseWriter { return b.ResponseWriter }
