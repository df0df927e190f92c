package blackbox

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/archlab/idempotency/internal/verdict"
)

// Names of the checks, as they appear in the report.
const (
	CheckFresh      = "fresh requests succeed"
	CheckRetry      = "retry replays first response"
	CheckMarked     = "replays carry Idempotent-Replayed"
	CheckConcurrent = "concurrent duplicates execute once"
	CheckApart      = "concurrent keys kept apart"
	CheckPayload    = "different payload rejected"
	CheckMalformed  = "malformed keys rejected"
	CheckLost       = "lost response replays"
	CheckScope      = "credentials never share results"
	CheckVisible    = "a second execution would be visible"
	// CheckExecutions is declared only with Config.Executions.
	CheckExecutions = "at most one execution per operation (target's counter)"
)

// Checks returns the check names in the order Run declares them;
// CheckExecutions follows them where Config.Executions is set.
func Checks() []string {
	return []string{CheckFresh, CheckRetry, CheckMarked, CheckConcurrent, CheckApart,
		CheckPayload, CheckMalformed, CheckLost, CheckScope, CheckVisible}
}

// DefaultBodyTemplate is the body sent when Config.BodyTemplate is empty.
const DefaultBodyTemplate = `{"id":"{{unique}}","amount":100}`

// Config selects the target and how it is exercised. Every zero value but
// Target's is usable.
type Config struct {
	// Target is the URL the POSTs go to (http or https).
	Target string
	// Headers are credential sets: [0] is sent with every request, [1] (if
	// any) is the second caller of the scope check. None: no extra fields.
	Headers []http.Header
	// BodyTemplate is JSON in which {{unique}} becomes a value fresh per
	// logical request and {{seq}} its sequence number ("":
	// DefaultBodyTemplate).
	BodyTemplate string
	// ConflictStatus is the status expected for a key reused with another
	// body (0: 422).
	ConflictStatus int
	// Concurrency is the number of concurrent duplicates per key, 2 at
	// least (0: 16).
	Concurrency int
	// Requests is the number of logical requests (keys) per check (0: 20).
	Requests int
	// Seed drives the random choices.
	Seed int64
	// Timeout bounds one HTTP exchange (0: 10s).
	Timeout time.Duration
	// Window is how long after its first answer a key must still be
	// replayed: at the end of the run each key of CheckRetry is sent once
	// more, no sooner than Window after its first answer (0:
	// DefaultWindow). Real windows are hours long; this catches a target
	// that forgets keys within the run (a short expiry, a small cache).
	Window time.Duration
	// Executions is the URL of the target's execution counter ("": none):
	// a GET of it, with Headers[0], answers 200 and the number of times
	// the target's operation has run so far, as a decimal integer (the
	// rows of its orders table, say). Read at the start and the end of
	// the run, it shows a second execution that the answers hide (see
	// CheckExecutions in the package doc). Nothing else may run the
	// operation meanwhile.
	Executions string
}

// DefaultWindow is Config.Window when zero: the run waits at most this long
// for its last retries.
const DefaultWindow = 2 * time.Second

// ReplayedHeader is the response field by which a target marks a replay.
const ReplayedHeader = "Idempotent-Replayed"

// maxBody bounds the response body read; longer bodies are compared by
// their first maxBody bytes.
const maxBody = 1 << 20

// Run checks the target and records the results in rep, writing one line
// per check to progress (nil: none). It returns an error only for an
// invalid cfg, a target that cannot be reached, an execution counter that
// cannot be read at the start, or ctx ending.
func Run(ctx context.Context, cfg Config, rep *verdict.Report, progress io.Writer) error {
	c, err := newChecker(cfg, rep, progress)
	if err != nil {
		return err
	}
	defer c.client.CloseIdleConnections()
	parent := ctx
	ctx, c.abort = context.WithCancelCause(ctx)
	defer c.abort(nil)
	rep.Declare(Checks()...)
	var before int64
	if c.counter != nil {
		rep.Declare(CheckExecutions)
		if before, err = c.counted(ctx); err != nil {
			return fmt.Errorf("blackbox: execution counter: %w", err)
		}
	}
	if err := c.preflight(ctx); err != nil {
		return err
	}
	for _, step := range []struct {
		name string
		fn   func(context.Context)
	}{
		{CheckRetry, c.checkRetry},
		{CheckConcurrent, c.checkConcurrent},
		{CheckApart, c.checkApart},
		{CheckPayload, c.checkPayload},
		{CheckMalformed, c.checkMalformed},
		{CheckLost, c.checkLost},
		{CheckScope, c.checkScope},
		{fmt.Sprintf("%s, %v after the first answer", CheckRetry, c.cfg.Window), c.checkWindow},
	} {
		if ctx.Err() != nil {
			return stopped(parent, ctx)
		}
		c.logf("checking: %s", step.name)
		step.fn(ctx)
	}
	c.finishMarked()
	c.finishRetry()
	c.finishVisible()
	if c.counter != nil {
		c.finishExecutions(ctx, before)
	}
	return stopped(parent, ctx)
}

// stopped is why ctx, derived from parent, ended: the parent's error, else
// the cause checker.abort gave (nil while ctx lives).
func stopped(parent, ctx context.Context) error {
	if err := parent.Err(); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return nil
}

// checker is one run.
type checker struct {
	cfg      Config
	target   *url.URL
	counter  *url.URL // Config.Executions (nil: none)
	client   *http.Client
	rep      *verdict.Report
	progress io.Writer
	runID    string

	// abort ends the run with its cause (a target that stopped answering).
	abort context.CancelCauseFunc

	mu  sync.Mutex
	rng *mrand.Rand
	seq int

	// silentSince is when the first exchange failed since the target last
	// answered anything (zero: it answered the latest).
	silentSince time.Time
	// stuck: a key stayed 409 for the whole of a settle's wait; later
	// settles do not wait (see settle).
	stuck bool

	// probed: whether identifies is known: the preflight's fresh requests
	// all succeeded, or two of them were answered alike (else it is taken
	// to be true, and the checks compare answers, since nothing says they
	// cannot).
	probed bool
	// identifies: executions of one body give different answers, the
	// keys they echo aside (no two of the preflight's alike).
	identifies bool
	// bodyIdentifies: the bodies alone do (else Location does too).
	bodyIdentifies bool
	// answered are CheckRetry's keys with their first answers, for the
	// late retry of checkWindow.
	answered []answeredKey
	// Retries equal to the first answer that prove nothing (the target's
	// answers do not identify executions and the retry was not marked).
	unprovenRetries int
	// Replays seen, with and without the header; examples of the latter;
	// first answers wrongly marked as replays.
	markedReplays, unmarkedReplays int
	unmarked                       []string
	markFailures                   int
	// ops holds the operations sent, for CheckExecutions.
	ops map[operation]opRecord
}

func newChecker(cfg Config, rep *verdict.Report, progress io.Writer) (*checker, error) {
	if rep == nil {
		return nil, errors.New("blackbox: nil report")
	}
	u, err := url.Parse(cfg.Target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("blackbox: target %q is not an http(s) URL", cfg.Target)
	}
	var counter *url.URL
	if cfg.Executions != "" {
		counter, err = url.Parse(cfg.Executions)
		if err != nil || (counter.Scheme != "http" && counter.Scheme != "https") || counter.Host == "" {
			return nil, fmt.Errorf("blackbox: execution counter %q is not an http(s) URL", cfg.Executions)
		}
	}
	if len(cfg.Headers) == 0 {
		cfg.Headers = []http.Header{{}}
	}
	if cfg.BodyTemplate == "" {
		cfg.BodyTemplate = DefaultBodyTemplate
	}
	if cfg.ConflictStatus == 0 {
		cfg.ConflictStatus = http.StatusUnprocessableEntity
	}
	switch {
	case cfg.Concurrency == 1:
		return nil, errors.New("blackbox: concurrency 1: one request at a time is no duplicate; give at least 2 (0: 16)")
	case cfg.Concurrency <= 0:
		cfg.Concurrency = 16
	}
	if cfg.Requests <= 0 {
		cfg.Requests = 20
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.ConflictStatus < 100 || cfg.ConflictStatus > 599 {
		return nil, fmt.Errorf("blackbox: conflict status %d is not an HTTP status", cfg.ConflictStatus)
	}
	if progress == nil {
		progress = io.Discard
	}
	var id [4]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, err
	}
	c := &checker{
		cfg: cfg, target: u, counter: counter, rep: rep, progress: progress, runID: hex.EncodeToString(id[:]), abort: func(error) {},
		rng: mrand.New(mrand.NewPCG(uint64(cfg.Seed), 0x69646d636865636b)),
		client: &http.Client{
			Timeout: cfg.Timeout,
			Transport: &http.Transport{
				Proxy:               nil,
				MaxIdleConnsPerHost: cfg.Concurrency,
				IdleConnTimeout:     30 * time.Second,
			},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
	if sample := c.render("sample", 0); !json.Valid(sample) {
		return nil, fmt.Errorf("blackbox: body template does not render valid JSON: %s", sample)
	}
	return c, nil
}

func (c *checker) logf(format string, args ...any) {
	fmt.Fprintf(c.progress, format+"\n", args...)
}

// request is one logical request: a fresh key and body.
type request struct {
	key  string
	body []byte
}

// next returns a fresh logical request.
func (c *checker) next() request {
	c.mu.Lock()
	c.seq++
	seq := c.seq
	r := c.rng.Uint64()
	c.mu.Unlock()
	unique := fmt.Sprintf("ic-%s-%d-%x", c.runID, seq, r&0xffffff)
	return request{key: fmt.Sprintf("idemcheck-%s-%d", c.runID, seq), body: c.render(unique, seq)}
}

// reshape returns req's key with a new body, fresh like next's.
func (c *checker) reshape(req request) request {
	return request{key: req.key, body: c.next().body}
}

func (c *checker) render(unique string, seq int) []byte {
	return []byte(strings.NewReplacer("{{unique}}", unique, "{{seq}}", strconv.Itoa(seq)).Replace(c.cfg.BodyTemplate))
}

// reply is what the target answered.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) ok() bool { return r.status >= 200 && r.status < 300 }

// replayed reports whether the reply is marked as a replay.
func (r reply) replayed() bool {
	v := strings.TrimSpace(r.header.Get(ReplayedHeader))
	return strings.EqualFold(v, "true") || v == "?1"
}

// replayedFields are the response fields a replay must carry as the first
// answer did: what the answer is (its media type, parameters aside) and
// where the created resource is. Others may rightly differ per response
// (Date, request ids, the replay mark).
var replayedFields = []string{"Content-Type", "Location"}

// same reports whether o is r again: status, body and replayedFields.
func (r reply) same(o reply) bool {
	if r.status != o.status || !bytes.Equal(r.body, o.body) {
		return false
	}
	for _, f := range replayedFields {
		if r.field(f) != o.field(f) {
			return false
		}
	}
	return true
}

// result is what names the execution behind r: its Location and body.
func (r reply) result() string { return r.field("Location") + "\x00" + string(r.body) }

// field is the value of one of replayedFields, Content-Type reduced to its
// media type.
func (r reply) field(name string) string {
	v := strings.TrimSpace(r.header.Get(name))
	if name == "Content-Type" {
		v, _, _ = strings.Cut(v, ";")
		v = strings.ToLower(strings.TrimSpace(v))
	}
	return v
}

// String is the reply for an example: status, mark, body (shortened) and
// the replayedFields it has.
func (r reply) String() string {
	mark := ""
	if r.replayed() {
		mark = " (replayed)"
	}
	var fields []string
	for _, f := range replayedFields {
		if v := r.field(f); v != "" {
			fields = append(fields, f+": "+v)
		}
	}
	s := fmt.Sprintf("%d%s %s", r.status, mark, short(r.body))
	if len(fields) > 0 {
		s += " [" + strings.Join(fields, "; ") + "]"
	}
	return s
}

func short(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return strconv.Quote(s)
}

// quoteKey is key as an RFC 8941 sf-string, the draft's form of the field.
func quoteKey(key string) string { return `"` + key + `"` }

// post sends req with the credential set hdr through the HTTP client.
func (c *checker) post(ctx context.Context, hdr http.Header, req request) (reply, error) {
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, c.target.String(), bytes.NewReader(req.body))
	if err != nil {
		return reply{}, err
	}
	for k, vs := range hdr {
		hr.Header[http.CanonicalHeaderKey(k)] = append([]string(nil), vs...)
	}
	if h := hr.Header.Get("Host"); h != "" {
		hr.Host = h
		hr.Header.Del("Host")
	}
	if hr.Header.Get("Content-Type") == "" {
		hr.Header.Set("Content-Type", "application/json")
	}
	hr.Header.Set("Idempotency-Key", quoteKey(req.key))
	resp, err := c.client.Do(hr)
	if err != nil {
		c.sent(hdr, req.key, req.body, reply{})
		return reply{}, c.heard(err)
	}
	defer resp.Body.Close()
	c.sent(hdr, req.key, req.body, reply{status: resp.StatusCode, header: resp.Header})
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return reply{}, c.heard(fmt.Errorf("reading the response: %w", err))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxBody))
	return reply{status: resp.StatusCode, header: resp.Header, body: body}, c.heard(nil)
}

// silenceLimit is how long the target may answer nothing, every exchange
// meanwhile failing, before the run ends (in timeouts: each of those
// exchanges may have waited one).
const silenceLimit = 3

// heard records the outcome of an exchange with the target: nil if it
// answered. A target that has answered nothing while exchanges kept
// failing for silenceLimit timeouts has stopped answering: the run ends
// (a run against it would otherwise wait a timeout for every request
// left). It returns err.
func (c *checker) heard(err error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	switch {
	case err == nil:
		c.silentSince = time.Time{}
	case c.silentSince.IsZero():
		c.silentSince = now.Add(-c.cfg.Timeout) // the failed exchange may have waited that long
	case now.Sub(c.silentSince) >= silenceLimit*c.cfg.Timeout:
		c.abort(fmt.Errorf("blackbox: target %s stopped answering: nothing for %v, every request meanwhile failed (last: %w)",
			c.target.Redacted(), now.Sub(c.silentSince).Round(time.Millisecond), err))
	}
	return err
}

// settle sends req, and again while the target answers 409 (in flight),
// for up to Config.Timeout: a retry waits out a key in flight, as a
// client would, since a target may answer before it stores the result (a
// middleware that stores once the response has gone out).
//
// A key still 409 after that fails the check that sent it, so the run has
// failed already; later settles send once and do not wait, so that a
// target that answers 409 for ever holds the run for one timeout, not one
// per key.
func (c *checker) settle(ctx context.Context, hdr http.Header, req request) (reply, error) {
	deadline := time.Now().Add(c.cfg.Timeout)
	for {
		r, err := c.post(ctx, hdr, req)
		if err != nil || r.status != http.StatusConflict {
			return r, err
		}
		c.mu.Lock()
		if !c.stuck && time.Now().After(deadline) {
			c.stuck = true
		}
		stuck := c.stuck
		c.mu.Unlock()
		if stuck {
			return r, nil
		}
		if !sleep(ctx, 50*time.Millisecond) {
			return r, ctx.Err()
		}
	}
}

// inFlight explains a 409 that settle returned, for a failure's example.
func (c *checker) inFlight(r reply) string {
	if r.status != http.StatusConflict {
		return ""
	}
	return fmt.Sprintf(" (still in flight: a retry waits out 409 for up to %v, and not at all once a key stayed 409 that long)",
		c.cfg.Timeout)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// rawRequest is req as bytes on the wire, with the Idempotency-Key field
// values given as they are (one field per value), so that values net/http
// would refuse to send can be sent.
func (c *checker) rawRequest(hdr http.Header, keyValues []string, body []byte) []byte {
	var b bytes.Buffer
	host := c.target.Host
	if h := hdr.Get("Host"); h != "" {
		host = h
	}
	fmt.Fprintf(&b, "POST %s HTTP/1.1\r\nHost: %s\r\n", c.target.RequestURI(), host)
	hasType := false
	for k, vs := range hdr {
		switch http.CanonicalHeaderKey(k) {
		case "Host", "Content-Length", "Connection", "Idempotency-Key", "Transfer-Encoding":
			continue
		case "Content-Type":
			hasType = true
		}
		for _, v := range vs {
			fmt.Fprintf(&b, "%s: %s\r\n", k, v)
		}
	}
	if !hasType {
		b.WriteString("Content-Type: application/json\r\n")
	}
	for _, v := range keyValues {
		fmt.Fprintf(&b, "Idempotency-Key: %s\r\n", v)
	}
	fmt.Fprintf(&b, "Content-Length: %d\r\nConnection: close\r\n\r\n", len(body))
	b.Write(body)
	return b.Bytes()
}

// dial opens a connection to the target, TLS for https.
func (c *checker) dial(ctx context.Context) (net.Conn, error) {
	host := c.target.Host
	if c.target.Port() == "" {
		port := "80"
		if c.target.Scheme == "https" {
			port = "443"
		}
		host = net.JoinHostPort(c.target.Hostname(), port)
	}
	d := net.Dialer{Timeout: c.cfg.Timeout}
	conn, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, err
	}
	if c.target.Scheme == "https" {
		tc := tls.Client(conn, &tls.Config{ServerName: c.target.Hostname(), NextProtos: []string{"http/1.1"}})
		hctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
		defer cancel()
		if err := tc.HandshakeContext(hctx); err != nil {
			conn.Close()
			return nil, err
		}
		conn = tc
	}
	return conn, nil
}

// open dials the target for one raw exchange, bounded by Config.Timeout
// and cut short when ctx ends. The caller calls done when finished with
// the connection, which closes it.
func (c *checker) open(ctx context.Context) (conn net.Conn, done func(), err error) {
	conn, err = c.dial(ctx)
	if err != nil {
		return nil, nil, c.heard(err)
	}
	_ = conn.SetDeadline(time.Now().Add(c.cfg.Timeout))
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	return conn, func() { stop(); conn.Close() }, nil
}

// exchangeRaw writes raw on a new connection and reads the answer. A
// target that leaves a malformed request unanswered has not stopped
// answering, so only an answer counts for heard.
func (c *checker) exchangeRaw(ctx context.Context, raw []byte) (reply, error) {
	conn, done, err := c.open(ctx)
	if err != nil {
		return reply{}, err
	}
	defer done()
	if _, err := conn.Write(raw); err != nil {
		return reply{}, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return reply{}, fmt.Errorf("reading the response: %w", err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: body}, c.heard(nil)
}

// sendAndDrop writes raw on a new connection and closes it without reading
// anything: the answer, if the target sends one, is lost.
func (c *checker) sendAndDrop(ctx context.Context, raw []byte) error {
	conn, done, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer done()
	_, err = conn.Write(raw)
	return err
}

// sendAndCut writes raw, waits for the status line of the answer and closes
// the connection with the rest unread. It returns the status.
func (c *checker) sendAndCut(ctx context.Context, raw []byte) (int, error) {
	conn, done, err := c.open(ctx)
	if err != nil {
		return 0, err
	}
	defer done()
	if _, err := conn.Write(raw); err != nil {
		return 0, c.heard(err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return 0, c.heard(fmt.Errorf("reading the status line: %w", err))
	}
	c.heard(nil)
	f := strings.Fields(line)
	if len(f) < 2 {
		return 0, fmt.Errorf("malformed status line %q", line)
	}
	status, err := strconv.Atoi(f[1])
	if err != nil {
		return 0, fmt.Errorf("malformed status line %q", line)
	}
	return status, nil
}

// sendAndLeave writes raw, shuts the connection's sending side (to the
// target, the client has gone) and reads whatever answer still comes.
func (c *checker) sendAndLeave(ctx context.Context, raw []byte) (reply, error) {
	conn, done, err := c.open(ctx)
	if err != nil {
		return reply{}, err
	}
	defer done()
	if _, err := conn.Write(raw); err != nil {
		return reply{}, c.heard(err)
	}
	if cw, ok := conn.(interface{ CloseWrite() error }); ok {
		if err := cw.CloseWrite(); err != nil {
			return reply{}, err
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		// The target dropped the connection without an answer: what it
		// did is unknown.
		return reply{}, nil
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return reply{}, nil
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: body}, c.heard(nil)
}
