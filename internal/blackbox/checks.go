package blackbox

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// lostWait is how long the lost-response check waits before the retry, so
// that the dropped request has reached the target.
const lostWait = 150 * time.Millisecond

func (c *checker) creds() http.Header { return c.cfg.Headers[0] }

// fresh records the answer to a request with a fresh key.
func (c *checker) fresh(req request, r reply) {
	c.rep.Check(CheckFresh, r.ok(), "key %s: a fresh key answered %s, want 2xx", req.key, r)
	if r.replayed() {
		c.mu.Lock()
		c.markFailures++
		c.mu.Unlock()
		c.rep.Fail(CheckMarked, "key %s: the first answer to a fresh key is marked as a replay: %s", req.key, r)
	}
}

// sawReplay records a reply known to be a replay of an earlier answer, for
// CheckMarked, which is decided at the end of the run (see finishMarked).
func (c *checker) sawReplay(req request, r reply) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.replayed() {
		c.markedReplays++
		return
	}
	c.unmarkedReplays++
	if len(c.unmarked) < 5 {
		c.unmarked = append(c.unmarked, fmt.Sprintf("key %s: a replay without %s: true: %s", req.key, ReplayedHeader, r))
	}
}

// finishMarked decides CheckMarked: a target that never marks replays is
// skipped (the header is a convention, not the draft); one that marks some
// replays must mark them all.
func (c *checker) finishMarked() {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.markedReplays+c.unmarkedReplays == 0 && c.markFailures == 0:
		c.rep.Skip(CheckMarked, "no replay was observed")
	case c.markedReplays == 0 && c.markFailures == 0:
		c.rep.Skip(CheckMarked, fmt.Sprintf("none of %d retries answered like the first carried %s: true (the draft "+
			"does not require it, but without it a replay cannot be told from a new execution)", c.unmarkedReplays, ReplayedHeader))
	default:
		for range c.markedReplays {
			c.rep.Pass(CheckMarked)
		}
		for i := range c.unmarkedReplays {
			ex := "a replay without the header"
			if i < len(c.unmarked) {
				ex = c.unmarked[i]
			}
			c.rep.Fail(CheckMarked, "%s", ex)
		}
	}
}

// identityProbes is the number of fresh keys the preflight sends one body
// under. Two would do for answers that name each execution (an order id);
// more catch answers that differ between some executions only, since they
// come from a small pool (the node or shard that served the request, a
// coarse clock): any two alike, keys aside, and a second execution may
// answer like the first.
const identityProbes = 4

// preflight reaches the target (an error if it cannot) and finds out
// whether its answers identify executions: one body under identityProbes
// fresh keys, every 2xx answer compared with every other.
func (c *checker) preflight(ctx context.Context) error {
	body := c.next().body
	type probe struct {
		body     []byte // the answer's body, its key taken out
		location string // its Location, its key taken out
	}
	var answers []probe
	c.bodyIdentifies, c.identifies = true, true
	for i := range identityProbes {
		req := request{key: c.next().key, body: body}
		r, err := c.post(ctx, c.creds(), req)
		switch {
		case err != nil && i == 0:
			return fmt.Errorf("blackbox: target %s unreachable: %w", c.target.Redacted(), err)
		case err != nil:
			// It answered before: whether it has stopped is for heard
			// to find out.
			c.rep.Fail(CheckFresh, "key %s: a fresh request failed: %v", req.key, err)
			continue
		}
		c.fresh(req, r)
		if !r.ok() {
			continue
		}
		// An answer that names its key (a resource whose id is the key)
		// but nothing else unique to the execution differs from key to
		// key, and is the same bytes however often one key runs: compare
		// the answers without the keys. The created resource may be
		// named by Location alone (201, a body that is the same for
		// every execution).
		p := probe{body: bytes.ReplaceAll(r.body, []byte(req.key), nil),
			location: strings.ReplaceAll(r.field("Location"), req.key, "")}
		for _, q := range answers {
			if bytes.Equal(p.body, q.body) {
				c.bodyIdentifies = false
				if p.location == q.location {
					c.identifies = false
				}
			}
		}
		answers = append(answers, p)
	}
	// Known: every probe was answered 2xx, or two were alike (then the
	// answers cannot identify executions, whatever the others were). Else
	// the answers are taken to identify executions, and the checks compare
	// them, since nothing says they cannot.
	c.probed = len(answers) == identityProbes || !c.identifies
	if !c.probed {
		c.logf("note: the target refused a fresh request; whether its answers identify executions is unknown")
	} else if !c.identifies {
		c.logf("note: two executions of one body answered the same bytes (the keys aside); double execution is invisible")
	}
	return nil
}

// answeredKey is a key of CheckRetry with its first answer, and when it
// came.
type answeredKey struct {
	req   request
	first reply
	at    time.Time
}

// heldRetry records a retry that answered the same as the first answer. It
// proves a replay only if the target's answers identify executions or the
// retry is marked as a replay; otherwise it is counted for finishRetry.
func (c *checker) heldRetry(req request, r reply) {
	c.sawReplay(req, r)
	if c.identifies || r.replayed() {
		c.rep.Pass(CheckRetry)
		return
	}
	c.mu.Lock()
	c.unprovenRetries++
	c.mu.Unlock()
}

// finishRetry skips CheckRetry when no retry could be told from a second
// execution.
func (c *checker) finishRetry() {
	c.mu.Lock()
	unproven := c.unprovenRetries
	c.mu.Unlock()
	for _, ch := range c.rep.Checks() {
		if ch.Name == CheckRetry && ch.Passed == 0 && ch.Failed == 0 && unproven > 0 {
			c.rep.Skip(CheckRetry, fmt.Sprintf("%d retries answered the first answer's bytes, but a second execution of this "+
				"target answers the same bytes and none was marked %s: true, so none can be told from one", unproven, ReplayedHeader))
		}
	}
}

// finishVisible decides CheckVisible: a run in which neither the answers
// identify executions nor the target marks replays could not have seen a
// second execution anywhere, so whatever else held proves nothing.
func (c *checker) finishVisible() {
	c.mu.Lock()
	marks := c.markedReplays > 0
	c.mu.Unlock()
	if !c.probed && !marks {
		c.rep.Skip(CheckVisible, "the fresh requests that show whether the answers identify executions did not "+
			"all succeed (see "+strconv.Quote(CheckFresh)+"), and no replay was marked "+ReplayedHeader+": true")
		return
	}
	c.rep.Check(CheckVisible, c.identifies || marks, "two executions of one body answered the same bytes (the keys aside) "+
		"and no replay was marked %s: true, so no check of this run could see an operation run twice; "+
		"make the answer hold something unique per execution (a created resource's id) or mark replays", ReplayedHeader)
}

// checkRetry: the same key and body, sent after the first answer arrived,
// get the same answer (status, body, replayedFields).
func (c *checker) checkRetry(ctx context.Context) {
	for range c.cfg.Requests {
		if ctx.Err() != nil {
			return
		}
		req := c.next()
		r1, err := c.post(ctx, c.creds(), req)
		if err != nil {
			c.rep.Fail(CheckRetry, "key %s: first request failed: %v", req.key, err)
			continue
		}
		at := time.Now()
		c.fresh(req, r1)
		if !r1.ok() {
			// A refusal may rightly not be stored (a retry may run), and
			// one repeated proves no replay; CheckFresh has it.
			continue
		}
		r2, err := c.settle(ctx, c.creds(), req)
		if err != nil {
			c.rep.Fail(CheckRetry, "key %s: retry failed: %v", req.key, err)
			continue
		}
		if !r2.same(r1) {
			c.rep.Fail(CheckRetry, "key %s: first answer %s, retry %s%s", req.key, r1, r2, c.inFlight(r2))
			continue
		}
		c.heldRetry(req, r2)
		c.answered = append(c.answered, answeredKey{req: req, first: r1, at: at})
	}
}

// checkWindow sends each key of checkRetry once more, Config.Window after
// its first answer: the answer must still be the first one.
func (c *checker) checkWindow(ctx context.Context) {
	for _, k := range c.answered {
		if !sleep(ctx, time.Until(k.at.Add(c.cfg.Window))) {
			return
		}
		age := time.Since(k.at).Round(time.Millisecond)
		r, err := c.settle(ctx, c.creds(), k.req)
		if err != nil {
			c.rep.Fail(CheckRetry, "key %s: the retry %v after the first answer failed: %v", k.req.key, age, err)
			continue
		}
		if r.status == http.StatusConflict {
			c.rep.Fail(CheckRetry, "key %s: first answer %s, but a retry %v later %s%s", k.req.key, k.first, age, r, c.inFlight(r))
			continue
		}
		if !r.same(k.first) {
			c.rep.Fail(CheckRetry, "key %s: first answer %s, but a retry %v later %s: the key was forgotten within %v",
				k.req.key, k.first, age, r, c.cfg.Window)
			continue
		}
		c.heldRetry(k.req, r)
	}
}

// checkConcurrent: duplicates released together yield at most one distinct
// 2xx result (body and Location), and a later retry replays it.
//
// A target that marks its replays (CheckRetry saw one) answers at most one
// duplicate unmarked: the others are replays or 409. More than one
// unmarked 2xx is more than one execution, even where every answer is the
// same bytes (answers that do not identify executions, or every runner
// answered the first stored result).
func (c *checker) checkConcurrent(ctx context.Context) {
	c.mu.Lock()
	marks := c.markedReplays > 0
	c.mu.Unlock()
	if !c.identifies && !marks {
		c.rep.Skip(CheckConcurrent, "two executions of one body answered identical bytes and no replay was marked "+
			ReplayedHeader+": true, so a second execution would be invisible; the target's answers must hold "+
			"something unique per execution (an id), or its replays a mark")
		return
	}
	n := c.cfg.Concurrency
	for range c.cfg.Requests {
		if ctx.Err() != nil {
			return
		}
		req := c.next()
		replies := make([]reply, n)
		errs := make([]error, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-start
				replies[i], errs[i] = c.post(ctx, c.creds(), req)
			})
		}
		close(start)
		wg.Wait()

		var problems []string
		unmarked := 0          // 2xx answered as first answers
		var successes []string // distinct 2xx results: executions
		var answers []reply    // distinct 2xx answers (status, body, fields)
		statuses := map[int]int{}
		for i, r := range replies {
			if errs[i] != nil {
				problems = append(problems, fmt.Sprintf("a duplicate failed: %v", errs[i]))
				continue
			}
			statuses[r.status]++
			switch {
			case r.ok():
				if !r.replayed() {
					unmarked++
				}
				if !slices.Contains(successes, r.result()) {
					successes = append(successes, r.result())
				}
				if !slices.ContainsFunc(answers, r.same) {
					answers = append(answers, r)
				}
			case r.status == http.StatusConflict:
			default:
				problems = append(problems, fmt.Sprintf("a duplicate answered %s, want 2xx or 409", r))
			}
		}
		if marks && unmarked > 1 {
			problems = append(problems, fmt.Sprintf("%d duplicates answered 2xx without %s: true, as only a first answer "+
				"is, though the target marks its replays: it ran %d times (or answered replays unmarked)",
				unmarked, ReplayedHeader, unmarked))
		}
		if len(successes) > 1 {
			ex := make([]string, 0, 3)
			for _, res := range successes[:min(3, len(successes))] {
				loc, body, _ := strings.Cut(res, "\x00")
				if loc != "" {
					body += " [Location: " + loc + "]"
				}
				ex = append(ex, short([]byte(body)))
			}
			problems = append(problems, fmt.Sprintf("%d distinct 2xx bodies, so it ran at least %d times: %s",
				len(successes), len(successes), strings.Join(ex, ", ")))
		} else if len(answers) > 1 {
			// One execution, answered in more than one way: a duplicate
			// did not get the first answer.
			problems = append(problems, fmt.Sprintf("one execution answered in %d ways, not all the first answer: %s and %s",
				len(answers), answers[0], answers[1]))
		}
		if len(successes) == 0 && len(problems) == 0 {
			problems = append(problems, "none of the duplicates succeeded")
		}
		if len(answers) == 1 {
			f, err := c.settle(ctx, c.creds(), req)
			switch {
			case err != nil:
				problems = append(problems, fmt.Sprintf("the retry after the burst failed: %v", err))
			case !f.ok() || !f.same(answers[0]):
				problems = append(problems, fmt.Sprintf("the retry after the burst answered %s%s, not the burst's %s",
					f, c.inFlight(f), answers[0]))
			default:
				c.sawReplay(req, f)
			}
		}
		if len(problems) == 0 {
			c.rep.Pass(CheckConcurrent)
			continue
		}
		c.rep.Fail(CheckConcurrent, "key %s, %d concurrent requests (statuses %s): %s",
			req.key, n, statusCounts(statuses), strings.Join(problems, "; "))
	}
}

// apartKeys and apartRounds bound checkApart: rounds of up to apartKeys
// keys sent at once (fewer if Config.Concurrency is smaller, but two at
// least).
const (
	apartKeys   = 8
	apartRounds = 5
)

// checkApart: requests on different keys sent at once each get an answer
// of their own, and each key's retry, the retries sent at once too,
// replays its own first answer, not another key's. A target that is
// right one request at a time may still mix up keys that run together (a
// result kept through a buffer or a field that requests share).
func (c *checker) checkApart(ctx context.Context) {
	c.mu.Lock()
	marks := c.markedReplays > 0
	c.mu.Unlock()
	if !c.identifies && !marks {
		c.rep.Skip(CheckApart, "two executions of one body answered identical bytes and no replay was marked "+
			ReplayedHeader+": true, so neither a key's answer nor a replay can be told from another's")
		return
	}
	m := max(2, min(c.cfg.Concurrency, apartKeys))
	judged, unproven := 0, 0
	for range min(c.cfg.Requests, apartRounds) {
		if ctx.Err() != nil {
			return
		}
		reqs := make([]request, m)
		for i := range reqs {
			reqs[i] = c.next()
		}
		firsts, errs := c.together(ctx, reqs, c.post)
		ok := make([]bool, m) // answered 2xx with a result of its own
		owner := map[string]int{}
		for i, req := range reqs {
			if errs[i] != nil {
				c.rep.Fail(CheckApart, "key %s (one of %d keys sent at once): the request failed: %v", req.key, m, errs[i])
				continue
			}
			c.fresh(req, firsts[i])
			if !firsts[i].ok() {
				continue // CheckFresh has it
			}
			if j, dup := owner[firsts[i].result()]; dup && c.identifies {
				judged++
				c.rep.Fail(CheckApart, "key %s (one of %d keys sent at once) was answered %s, the answer of key %s: "+
					"another key's result", req.key, m, firsts[i], reqs[j].key)
				continue
			}
			owner[firsts[i].result()] = i
			ok[i] = true
		}
		var retry []request
		var index []int
		for i, req := range reqs {
			if ok[i] {
				retry = append(retry, req)
				index = append(index, i)
			}
		}
		seconds, errs := c.together(ctx, retry, c.settle)
		for k, i := range index {
			req, first, r := reqs[i], firsts[i], seconds[k]
			switch {
			case errs[k] != nil:
				judged++
				c.rep.Fail(CheckApart, "key %s (one of %d keys retried at once): the retry failed: %v", req.key, len(retry), errs[k])
			case r.same(first):
				c.sawReplay(req, r)
				if !c.identifies && !r.replayed() {
					unproven++ // the same bytes, unmarked: a replay or a run
					continue
				}
				judged++
				c.rep.Pass(CheckApart)
			default:
				judged++
				other := -1
				for j := range reqs {
					if j != i && ok[j] && c.identifies && firsts[j].result() == r.result() {
						other = j
					}
				}
				if other >= 0 {
					c.rep.Fail(CheckApart, "key %s (one of %d keys retried at once): the retry was answered %s, "+
						"another key's (%s) first answer, not its own %s", req.key, len(retry), r, reqs[other].key, first)
					continue
				}
				c.rep.Fail(CheckApart, "key %s (one of %d keys retried at once): first answer %s, retry %s%s",
					req.key, len(retry), first, r, c.inFlight(r))
			}
		}
	}
	switch {
	case judged > 0:
	case unproven > 0:
		c.rep.Skip(CheckApart, fmt.Sprintf("%d retries answered the first answer's bytes, but none was marked %s: true "+
			"and a second execution of this target answers the same bytes, so none can be told from one", unproven, ReplayedHeader))
	default:
		c.rep.Skip(CheckApart, "no request on keys sent at once was answered 2xx (see "+strconv.Quote(CheckFresh)+")")
	}
}

// together sends reqs at once through send, each with the first
// credential set, and returns the answers and errors in their order.
func (c *checker) together(ctx context.Context, reqs []request,
	send func(context.Context, http.Header, request) (reply, error)) ([]reply, []error) {
	replies := make([]reply, len(reqs))
	errs := make([]error, len(reqs))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, req := range reqs {
		wg.Go(func() {
			<-start
			replies[i], errs[i] = send(ctx, c.creds(), req)
		})
	}
	close(start)
	wg.Wait()
	return replies, errs
}

func statusCounts(m map[int]int) string {
	codes := make([]int, 0, len(m))
	for code := range m {
		codes = append(codes, code)
	}
	slices.Sort(codes)
	parts := make([]string, 0, len(codes))
	for _, code := range codes {
		parts = append(parts, fmt.Sprintf("%d×%d", m[code], code))
	}
	return strings.Join(parts, " ")
}

// checkPayload: the same key with another body is rejected with
// ConflictStatus, and the original body still replays its first answer.
func (c *checker) checkPayload(ctx context.Context) {
	if probe := c.next(); bytes.Equal(probe.body, c.reshape(probe).body) {
		c.rep.Skip(CheckPayload, "the body template has neither {{unique}} nor {{seq}}, so no second payload can be made")
		return
	}
	for range c.cfg.Requests {
		if ctx.Err() != nil {
			return
		}
		req := c.next()
		r1, err := c.post(ctx, c.creds(), req)
		if err != nil {
			c.rep.Fail(CheckPayload, "key %s: first request failed: %v", req.key, err)
			continue
		}
		c.fresh(req, r1)
		if !r1.ok() {
			continue // nothing stored to conflict with; CheckFresh has it
		}
		alt := c.reshape(req)
		r2, err := c.post(ctx, c.creds(), alt)
		if err == nil && r2.status == http.StatusConflict && c.cfg.ConflictStatus != http.StatusConflict {
			// Maybe in flight still (a target that stores after it
			// answers): once the original body replays, the key is
			// settled, and the other body's answer is the conflict's.
			var r reply
			if r, err = c.settle(ctx, c.creds(), req); err == nil && r.status != http.StatusConflict {
				r2, err = c.post(ctx, c.creds(), alt)
			}
		}
		if err != nil {
			c.rep.Fail(CheckPayload, "key %s: the request with a different body failed: %v", req.key, err)
			continue
		}
		if !c.rep.Check(CheckPayload, r2.status == c.cfg.ConflictStatus,
			"key %s: a different body answered %s, want %d (first answer %s)", req.key, r2, c.cfg.ConflictStatus, r1) {
			continue
		}
		c.refused(c.creds(), alt.key, alt.body)
		r3, err := c.settle(ctx, c.creds(), req)
		if err != nil {
			c.rep.Fail(CheckPayload, "key %s: the original body after the conflict failed: %v", req.key, err)
			continue
		}
		c.rep.Check(CheckPayload, r3.same(r1), "key %s: the original body after the conflict answered %s%s, not the first %s",
			req.key, r3, c.inFlight(r3), r1)
	}
}

// checkMalformed: malformed keys get 400, and the target still serves a
// valid request afterwards. The requests go on raw connections, since
// net/http refuses to send some of these values.
func (c *checker) checkMalformed(ctx context.Context) {
	base := c.next().key
	long := base + "-" + strings.Repeat("x", max(0, 256-len(base)-1))
	cases := []struct{ what, value string }{
		{"empty", ""},
		{"a list", `"` + base + `-a", "` + base + `-b"`},
		{"parameters", `"` + base + `-p";p=1`},
		{"a broken sf-string", `"` + base + `-q`},
		{"256 characters", `"` + long + `"`},
		{"a control character", `"` + base + "\x01c" + `"`},
	}
	c.mu.Lock()
	c.rng.Shuffle(len(cases), func(i, j int) { cases[i], cases[j] = cases[j], cases[i] })
	c.mu.Unlock()
	for _, tc := range cases {
		if ctx.Err() != nil {
			return
		}
		body := c.next().body
		r, err := c.exchangeRaw(ctx, c.rawRequest(c.creds(), []string{tc.value}, body))
		c.sent(c.creds(), "malformed:"+tc.value, body, r)
		if err == nil && r.status == http.StatusBadRequest {
			c.refused(c.creds(), "malformed:"+tc.value, body)
		}
		if err != nil {
			c.rep.Fail(CheckMalformed, "Idempotency-Key %s (%s): request failed: %v", strconv.Quote(tc.value), tc.what, err)
			continue
		}
		c.rep.Check(CheckMalformed, r.status == http.StatusBadRequest,
			"Idempotency-Key %s (%s) answered %s, want 400", strconv.Quote(shorten(tc.value)), tc.what, r)
	}
	req := c.next()
	r, err := c.post(ctx, c.creds(), req)
	if err != nil {
		c.rep.Fail(CheckMalformed, "a valid request after the malformed ones failed: %v", err)
		return
	}
	c.rep.Check(CheckMalformed, r.ok(), "key %s: a valid request after the malformed ones answered %s, want 2xx", req.key, r)
}

func shorten(s string) string {
	if len(s) > 60 {
		return s[:40] + "..." + s[len(s)-10:]
	}
	return s
}

// The ways a response is lost, taken in turn by checkLost.
const (
	// cutAfterSend closes the connection as soon as the request is written:
	// the target may see the client gone before it starts, and may then
	// rightly not run the request at all.
	cutAfterSend = iota
	// cutAfterStatus waits for the status line, then closes with the rest
	// unread: the target has run the request and is answering.
	cutAfterStatus
	// leftWhileRunning half-closes the connection after the request (the
	// target sees the client leave while it runs) and still reads the
	// answer, which the client is taken never to have received: the retry
	// can be compared with what the target really answered.
	leftWhileRunning
	lostVariants
)

var lostNames = [lostVariants]string{"closed after sending", "closed after the status line", "left while it ran"}

// checkLost: a request whose answer is lost on the way back is followed by
// a retry that replays it rather than runs again.
func (c *checker) checkLost(ctx context.Context) {
	c.mu.Lock()
	marks := c.markedReplays > 0
	c.mu.Unlock()
	n := max(min(c.cfg.Requests, 6), lostVariants)
	inconclusive := 0
	for i := range n {
		if ctx.Err() != nil {
			return
		}
		variant := i % lostVariants
		req := c.next()
		raw := c.rawRequest(c.creds(), []string{quoteKey(req.key)}, req.body)
		var (
			first reply // what the target answered, where it is known
			err   error
		)
		switch variant {
		case cutAfterSend:
			err = c.sendAndDrop(ctx, raw)
		case cutAfterStatus:
			first.status, err = c.sendAndCut(ctx, raw)
		case leftWhileRunning:
			first, err = c.sendAndLeave(ctx, raw)
		}
		c.sent(c.creds(), req.key, req.body, first)
		if err != nil {
			c.rep.Fail(CheckLost, "key %s (%s): sending the request failed: %v", req.key, lostNames[variant], err)
			continue
		}
		if variant == cutAfterSend && !sleep(ctx, lostWait) {
			return
		}
		r, err := c.settle(ctx, c.creds(), req)
		if err != nil {
			c.rep.Fail(CheckLost, "key %s (%s): the retry failed: %v", req.key, lostNames[variant], err)
			continue
		}
		if r.status == http.StatusConflict {
			c.rep.Fail(CheckLost, "key %s (%s): the retry was answered %s%s",
				req.key, lostNames[variant], r, c.inFlight(r))
			continue
		}
		// The lost request ran, and its answer is stored by design. Other
		// answers do not show that it ran: a target may refuse a client
		// that is gone (499, 408) or turn it away (429), and then rightly
		// run the retry.
		ran := first.ok()
		switch {
		case variant == leftWhileRunning && ran && r.replayed():
			// What the lost request was answered is known: a replay must
			// be that answer, whether or not answers identify executions.
			c.rep.Check(CheckLost, r.same(first), "key %s (%s): the target answered %s to the request, "+
				"but the retry was answered, as a replay, %s: not the answer the request got", req.key, lostNames[variant], first, r)
		case variant == leftWhileRunning && ran && c.identifies:
			c.rep.Check(CheckLost, r.same(first), "key %s (%s): the target answered %s to the request, "+
				"but the retry %s: it ran again", req.key, lostNames[variant], first, r)
		case variant == cutAfterStatus && ran && r.replayed() && r.status != first.status:
			// Only the status line was read: the replay must carry it.
			c.rep.Fail(CheckLost, "key %s (%s): the target had begun answering %d, but the retry was answered, "+
				"as a replay, %s: not the answer the request got", req.key, lostNames[variant], first.status, r)
		case r.replayed():
			c.rep.Pass(CheckLost)
		case ran && r.status >= 500:
			c.rep.Fail(CheckLost, "key %s (%s): the target had begun answering %d, but the retry answered %s instead of a replay",
				req.key, lostNames[variant], first.status, r)
		case ran && marks:
			c.rep.Fail(CheckLost, "key %s (%s): the target had begun answering %d, but the retry answered %s "+
				"without %s, though the target marks its replays: it ran again",
				req.key, lostNames[variant], first.status, r, ReplayedHeader)
		default:
			// Either the lost request never ran (a target may refuse work
			// for a client that is gone) or nothing tells a replay here.
			// A 409 on the way shows only that the lost request held the
			// key: the answer after it may be a second execution (the
			// first one abandoned, or forgotten because its client left).
			inconclusive++
		}
	}
	if inconclusive == n {
		c.rep.Skip(CheckLost, fmt.Sprintf("no retry could be judged: the target neither marked a replay with %s "+
			"nor let a lost request's answer be compared with the retry's", ReplayedHeader))
	}
}

// checkScope: the same key under two credential sets is never one caller's
// answer given to the other. The second caller's request runs for it
// (keys scoped per caller), or is refused as a reuse of the key with 422
// or 409 (keys global): either way nothing is shared and nothing runs
// twice. A refusal passes with a note; the second caller's retry must
// still not get the first caller's result (the first 409 to a retry is
// waited out for Config.Timeout, as in flight may turn into a replay), and
// its own fresh key must run (else its 409s or 422s say nothing of scope).
func (c *checker) checkScope(ctx context.Context) {
	if len(c.cfg.Headers) < 2 {
		c.rep.Skip(CheckScope, "only one credential set; give a second one to check that callers never share a key")
		return
	}
	if !c.identifies {
		c.rep.Skip(CheckScope, "two executions of one body answered identical bytes, "+
			"so one caller's answer cannot be told from the other's")
		return
	}
	h0, h1 := c.cfg.Headers[0], c.cfg.Headers[1]
	keys := 0
	refusals := map[int]int{} // keys held by a refusal, by its status
	freshTried := false       // the second caller has sent a fresh key of its own
	waited := false           // a 409 to the second caller's retry has been waited out
	for range min(c.cfg.Requests, 10) {
		if ctx.Err() != nil {
			break
		}
		req := c.next()
		a, err := c.post(ctx, h0, req)
		if err != nil {
			c.rep.Fail(CheckScope, "key %s: the first caller's request failed: %v", req.key, err)
			continue
		}
		c.fresh(req, a)
		if !a.ok() {
			continue
		}
		b, err := c.post(ctx, h1, req)
		if err != nil {
			c.rep.Fail(CheckScope, "key %s: the second caller's request failed: %v", req.key, err)
			continue
		}
		var problems []string
		refused := false
		switch {
		case c.sameResult(a, b):
			problems = append(problems, fmt.Sprintf("the second caller got the first caller's result %s (the first caller's answer %s)", b, a))
		case b.replayed():
			problems = append(problems, fmt.Sprintf("the second caller's first request was answered as a replay: %s", b))
		case c.refusesReuse(b.status):
			refused = true // the key is global, and its reuse by another caller refused: safe
			c.refused(h1, req.key, req.body)
		case !b.ok():
			problems = append(problems, fmt.Sprintf("the second caller's first request answered %s, want 2xx "+
				"(run for it) or 422/409 (its reuse of the key refused)", b))
		}
		a2, err := c.settle(ctx, h0, req)
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("the first caller's retry failed: %v", err))
		case !a2.same(a):
			problems = append(problems, fmt.Sprintf("the first caller's retry answered %s%s, not its own %s", a2, c.inFlight(a2), a))
		}
		if len(problems) == 0 {
			// The second caller's own result must replay to it, not the
			// first caller's (a target may claim per caller but keep
			// results per key). After a refusal it has no result of its
			// own; its retry must still not get the first caller's (a
			// 409 refusal is not waited out: nothing of its is in
			// flight).
			var b2 reply
			if refused {
				if !freshTried {
					// Once: a caller refused whatever the key says
					// nothing of how the first caller's key is held.
					freshTried = true
					problems = append(problems, c.runsFresh(ctx, h1, b)...)
				}
				b2, err = c.post(ctx, h1, req)
				if err == nil && b2.status == http.StatusConflict && !waited {
					// Once: a 409 may mean in flight, and a key held for
					// the first caller may yet replay its answer to the
					// second. A 409 that lasts Config.Timeout is a refusal.
					waited = true
					b2, err = c.waitOut(ctx, h1, req)
				}
			} else {
				b2, err = c.settle(ctx, h1, req)
			}
			switch {
			case err != nil:
				problems = append(problems, fmt.Sprintf("the second caller's retry failed: %v", err))
			case c.sameResult(a, b2):
				problems = append(problems, fmt.Sprintf("the second caller's retry got the first caller's result %s "+
					"(its own first answer %s)", b2, b))
			case !refused && !b2.same(b):
				problems = append(problems, fmt.Sprintf("the second caller's retry answered %s%s, not its own %s", b2, c.inFlight(b2), b))
			}
		}
		keys++
		if len(problems) == 0 {
			c.rep.Pass(CheckScope)
			if refused {
				refusals[b.status]++
			}
			continue
		}
		c.rep.Fail(CheckScope, "key %s: %s", req.key, strings.Join(problems, "; "))
	}
	if len(refusals) > 0 {
		n := 0
		for _, k := range refusals {
			n += k
		}
		c.rep.Note(CheckScope, "refused cross-caller reuse: for %d of %d keys the second caller's request was refused "+
			"(statuses %s) rather than run for it; safe, since nothing was shared or ran twice, but the target keeps "+
			"keys global, not per caller, so one caller's key blocks another's", n, keys, statusCounts(refusals))
	}
}

// runsFresh returns what is wrong when the second caller, whose request
// on the first caller's key was refused with refusal, sends a fresh key of
// its own: anything but 2xx.
func (c *checker) runsFresh(ctx context.Context, h1 http.Header, refusal reply) []string {
	req := c.next()
	r, err := c.post(ctx, h1, req)
	switch {
	case err != nil:
		return []string{fmt.Sprintf("the second caller's request on a fresh key of its own (%s) failed: %v", req.key, err)}
	case !r.ok():
		return []string{fmt.Sprintf("the second caller's request on a fresh key of its own (%s) answered %s, want 2xx: "+
			"its %d on the first caller's key is no refusal of that key's reuse", req.key, r, refusal.status)}
	}
	return nil
}

// waitOut sends req as hdr until it answers other than 409 or
// Config.Timeout has passed, and returns the last answer. Unlike settle,
// a key that stays 409 does not mark the target stuck: here that is a
// refusal.
func (c *checker) waitOut(ctx context.Context, hdr http.Header, req request) (reply, error) {
	deadline := time.Now().Add(c.cfg.Timeout)
	for {
		r, err := c.post(ctx, hdr, req)
		if err != nil || r.status != http.StatusConflict || time.Now().After(deadline) {
			return r, err
		}
		if !sleep(ctx, 50*time.Millisecond) {
			return r, ctx.Err()
		}
	}
}

// refusesReuse reports whether status refuses a key's reuse by another
// caller: 422 or 409, the draft's answers to a key that cannot be used
// (Config.ConflictStatus too, if it is neither).
func (c *checker) refusesReuse(status int) bool {
	return status == http.StatusUnprocessableEntity || status == http.StatusConflict || status == c.cfg.ConflictStatus
}

// sameResult reports whether a and b are one execution's result: the body
// alone where bodies identify executions (the first caller's result under
// another status or fields is still the first caller's result), else the
// body and Location.
func (c *checker) sameResult(a, b reply) bool {
	if c.bodyIdentifies {
		return bytes.Equal(a.body, b.body)
	}
	return a.result() == b.result()
}
