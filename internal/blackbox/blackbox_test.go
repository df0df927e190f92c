package blackbox

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/archlab/idempotency/idemhttp"
	"github.com/archlab/idempotency/internal/verdict"
)

// twoCallers are the credential sets of the tests: the scope check needs two.
var twoCallers = []http.Header{
	{"Authorization": {"Bearer alice"}},
	{"Authorization": {"Bearer bob"}},
}

// testConfig keeps a run small: a few keys per check, 8 duplicates, the
// last retries half a second after the first answers.
func testConfig(target string) Config {
	return Config{Target: target, Headers: twoCallers, Concurrency: 8, Requests: 4, Seed: 1, Timeout: 5 * time.Second,
		Window: 500 * time.Millisecond}
}

// logWriter sends Run's progress lines to the test log.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// run checks target and returns the report; the report is logged, so a
// failing test shows what the checker saw.
func run(t *testing.T, cfg Config) *verdict.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	rep := verdict.New()
	if err := Run(ctx, cfg, rep, logWriter{t}); err != nil {
		t.Fatalf("Run: %v", err)
	}
	var b strings.Builder
	if err := rep.Write(&b); err != nil {
		t.Fatal(err)
	}
	t.Logf("report:\n%s", b.String())
	return rep
}

// failed returns the names of the checks that did not hold (skips aside).
func failed(rep *verdict.Report) []string {
	var names []string
	for _, c := range rep.Checks() {
		if c.Skipped == "" && !c.OK() {
			names = append(names, c.Name)
		}
	}
	return names
}

func skipped(rep *verdict.Report) map[string]string {
	m := map[string]string{}
	for _, c := range rep.Checks() {
		if c.Skipped != "" {
			m[c.Name] = c.Skipped
		}
	}
	return m
}

func wantFailed(t *testing.T, rep *verdict.Report, want ...string) {
	t.Helper()
	got := failed(rep)
	slices.Sort(got)
	slices.Sort(want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("failed checks (-want +got):\n%s", diff)
	}
}

// wantAllHeld requires every check to have run and held.
func wantAllHeld(t *testing.T, rep *verdict.Report) {
	t.Helper()
	wantFailed(t, rep)
	if s := skipped(rep); len(s) > 0 {
		t.Errorf("checks skipped: %v", s)
	}
	if passed, failed := rep.Counts(); passed != len(Checks()) || failed != 0 {
		t.Errorf("Counts() = %d passed, %d failed; want %d, 0", passed, failed, len(Checks()))
	}
}

func example(rep *verdict.Report, name string) string {
	for _, c := range rep.Checks() {
		if c.Name == name {
			return strings.Join(c.Examples, "\n")
		}
	}
	return ""
}

func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL + "/orders"
}

// A server that does not deduplicate at all runs every POST: the retry,
// the duplicates, the other body and the retry after a lost answer all
// execute, malformed keys are ignored, and the first caller's retry is a
// new order.
func TestFlagsNoDeduplication(t *testing.T) {
	rep := run(t, testConfig(serve(t, &orders{})))
	wantFailed(t, rep, CheckRetry, CheckConcurrent, CheckApart, CheckPayload, CheckMalformed, CheckLost, CheckScope)
	if ex := example(rep, CheckConcurrent); !strings.Contains(ex, "distinct 2xx bodies") {
		t.Errorf("concurrent example does not name the double execution: %q", ex)
	}
	if ex := example(rep, CheckRetry); !strings.Contains(ex, "ord_") {
		t.Errorf("retry example does not show the answers: %q", ex)
	}
	// The server never marks replays: the lost response is caught by
	// comparing the retry with the answer to a client that left.
	if ex := example(rep, CheckLost); !strings.Contains(ex, "left while it ran") || !strings.Contains(ex, "ran again") {
		t.Errorf("lost response example does not name the second execution: %q", ex)
	}
	if rep.OK() {
		t.Error("report OK for a server without deduplication")
	}
}

// A server that deduplicates by key alone replays a different body's
// request: only the payload check may fail.
func TestFlagsIgnoredPayload(t *testing.T) {
	rep := run(t, testConfig(serve(t, newToy(flaws{ignorePayload: true}))))
	wantFailed(t, rep, CheckPayload)
	if ex := example(rep, CheckPayload); !strings.Contains(ex, "want 422") || !strings.Contains(ex, "(replayed)") {
		t.Errorf("payload example does not show the replay: %q", ex)
	}
}

// A check-then-act server (look up, run, store, no atomic claim) is right
// for sequential retries, but concurrent duplicates all run.
func TestFlagsCheckThenAct(t *testing.T) {
	rep := run(t, testConfig(serve(t, newToy(flaws{checkThenAct: true}))))
	wantFailed(t, rep, CheckConcurrent)
	if ex := example(rep, CheckConcurrent); !strings.Contains(ex, "distinct 2xx bodies") {
		t.Errorf("concurrent example does not name the double execution: %q", ex)
	}
}

// A server that forgets the result of a request whose client went away
// runs the retry again: the lost-response check catches it by comparing the
// retry with the answer the server gave the departed client.
func TestFlagsForgottenLostResponse(t *testing.T) {
	rep := run(t, testConfig(serve(t, newToy(flaws{forgetGone: true}))))
	wantFailed(t, rep, CheckLost)
	if ex := example(rep, CheckLost); !strings.Contains(ex, "ran again") {
		t.Errorf("lost response example does not name the second execution: %q", ex)
	}
}

// The same toy without flaws passes everything: the checker has no false
// positives on a correct server it did not write itself.
func TestPassesCorrectToy(t *testing.T) {
	wantAllHeld(t, run(t, testConfig(serve(t, newToy(flaws{})))))
}

func TestPassesMiddleware(t *testing.T) {
	h, err := guarded(nil)
	if err != nil {
		t.Fatal(err)
	}
	wantAllHeld(t, run(t, testConfig(serve(t, h))))
}

// With the middleware answering 409 for conflicts, the checker must be told
// so; without, the payload check fails.
func TestConflictStatus(t *testing.T) {
	h, err := guarded(&idemhttp.Options{ConflictStatus: http.StatusConflict})
	if err != nil {
		t.Fatal(err)
	}
	target := serve(t, h)
	cfg := testConfig(target)
	cfg.ConflictStatus = http.StatusConflict
	wantAllHeld(t, run(t, cfg))
	wantFailed(t, run(t, testConfig(target)), CheckPayload)
}

// A server whose answers are the same bytes whatever ran cannot be caught
// running twice: the checks that rely on telling executions apart are
// skipped with the reason, and the payload check still catches it.
func TestIdenticalAnswersAreNotProof(t *testing.T) {
	rep := run(t, testConfig(serve(t, http.HandlerFunc(sameAnswer))))
	s := skipped(rep)
	for _, name := range []string{CheckConcurrent, CheckScope} {
		if !strings.Contains(s[name], "unique per execution") && !strings.Contains(s[name], "identical bytes") {
			t.Errorf("%s: skipped = %q; want the identical-answers reason", name, s[name])
		}
	}
	if !slices.Contains(failed(rep), CheckPayload) {
		t.Errorf("payload check held for a server that ignores keys: %v", failed(rep))
	}
}

func TestOneCredentialSetSkipsScope(t *testing.T) {
	h, err := guarded(nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(serve(t, h))
	cfg.Headers = cfg.Headers[:1]
	rep := run(t, cfg)
	if s := skipped(rep); !strings.Contains(s[CheckScope], "only one credential set") || len(s) != 1 {
		t.Errorf("skipped = %v; want only the scope check", s)
	}
	wantFailed(t, rep)
}

func TestUnreachableTarget(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	rep := verdict.New()
	err = Run(t.Context(), testConfig("http://"+addr+"/orders"), rep, nil)
	if err == nil || !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("Run on a closed port = %v; want an unreachable error", err)
	}
}

func TestInvalidConfig(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no target":       {},
		"not http":        {Target: "ftp://127.0.0.1/x"},
		"no host":         {Target: "http:///orders"},
		"template":        {Target: "http://127.0.0.1:1/", BodyTemplate: `{"id":{{unique}}}`},
		"conflict status": {Target: "http://127.0.0.1:1/", ConflictStatus: 42},
	} {
		if err := Run(t.Context(), cfg, verdict.New(), nil); err == nil {
			t.Errorf("%s: Run accepted %+v", name, cfg)
		}
	}
}

// The body template's placeholders: {{unique}} differs per logical request
// and run, {{seq}} counts.
func TestRender(t *testing.T) {
	c, err := newChecker(Config{Target: "http://127.0.0.1:1/", BodyTemplate: `{"u":"{{unique}}","n":{{seq}}}`}, verdict.New(), nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b := c.next(), c.next()
	if a.key == b.key || string(a.body) == string(b.body) {
		t.Fatalf("two requests share a key or body: %+v %+v", a, b)
	}
	if !strings.Contains(string(b.body), `"n":2}`) || !strings.Contains(string(a.body), c.runID) {
		t.Fatalf("bodies %s %s lack the sequence or the run id %s", a.body, b.body, c.runID)
	}
	r := c.reshape(a)
	if r.key != a.key || string(r.body) == string(a.body) {
		t.Fatalf("reshape(%+v) = %+v; want the key with another body", a, r)
	}
}

// TestPassesIdemproxy builds cmd/idemproxy and checks it, as a process, in
// front of an upstream that creates an order per request.
func TestPassesIdemproxy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs idemproxy; skipped in -short mode")
	}
	bin := filepath.Join(t.TempDir(), "idemproxy")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/archlab/idempotency/cmd/idemproxy").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	upstream := httptest.NewServer(&orders{})
	t.Cleanup(upstream.Close)
	proxy := startProxy(t, bin, "-upstream", upstream.URL, "-store", "memory", "-admin=", "-listen", "127.0.0.1:0")
	wantAllHeld(t, run(t, testConfig("http://"+proxy+"/orders")))
}

var listeningRE = regexp.MustCompile(`msg=listening proxy=(\S+)`)

// startProxy runs the proxy until the test ends and returns its address.
func startProxy(t *testing.T, bin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(cmd.Environ(), "IDEMPROXY_LOG_FORMAT=text")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		wg.Wait()
		_ = cmd.Wait()
	})
	addr := make(chan string, 1)
	var logs strings.Builder
	var mu sync.Mutex
	wg.Go(func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			mu.Lock()
			logs.WriteString(sc.Text() + "\n")
			mu.Unlock()
			if m := listeningRE.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case addr <- m[1]:
				default:
				}
			}
		}
		close(addr)
	})
	select {
	case a, ok := <-addr:
		if ok {
			return a
		}
	case <-time.After(20 * time.Second):
	}
	mu.Lock()
	defer mu.Unlock()
	t.Fatalf("idemproxy did not start listening:\n%s", logs.String())
	return ""
}
