package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemhttp"
	"github.com/archlab/idempotency/internal/demo"
)

// TestMain lets the test binary serve as the demo's server: the campaign
// re-executes os.Executable() with demo.ServeCommand, which here is this
// binary.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == demo.ServeCommand {
		os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

var closing = regexp.MustCompile(`\n(\d+) passed, (\d+) failed\n`)

func runCmd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var out, errb strings.Builder
	code := run(ctx, args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestDemo(t *testing.T) {
	start := time.Now()
	code, out, errOut := runCmd(t, "-duration", "5s", "-seed", "7")
	if code != exitOK {
		t.Fatalf("exit %d, want 0\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	m := closing.FindStringSubmatch(out)
	if m == nil || m[2] != "0" || !strings.HasSuffix(out, m[0]) {
		t.Fatalf("output does not end with 'N passed, 0 failed':\n%s", out)
	}
	for _, name := range demo.Checks {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\s+ok\s+[1-9]\d*\s+0$`).MatchString(out) {
			t.Errorf("check %q is not reported ok with observations:\n%s", name, out)
		}
	}
	for _, want := range []string{"idemcheck: seed 7\n", "store paused for", "killed with SIGKILL", "server #2"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\r") {
		t.Errorf("progress redrawn with \\r on a non-terminal:\n%q", out)
	}
	t.Logf("demo took %v:\n%s", time.Since(start).Round(time.Millisecond), out)
}

// TestDemoCatchesBrokenServer runs the campaign against the server without
// its idempotency middleware: the demo must fail, naming the double charge,
// and print a repro command.
func TestDemoCatchesBrokenServer(t *testing.T) {
	code, out, _ := runCmd(t, "-duration", "3s", "-seed", "11", "-unsafe-demo")
	if code != exitFail {
		t.Fatalf("exit %d against a server without idempotency, want 1:\n%s", code, out)
	}
	if !regexp.MustCompile(`(?m)^each key charged at most once\s+FAILED`).MatchString(out) {
		t.Errorf("report does not fail 'charged at most once':\n%s", out)
	}
	if !strings.Contains(out, "charged at most once violated") {
		t.Errorf("report gives no example of a double charge:\n%s", out)
	}
	want := "go run ./cmd/idemcheck -seed 11 -duration 3s -unsafe-demo"
	if !strings.Contains(out, "FAILED with seed 11") || !strings.Contains(out, want) {
		t.Errorf("no seed and repro command %q:\n%s", want, out)
	}
	if m := closing.FindStringSubmatch(out); m == nil || m[2] == "0" {
		t.Errorf("closing line missing or says nothing failed:\n%s", out)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown flag", []string{"-bogus"}, "flag provided but not defined"},
		{"extra argument", []string{"now"}, "unexpected arguments"},
		{"negative duration", []string{"-duration", "-1s"}, "-duration"},
		{"duration too long", []string{"-duration", "2m"}, "-duration"},
		{"zero concurrency", []string{"-concurrency", "0"}, "-concurrency"},
		{"header without target", []string{"-header", "A: b"}, "-header needs -target"},
		{"requests without target", []string{"-requests", "5"}, "-requests needs -target"},
		{"target not http", []string{"-target", "ftp://example.com/x"}, "-target"},
		{"store and target", []string{"-target", "http://127.0.0.1:1/", "-store", "memory"}, "two modes"},
		{"conflict status", []string{"-target", "http://127.0.0.1:1/", "-conflict-status", "418"}, "-conflict-status"},
		{"body without placeholder", []string{"-target", "http://127.0.0.1:1/", "-body", "{}"}, "-body"},
		{"bad header", []string{"-target", "http://127.0.0.1:1/", "-header", "no colon"}, "Name: value"},
		{"set given twice", []string{"-target", "http://127.0.0.1:1/", "-as", "a", "-as", "a"}, "twice"},
		{"duration with target", []string{"-target", "http://127.0.0.1:1/", "-duration", "5s"}, "-duration is for the demo"},
		{"one duplicate", []string{"-target", "http://127.0.0.1:1/", "-concurrency", "1"}, "-concurrency 1"},
		{"executions without target", []string{"-executions", "http://127.0.0.1:1/n"}, "-executions needs -target"},
		{"executions not http", []string{"-target", "http://127.0.0.1:1/", "-executions", "file:///n"}, "-executions"},
		{"visualize without store", []string{"-visualize", "."}, "-visualize needs -store"},
		{"visualize with target", []string{"-target", "http://127.0.0.1:1/", "-visualize", "."}, "-visualize needs -store"},
		{"visualize missing directory", []string{"-store", "memory", "-visualize", "/nonexistent/idemcheck"}, "-visualize"},
		{"visualize a file", []string{"-store", "memory", "-visualize", "main.go"}, "not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCmd(t, tc.args...)
			if code != exitUsage {
				t.Fatalf("exit %d, want 2\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
			}
			if !strings.Contains(errOut, tc.want) {
				t.Errorf("stderr lacks %q:\n%s", tc.want, errOut)
			}
			if out != "" {
				t.Errorf("a usage error ran something:\n%s", out)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	code, _, errOut := runCmd(t, "-h")
	if code != exitOK {
		t.Fatalf("-h: exit %d", code)
	}
	if !strings.Contains(errOut, "-as NAME") || strings.Contains(errOut, "unsafe-demo") {
		t.Errorf("help shows hidden flags or lacks -as:\n%s", errOut)
	}
}

func TestCredentialSets(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want []http.Header
	}{
		{"common only", []string{"-header", "content-type: application/json", "-header", "X-A:1"},
			[]http.Header{{"Content-Type": {"application/json"}, "X-A": {"1"}}}},
		{"no headers", nil, []http.Header{{}}},
		{"two sets", []string{"-header", "Content-Type: application/json",
			"-as", "alice", "-header", "Authorization: Bearer A",
			"-as", "bob", "-header", "Authorization: Bearer B", "-header", "X-Tenant: b"},
			[]http.Header{
				{"Content-Type": {"application/json"}, "Authorization": {"Bearer A"}},
				{"Content-Type": {"application/json"}, "Authorization": {"Bearer B"}, "X-Tenant": {"b"}},
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parse(append([]string{"-target", "http://127.0.0.1:1/orders"}, tc.args...), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, cfg.headers); diff != "" {
				t.Errorf("credential sets (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRepro(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "go run ./cmd/idemcheck -seed 42 -duration 20s"},
		{[]string{"-seed", "9", "-duration", "5s"}, "go run ./cmd/idemcheck -seed 42 -duration 5s"},
		{[]string{"-seed=9", "-store", "redis://127.0.0.1:6379/0?prefix=x:"},
			"go run ./cmd/idemcheck -seed 42 -store 'redis://127.0.0.1:6379/0?prefix=x:' -duration 20s"},
		// Secrets go to logs hidden: a URL's password, credential headers.
		{[]string{"-target", "http://h/o", "-header", "Authorization: Bearer x"},
			"go run ./cmd/idemcheck -seed 42 -target http://h/o -header 'Authorization: xxxxx'"},
		{[]string{"-target", "http://h/o", "-header=X-Api-Key: k1", "-header", "X-Tenant: t1", "-header", "Idempotency-Key: a"},
			"go run ./cmd/idemcheck -seed 42 -target http://h/o '-header=X-Api-Key: xxxxx' -header 'X-Tenant: t1' -header 'Idempotency-Key: a'"},
		{[]string{"-store", "redis://u:s3cret@127.0.0.1:6379/0"},
			"go run ./cmd/idemcheck -seed 42 -store redis://u:xxxxx@127.0.0.1:6379/0 -duration 20s"},
		{[]string{"-store=redis+cluster://:s3cret@[::1]:7000,[::1]:7001?prefix=a:"},
			"go run ./cmd/idemcheck -seed 42 '-store=redis+cluster://:xxxxx@[::1]:7000,[::1]:7001?prefix=a:' -duration 20s"},
		{[]string{"-target", "http://u:pw@h/o"},
			"go run ./cmd/idemcheck -seed 42 -target http://u:xxxxx@h/o"},
	} {
		cfg, err := parse(tc.args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		cfg.seed = 42
		if got := repro(cfg, tc.args); got != tc.want {
			t.Errorf("repro(%q) = %q, want %q", tc.args, got, tc.want)
		}
	}
}

func TestProgressPlainLines(t *testing.T) {
	var b strings.Builder
	p := newProgress(&b)
	if p.tty {
		t.Fatal("a strings.Builder taken for a terminal")
	}
	for i := range 5 {
		p.demo(demo.Progress{Phase: "orders", Elapsed: time.Duration(i) * time.Millisecond, Total: time.Second, Orders: int64(i)})
	}
	p.demo(demo.Progress{Phase: "store paused", Total: time.Second})
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "orders") || !strings.Contains(lines[1], "store paused") {
		t.Errorf("want one line per phase change within %v, got:\n%s", plainEvery, b.String())
	}
}

// TestStoreMode certifies a bolt store, then runs the demo on it.
func TestStoreMode(t *testing.T) {
	store := "bolt:" + filepath.Join(t.TempDir(), "certified.db")
	code, out, errOut := runCmd(t, "-store", store, "-duration", "3s", "-seed", "3")
	if code != exitOK {
		t.Fatalf("exit %d, want 0\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, want := range []string{"certifying store " + store, "contract: ", "running the demo campaign on it",
		demo.CheckCharged + "  "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if m := closing.FindStringSubmatch(out); m == nil || m[2] != "0" {
		t.Errorf("closing line missing or failures reported:\n%s", out)
	}
}

// TestTargetMode wires -target to the black-box checks: our middleware
// passes, a server that does not deduplicate fails.
func TestTargetMode(t *testing.T) {
	guard, err := idempotency.NewGuard(idempotency.NewMemoryStore(), nil)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.New(guard, nil)
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	orders := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, n.Add(1))
	})
	good := httptest.NewServer(mw.Handler(orders))
	defer good.Close()
	bad := httptest.NewServer(orders)
	defer bad.Close()
	creds := []string{"-header", "Content-Type: application/json",
		"-as", "alice", "-header", "Authorization: Bearer A", "-as", "bob", "-header", "Authorization: Bearer B"}

	code, out, errOut := runCmd(t, append([]string{"-target", good.URL + "/orders", "-requests", "5", "-seed", "1"}, creds...)...)
	if code != exitOK {
		t.Errorf("idemhttp target: exit %d, want 0\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	code, out, errOut = runCmd(t, append([]string{"-target", bad.URL + "/orders", "-requests", "5", "-seed", "1"}, creds...)...)
	if code != exitFail {
		t.Errorf("target without deduplication: exit %d, want 1\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "FAILED with seed 1") || !strings.Contains(out, "-target "+bad.URL+"/orders") {
		t.Errorf("no repro for the failing target:\n%s", out)
	}
	if m := closing.FindStringSubmatch(out); m == nil || m[2] == "0" {
		t.Errorf("closing line missing or says nothing failed:\n%s", out)
	}
}
