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

// sent records an answer (status 0: none, or none known) to a request of
// op, for CheckExecutions: a 4xx says the request did not run; any other
// answer, or none, says it may have.
func (c *checker) sent(hdr http.Header, key string, body []byte, status int) {
	if c.counter == nil {
		return
	}
	op := operation{caller: callerOf(hdr), key: key, body: string(body)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mayHaveRun == nil {
		c.mayHaveRun = map[operation]bool{}
	}
	c.mayHaveRun[op] = c.mayHaveRun[op] || status < 400 || status >= 500
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
// counted during the run may not exceed the operations that may have run.
// Every operation whose outcome is unknown is allowed one execution, so
// the bound is loose by those that did not run.
func (c *checker) finishExecutions(ctx context.Context, before int64) {
	after, err := c.counted(ctx)
	if err != nil {
		c.rep.Fail(CheckExecutions, "reading the execution counter at the end of the run failed: %v", err)
		return
	}
	c.mu.Lock()
	bound, answered := 0, len(c.mayHaveRun)
	for _, ran := range c.mayHaveRun {
		if ran {
			bound++
		}
	}
	c.mu.Unlock()
	ran := after - before
	switch {
	case ran < 0:
		c.rep.Fail(CheckExecutions, "the execution counter went from %d to %d during the run: it must count up, and only this "+
			"target's executions", before, after)
	case ran > int64(bound):
		c.rep.Fail(CheckExecutions, "the target counted %d executions during the run, but at most %d of the %d operations sent "+
			"(a caller, a key and a body each) may have run (the others were refused with 4xx): at least %d executions "+
			"were of an operation that had run already", ran, bound, answered, ran-int64(bound))
	default:
		c.rep.Pass(CheckExecutions)
	}
}
