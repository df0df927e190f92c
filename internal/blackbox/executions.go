package blackbox

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// An execution counter is the one way a black box can see a second
// execution that answers like the first (a duplicate run and then
// answered the stored result, or run again after its client left and the
// answer was dropped): the target says how many times its operation has
// run, and the run compares the count with the operations it sent.

// operation is one operation the run sent: a caller, a key and a body.
// Every request with the same three is the same operation, to run at most
// once.
type operation struct{ caller, key, body string }

// callerOf names the credential set hdr for operation: its fields, in
// the sorted form http.Header.Write gives.
func callerOf(hdr http.Header) string {
	var b bytes.Buffer
	_ = hdr.Write(&b)
	return b.String()
}

// opRecord is what the run knows of whether an operation ran, for
// CheckExecutions.
type opRecord struct {
	// mayHaveRun: some answer to it was not a refusal (anything but 4xx),
	// or a 4xx the target marked as a replay (a stored result, so the
	// operation ran and ended so), or none came (a lost request).
	mayHaveRun bool
	// refused: a check judged a 4xx to it the refusal it asked for, which
	// the draft gives a request that is not run: 400 to a malformed key,
	// Config.ConflictStatus to another body on a key in use, 409 or 422
	// to another caller's use of a key. Any other 4xx leaves it unknown: a
	// target may run an operation and then refuse it (a business rule
	// checked after an audit row).
	refused bool
}

// sent records an answer r (status 0: none, or none known) to a request
// of op, for CheckExecutions.
func (c *checker) sent(hdr http.Header, key string, body []byte, r reply) {
	if c.counter == nil {
		return
	}
	op := operation{caller: callerOf(hdr), key: key, body: string(body)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ops == nil {
		c.ops = map[operation]opRecord{}
	}
	rec := c.ops[op]
	rec.mayHaveRun = rec.mayHaveRun || r.status < 400 || r.status >= 500 || r.replayed()
	c.ops[op] = rec
}

// refused records that the operation of hdr, key and body was answered the
// refusal the check asked for (see opRecord.refused).
func (c *checker) refused(hdr http.Header, key string, body []byte) {
	if c.counter == nil {
		return
	}
	op := operation{caller: callerOf(hdr), key: key, body: string(body)}
	c.mu.Lock()
	defer c.mu.Unlock()
	rec := c.ops[op]
	rec.refused = true
	c.ops[op] = rec
}

// counted reads the target's execution counter: a GET of
// Config.Executions with the first credential set, answered 200 with a
// decimal integer.
func (c *checker) counted(ctx context.Context) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.counter.String(), nil)
	if err != nil {
		return 0, err
	}
	for k, vs := range c.creds() {
		switch http.CanonicalHeaderKey(k) {
		case "Content-Type", "Idempotency-Key":
			continue
		}
		req.Header[http.CanonicalHeaderKey(k)] = append([]string(nil), vs...)
	}
	if h := req.Header.Get("Host"); h != "" {
		req.Host = h
		req.Header.Del("Host")
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s answered %d %s, want 200 and a count", c.counter.Redacted(), resp.StatusCode, short(b))
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("GET %s answered %s, want a count (a decimal integer, 0 or more)", c.counter.Redacted(), short(b))
	}
	return n, nil
}

// finishExecutions decides CheckExecutions: the executions the target
// counted during the run may not exceed the operations that may have run:
// all but those answered only 4xx and judged the refusals asked for.
// Every operation whose outcome is unknown (no answer, or a 4xx the run
// did not ask for) is allowed one execution, so the bound is loose by
// those that did not run.
func (c *checker) finishExecutions(ctx context.Context, before int64) {
	after, err := c.counted(ctx)
	if err != nil {
		c.rep.Fail(CheckExecutions, "reading the execution counter at the end of the run failed: %v", err)
		return
	}
	c.mu.Lock()
	bound, refused, unknown := 0, 0, 0
	for _, rec := range c.ops {
		switch {
		case rec.mayHaveRun:
			bound++
		case rec.refused:
			refused++
		default:
			bound++
			unknown++
		}
	}
	sent := len(c.ops)
	c.mu.Unlock()
	ran := after - before
	switch {
	case ran < 0:
		c.rep.Fail(CheckExecutions, "the execution counter went from %d to %d during the run: it must count up, and only this "+
			"target's executions", before, after)
	case ran > int64(bound):
		c.rep.Fail(CheckExecutions, "the target counted %d executions during the run, but at most %d of the %d operations sent "+
			"(a caller, a key and a body each) may have run (%d were answered only the refusal asked for: 400 to a malformed "+
			"key, %d to another body, a second caller's reuse of a key refused; %d answered only another 4xx are counted as "+
			"may have run): at least %d executions were of an operation that had run already",
			ran, bound, sent, refused, c.cfg.ConflictStatus, unknown, ran-int64(bound))
	default:
		c.rep.Pass(CheckExecutions)
	}
}
