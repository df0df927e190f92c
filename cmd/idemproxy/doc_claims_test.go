package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

// TestUpstreamPathPrefixes: a path on -upstream prefixes every request's
// path (README, -upstream).
func TestUpstreamPathPrefixes(t *testing.T) {
	paths := make(chan string, 4)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths <- r.URL.RequestURI()
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(up.Close)
	p := startInproc(t, "-upstream", up.URL+"/base", "-store", "memory")
	if r := mustPost(t, p.proxy, "/orders?x=1", "pfx", "b"); r.status != http.StatusCreated {
		t.Fatalf("guarded POST = %d %q", r.status, r.body)
	}
	if r := get(t, "http://"+p.proxy+"/orders/7"); r.status != http.StatusCreated {
		t.Fatalf("GET = %d %q", r.status, r.body)
	}
	for _, want := range []string{"/base/orders?x=1", "/base/orders/7"} {
		if got := <-paths; got != want {
			t.Errorf("upstream got %q; want %q", got, want)
		}
	}
}

// TestRequireKey: with -require-key a POST or PATCH without a key gets 400
// missing-key and never reaches the upstream; other methods pass.
func TestRequireKey(t *testing.T) {
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory", "-require-key")
	for _, method := range []string{http.MethodPost, http.MethodPatch} {
		r := do(t, method, "http://"+p.proxy+"/orders")
		if r.status != http.StatusBadRequest || !strings.Contains(r.body, "missing-key") {
			t.Errorf("%s without a key = %d %q; want 400 missing-key", method, r.status, r.body)
		}
	}
	if n := up.total.Load(); n != 0 {
		t.Fatalf("upstream called %d times for requests without a key", n)
	}
	if r := get(t, "http://"+p.proxy+"/orders"); r.status != http.StatusCreated {
		t.Errorf("GET without a key = %d; want it passed through", r.status)
	}
	if r := mustPost(t, p.proxy, "/orders", "rk", "b"); r.status != http.StatusCreated {
		t.Errorf("POST with a key = %d", r.status)
	}
}

// postWith is post with extra request header fields.
func postWith(t *testing.T, addr, path, key, body string, h http.Header) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	req.Header.Set("Idempotency-Key", `"`+key+`"`)
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// TestScopeHeader: with -scope-header a key is scoped by that header's
// value as received (two tenants' same key runs twice, each replays its
// own), requests without it share the empty scope, and /keys/ finds a key
// with scope=<the value>.
func TestScopeHeader(t *testing.T) {
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory", "-scope-header", "x-tenant-id")
	tenant := func(v string) http.Header { return http.Header{"X-Tenant-Id": {v}} }
	a := postWith(t, p.proxy, "/orders", "same", "b", tenant("acme"))
	b := postWith(t, p.proxy, "/orders", "same", "b", tenant("globex"))
	if a.body == b.body || up.ran("same") != 2 {
		t.Fatalf("two tenants' key ran %d times (%q, %q); want once each", up.ran("same"), a.body, b.body)
	}
	if r := postWith(t, p.proxy, "/orders", "same", "b", tenant("acme")); r.header.Get("Idempotent-Replayed") != "true" || r.body != a.body {
		t.Fatalf("acme's retry = %d %v %q; want acme's response replayed", r.status, r.header, r.body)
	}
	anon := postWith(t, p.proxy, "/orders", "same", "b", nil)
	if r := postWith(t, p.proxy, "/orders", "same", "b", http.Header{"Authorization": {"Bearer other"}}); r.body != anon.body {
		t.Fatalf("requests without the header do not share a scope: %q, %q", anon.body, r.body)
	}
	if r := get(t, "http://"+p.admin+"/keys/same?scope=acme"); r.status != http.StatusOK || !strings.Contains(r.body, `"DONE"`) {
		t.Fatalf("GET /keys/same?scope=acme = %d %q", r.status, r.body)
	}
}

// TestDefaultScopeAsDocumented: the scope that /keys/ and the operator
// commands take for a request with an Authorization header is "auth:" and
// the first 32 hex digits of the SHA-256 of the value and a newline, as the
// README's shell line computes it.
func TestDefaultScopeAsDocumented(t *testing.T) {
	const auth = "Bearer s3cret-token"
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory")
	postWith(t, p.proxy, "/orders", "scoped", "b", http.Header{"Authorization": {auth}})
	sum := sha256.Sum256([]byte(auth + "\n"))
	scope := "auth:" + hex.EncodeToString(sum[:])[:32]
	if sh, err := exec.LookPath("sh"); err == nil {
		if _, err := exec.LookPath("sha256sum"); err == nil {
			cmd := exec.Command(sh, "-c", `printf 'auth:%s' "$(printf '%s\n' "$AUTH" | sha256sum | cut -c1-32)"`)
			cmd.Env = append(os.Environ(), "AUTH="+auth)
			out, err := cmd.Output()
			if err != nil || string(out) != scope {
				t.Fatalf("the README's shell line gives %q (%v); Go gives %q", out, err, scope)
			}
		}
	}
	if r := get(t, "http://"+p.admin+"/keys/scoped?scope="+url.QueryEscape(scope)); r.status != http.StatusOK {
		t.Fatalf("GET /keys/scoped?scope=%s = %d %q; want the record", scope, r.status, r.body)
	}
	if r := get(t, "http://"+p.admin+"/keys/scoped"); r.status != http.StatusNotFound {
		t.Fatalf("the key in the empty scope = %d; want 404", r.status)
	}
}

// TestSweepEvery: expired records are swept every retention/4, but no more
// often than once a second and at least once a minute (README).
func TestSweepEvery(t *testing.T) {
	for _, tc := range []struct{ retention, want time.Duration }{
		{time.Second, time.Second},
		{2 * time.Second, time.Second},
		{8 * time.Second, 2 * time.Second},
		{2 * time.Minute, 30 * time.Second},
		{4 * time.Minute, time.Minute},
		{24 * time.Hour, time.Minute},
	} {
		if got := sweepEvery(tc.retention); got != tc.want {
			t.Errorf("sweepEvery(%v) = %v; want %v", tc.retention, got, tc.want)
		}
	}
}

// TestLeaseRenewedWhileUpstreamRuns: the claim is renewed while the
// upstream runs (README, -lease), so a duplicate sent after the first lease
// would have run out gets 409 instead of running the operation again.
func TestLeaseRenewedWhileUpstreamRuns(t *testing.T) {
	const lease = 300 * time.Millisecond
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory", "-lease", lease.String())
	first := make(chan reply, 1)
	go func() {
		r, _ := post(t, &http.Client{Timeout: 30 * time.Second}, p.proxy, "/block", "renewed", "b")
		first <- r
	}()
	deadline := time.Now().Add(10 * time.Second)
	for up.ran("renewed") == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(3 * lease) // the first lease is long over: only renewal holds the claim
	if r := mustPost(t, p.proxy, "/block", "renewed", "b"); r.status != http.StatusConflict {
		t.Fatalf("duplicate after %v = %d %q; want 409 in-flight (the claim renewed)", 3*lease, r.status, r.body)
	}
	up.open()
	if r := <-first; r.status != http.StatusCreated {
		t.Fatalf("first = %d %q", r.status, r.body)
	}
	if n := up.ran("renewed"); n != 1 {
		t.Fatalf("upstream ran %d times; want 1", n)
	}
}

// TestUpstreamRetryStatusesReleased: 408, 425 and 429 from the upstream,
// like 5xx, are passed on and not stored, and the key is released (README).
func TestUpstreamRetryStatusesReleased(t *testing.T) {
	var calls atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		code, _ := strconv.Atoi(r.URL.Query().Get("status"))
		w.WriteHeader(code)
	}))
	t.Cleanup(up.Close)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory")
	for _, code := range []int{408, 425, 429, 500, 400} {
		key := fmt.Sprintf("s%d", code)
		path := fmt.Sprintf("/pay?status=%d", code)
		if r := mustPost(t, p.proxy, path, key, "x"); r.status != code {
			t.Fatalf("%d passed on as %d", code, r.status)
		}
		r := get(t, "http://"+p.admin+"/keys/"+key)
		if stored := r.status == http.StatusOK && strings.Contains(r.body, `"DONE"`); stored != (code == 400) {
			// 400 is stored, for contrast.
			t.Errorf("after an upstream %d, GET /keys/%s = %d %q; want it stored only for 400", code, key, r.status, r.body)
		}
	}
	if n := calls.Load(); n != 5 {
		t.Fatalf("upstream calls %d; want 5", n)
	}
}

// TestOperatorCommandsAsDocumented: KEY is read as the Idempotency-Key
// header is (quoted or bare name one key); a bad KEY exits 2 (a usage
// error), a key with no live record 1 (ErrNotFound, not a usage error).
func TestOperatorCommandsAsDocumented(t *testing.T) {
	store := "bolt:" + filepath.Join(t.TempDir(), "idem.db")
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", store)
	mustPost(t, p.proxy, "/orders", "order-42", "b")
	if err := p.stop(); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{`"order-42"`, "order-42"} {
		var out syncBuffer
		if err := run(context.Background(), []string{"get", "-store", store, k}, &out, &syncBuffer{}, noEnv); err != nil ||
			!strings.Contains(out.String(), `"DONE"`) {
			t.Errorf("get %s = %v, %q; want the DONE record", k, err, out.String())
		}
	}
	err := run(context.Background(), []string{"get", "-store", store, "order-43"}, &syncBuffer{}, &syncBuffer{}, noEnv)
	if !errors.Is(err, idempotency.ErrNotFound) || errors.Is(err, errUsage) {
		t.Errorf("get of a missing key = %v; want ErrNotFound, not a usage error (exit 1)", err)
	}
	err = run(context.Background(), []string{"get", "-store", store, `"unterminated`}, &syncBuffer{}, &syncBuffer{}, noEnv)
	if !errors.Is(err, errUsage) {
		t.Errorf("get of a malformed KEY = %v; want a usage error (exit 2)", err)
	}
}

// TestShutdownTimeoutKeepsClaim: a request still running upstream when
// -shutdown-timeout ends is cut off as by kill -9 (README, SIGTERM): its
// key stays claimed, so after a restart its retry gets 409 and does not
// run the operation a second time while the lease lasts.
func TestShutdownTimeoutKeepsClaim(t *testing.T) {
	bin := binary(t)
	up := newUpstream(t)
	db := "bolt:" + filepath.Join(t.TempDir(), "idem.db")
	p := startProc(t, bin, "-upstream", up.URL, "-store", db, "-shutdown-timeout", "200ms", "-lease", "1m")
	go func() { _, _ = post(t, &http.Client{Timeout: 20 * time.Second}, p.proxy, "/block", "cut", "x") }()
	deadline := time.Now().Add(10 * time.Second)
	for up.ran("cut") == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	p.signal(t, syscall.SIGTERM)
	p.wait(t, 15*time.Second)
	if !strings.Contains(p.logs.String(), "did not finish in time") {
		t.Fatalf("the request was not cut off by the shutdown timeout:\n%s", p.logs.String())
	}
	up.open() // the upstream finishes, too late for the stopped proxy

	p2 := startProc(t, bin, "-upstream", up.URL, "-store", db, "-lease", "1m")
	if r := mustPost(t, p2.proxy, "/block", "cut", "x"); r.status != http.StatusConflict {
		t.Fatalf("retry after the restart = %d %q; want 409 (the claim kept until its lease ends)", r.status, r.body)
	}
	if n := up.ran("cut"); n != 1 {
		t.Fatalf("upstream ran %d times; want 1", n)
	}
}

// readmeFlagRow is a row of the README's flag table: | `-name` | `default` | ...
var readmeFlagRow = regexp.MustCompile("^\\| (`-[a-z-]+`(?:, `-[a-z-]+`)*) \\| ([^|]*) \\|")

// TestReadmeFlagDefaults: the README's flag table lists every flag the
// proxy has, with the default the flag really has.
func TestReadmeFlagDefaults(t *testing.T) {
	var help syncBuffer
	if _, err := parseConfig([]string{"-h"}, noEnv, &help); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	// The flag package prints "  -name type" and then the usage, ending in
	// (default X) when the default is not the type's zero value.
	defaults := map[string]string{}
	var name string
	nameRE := regexp.MustCompile(`^  -([a-z-]+)`)
	defRE := regexp.MustCompile(`\(default "?([^")]*)"?\)$`)
	sc := bufio.NewScanner(strings.NewReader(help.String()))
	for sc.Scan() {
		line := sc.Text()
		if m := nameRE.FindStringSubmatch(line); m != nil {
			name = m[1]
			defaults[name] = ""
			continue
		}
		if m := defRE.FindStringSubmatch(line); m != nil && name != "" {
			defaults[name] = m[1]
		}
	}
	if len(defaults) < 10 {
		t.Fatalf("found %d flags in the usage:\n%s", len(defaults), help.String())
	}

	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	tick := regexp.MustCompile("`([^`]*)`")
	for _, line := range strings.Split(string(readme), "\n") {
		m := readmeFlagRow.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		names := tick.FindAllStringSubmatch(m[1], -1)
		vals := tick.FindAllStringSubmatch(m[2], -1)
		for i, n := range names {
			flagName := strings.TrimPrefix(n[1], "-")
			documented[flagName] = true
			want := "" // (required), (none): no default
			if len(vals) == len(names) {
				want = vals[i][1]
			}
			got, ok := defaults[flagName]
			if !ok {
				t.Errorf("README documents -%s, which the proxy does not have", flagName)
				continue
			}
			if !sameDefault(got, want) {
				t.Errorf("-%s: README says the default is %q; the flag's is %q", flagName, want, got)
			}
		}
	}
	for n := range defaults {
		if !documented[n] {
			t.Errorf("-%s is missing from the README's flag table", n)
		}
	}
}

// sameDefault compares a flag's printed default with the README's, which
// writes durations short (1m for 1m0s) and zero values out (false, 0).
func sameDefault(got, want string) bool {
	switch {
	case got == want:
		return true
	case got == "" && (want == "false" || want == "0"):
		return true
	}
	g, gerr := time.ParseDuration(got)
	w, werr := time.ParseDuration(want)
	return gerr == nil && werr == nil && g == w
}
