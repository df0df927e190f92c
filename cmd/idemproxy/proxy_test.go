package main

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestProxy(t *testing.T) {
	for _, tc := range []struct{ name, store string }{
		{"memory", "memory"},
		{"bolt", "bolt:" + filepath.Join(t.TempDir(), "idem.db")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t)
			p := startInproc(t, "-upstream", up.URL, "-store", tc.store, "-wait", "10s")

			t.Run("new key runs once, duplicate replays", func(t *testing.T) {
				first := mustPost(t, p.proxy, "/orders", "k1", `{"n":1}`)
				if first.status != http.StatusCreated || first.header.Get("Idempotent-Replayed") != "" {
					t.Fatalf("first = %d %v %q; want 201 not replayed", first.status, first.header, first.body)
				}
				again := mustPost(t, p.proxy, "/orders", "k1", `{"n":1}`)
				if again.status != http.StatusCreated || again.header.Get("Idempotent-Replayed") != "true" || again.body != first.body {
					t.Fatalf("retry = %d %v %q; want the first response replayed (%q)", again.status, again.header, again.body, first.body)
				}
				if n := up.ran("k1"); n != 1 {
					t.Fatalf("upstream ran %d times; want 1", n)
				}
			})

			t.Run("unguarded requests pass through", func(t *testing.T) {
				before := up.total.Load()
				for range 2 {
					if r := mustPost(t, p.proxy, "/orders", "", "x"); r.status != http.StatusCreated {
						t.Fatalf("keyless POST = %d", r.status)
					}
				}
				if got := up.total.Load() - before; got != 2 {
					t.Fatalf("keyless POSTs reached the upstream %d times; want 2", got)
				}
			})

			t.Run("concurrent duplicates run once", func(t *testing.T) {
				var wg sync.WaitGroup
				replies := make([]reply, 8)
				errs := make([]error, 8)
				for i := range replies {
					wg.Add(1)
					go func() {
						defer wg.Done()
						replies[i], errs[i] = post(t, &http.Client{Timeout: 30 * time.Second}, p.proxy, "/orders?sleep=200ms", "k2", "same")
					}()
				}
				wg.Wait()
				for i, r := range replies {
					if errs[i] != nil || r.status != http.StatusCreated || r.body != replies[0].body {
						t.Fatalf("reply %d = %d %q %v; want 201 %q", i, r.status, r.body, errs[i], replies[0].body)
					}
				}
				if n := up.ran("k2"); n != 1 {
					t.Fatalf("upstream ran %d times; want 1", n)
				}
			})

			t.Run("key reused for another request is 422", func(t *testing.T) {
				mustPost(t, p.proxy, "/orders", "k3", "a")
				r := mustPost(t, p.proxy, "/orders", "k3", "b")
				if r.status != http.StatusUnprocessableEntity || !strings.Contains(r.header.Get("Content-Type"), "problem+json") {
					t.Fatalf("conflict = %d %q %q; want 422 problem+json", r.status, r.header.Get("Content-Type"), r.body)
				}
				if n := up.ran("k3"); n != 1 {
					t.Fatalf("upstream ran %d times; want 1", n)
				}
			})

			t.Run("client gives up, retry replays", func(t *testing.T) {
				impatient := &http.Client{Timeout: 100 * time.Millisecond}
				if _, err := post(t, impatient, p.proxy, "/orders?sleep=500ms", "k4", "slow"); err == nil {
					t.Fatal("the impatient client got an answer; want its timeout")
				}
				r := mustPost(t, p.proxy, "/orders?sleep=500ms", "k4", "slow") // waits (-wait) then replays
				if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
					t.Fatalf("retry = %d %v %q; want the stored response replayed", r.status, r.header, r.body)
				}
				if n := up.ran("k4"); n != 1 {
					t.Fatalf("upstream ran %d times; want 1 (the client's timeout must not cancel or repeat it)", n)
				}
			})
		})
	}
}

func TestUpstreamDownThenBack(t *testing.T) {
	addr := freeAddr(t)
	p := startInproc(t, "-upstream", "http://"+addr, "-store", "memory")
	r := mustPost(t, p.proxy, "/pay", "k", "x")
	if r.status != http.StatusBadGateway || !strings.Contains(r.header.Get("Content-Type"), "application/problem+json") ||
		!strings.Contains(r.body, "upstream-unreachable") {
		t.Fatalf("with the upstream down = %d %q %q; want 502 problem+json upstream-unreachable", r.status, r.header.Get("Content-Type"), r.body)
	}
	// The key was released: once the upstream is back, the retry runs at once.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("the port was taken meanwhile: %v", err)
	}
	up := &upstream{runs: map[string]int{}, gate: make(chan struct{})}
	up.Server = httptest.NewUnstartedServer(up.handler())
	up.Listener.Close()
	up.Listener = ln
	up.Start()
	defer up.Close()
	r = mustPost(t, p.proxy, "/pay", "k", "x")
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry with the upstream back = %d %q; want 201 executed", r.status, r.body)
	}
	if r = mustPost(t, p.proxy, "/pay", "k", "x"); r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("second retry = %d %v; want a replay", r.status, r.header)
	}
	if n := up.ran("k"); n != 1 {
		t.Fatalf("upstream ran %d times; want 1", n)
	}
}

func TestUpstreamTimeoutKeepsClaim(t *testing.T) {
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory", "-upstream-timeout", "150ms", "-lease", "1s")
	start := time.Now()
	r := mustPost(t, p.proxy, "/pay?sleep=400ms", "k", "x")
	if r.status != http.StatusGatewayTimeout || !strings.Contains(r.body, "upstream-failed") {
		t.Fatalf("upstream timeout = %d %q; want 504 upstream-failed", r.status, r.body)
	}
	// The request reached the upstream and may have had effects: a retry
	// inside the lease must not run it again.
	r = mustPost(t, p.proxy, "/pay?sleep=400ms", "k", "x")
	if time.Since(start) < time.Second && r.status != http.StatusConflict {
		t.Fatalf("retry inside the lease = %d %q; want 409 (claim kept)", r.status, r.body)
	}
	if n := up.ran("k"); n != 1 {
		t.Fatalf("upstream ran %d times inside the lease; want 1", n)
	}
	// After the lease the retry runs again (and times out again).
	deadline := time.Now().Add(10 * time.Second)
	for up.ran("k") < 2 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		mustPost(t, p.proxy, "/pay?sleep=400ms", "k", "x")
	}
	if n := up.ran("k"); n != 2 {
		t.Fatalf("after the lease the upstream ran %d times; want 2", n)
	}
	metrics := get(t, "http://"+p.admin+"/metrics").body
	if !strings.Contains(metrics, `idemproxy_requests_total{outcome="abandoned"}`) {
		t.Fatalf("metrics lack the abandoned outcome:\n%s", grepLines(metrics, "idemproxy_requests_total"))
	}
	if logs := p.logs.String(); strings.Contains(logs, `"k"`) || !strings.Contains(logs, "key_hash=") {
		t.Fatalf("logs must carry key hashes, never raw keys:\n%s", logs)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestAdmin(t *testing.T) {
	up := newUpstream(t)
	path := filepath.Join(t.TempDir(), "idem.db")
	p := startInproc(t, "-upstream", up.URL, "-store", "bolt:"+path)
	base := "http://" + p.admin

	for _, ep := range []string{"/healthz", "/readyz"} {
		if r := get(t, base+ep); r.status != http.StatusOK {
			t.Fatalf("%s = %d %q", ep, r.status, r.body)
		}
	}
	mustPost(t, p.proxy, "/orders", "done-key", "x")
	m := get(t, base+"/metrics")
	for _, want := range []string{`idemproxy_requests_total{outcome="executed"} 1`, `idemproxy_store_duration_seconds_count{op="begin"}`,
		"idemproxy_requests_in_flight", "idemproxy_requests_unguarded_total",
		// Known series are exported from the start, as 0.
		`idemproxy_requests_total{outcome="conflict"} 0`, `idemproxy_store_errors_total{op="release"} 0`,
		`idemproxy_lease_renewals_total{result="lost"} 0`} {
		if !strings.Contains(m.body, want) {
			t.Fatalf("/metrics lacks %s:\n%s", want, grepLines(m.body, "idemproxy_"))
		}
	}

	var rec recordJSON
	r := get(t, base+"/keys/done-key")
	if err := json.Unmarshal([]byte(r.body), &rec); r.status != http.StatusOK || err != nil || rec.State != "DONE" || rec.Status != 201 {
		t.Fatalf("GET /keys/done-key = %d %q (%v); want DONE 201", r.status, r.body, err)
	}
	if strings.Contains(r.body, "body=") {
		t.Fatalf("the admin API shows a stored body: %s", r.body)
	}
	if r := get(t, base+"/keys/no-such-key"); r.status != http.StatusNotFound {
		t.Fatalf("GET of an unknown key = %d", r.status)
	}
	// The key is read as the header is: quoted names the same key.
	if r := get(t, base+"/keys/%22done-key%22"); r.status != http.StatusOK || !strings.Contains(r.body, `"DONE"`) {
		t.Fatalf(`GET /keys/"done-key" = %d %q; want the record of done-key`, r.status, r.body)
	}
	if r := get(t, base+"/keys/%22broken"); r.status != http.StatusBadRequest {
		t.Fatalf(`GET of a malformed key "broken = %d %q; want 400`, r.status, r.body)
	}
	if r := do(t, http.MethodDelete, base+"/keys/done-key"); r.status != http.StatusOK {
		t.Fatalf("DELETE = %d %q", r.status, r.body)
	}
	if r := get(t, base+"/keys/done-key"); r.status != http.StatusNotFound {
		t.Fatalf("GET after DELETE = %d %q", r.status, r.body)
	}

	// Release: a request holds the key while the upstream blocks.
	done := make(chan reply, 1)
	go func() {
		r, _ := post(t, &http.Client{Timeout: 30 * time.Second}, p.proxy, "/block", "held", "x")
		done <- r
	}()
	deadline := time.Now().Add(10 * time.Second)
	for up.ran("held") == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if r := get(t, base+"/keys/held"); !strings.Contains(r.body, `"PROCESSING"`) {
		t.Fatalf("GET of the held key = %d %q; want PROCESSING", r.status, r.body)
	}
	if r := mustPost(t, p.proxy, "/block", "held", "x"); r.status != http.StatusConflict {
		t.Fatalf("duplicate while held = %d; want 409", r.status)
	}
	// The request is still running here: release needs force (see
	// TestReleaseRunningKeyRefused).
	if r := do(t, http.MethodPost, base+"/keys/held/release?force=true"); r.status != http.StatusOK {
		t.Fatalf("release = %d %q", r.status, r.body)
	}
	up.open()
	if r := mustPost(t, p.proxy, "/orders", "held", "x"); r.status != http.StatusCreated || up.ran("held") != 2 {
		t.Fatalf("after release a new request = %d, upstream runs %d; want 201 and 2", r.status, up.ran("held"))
	}
	<-done
	if r := do(t, http.MethodPost, base+"/keys/held/release"); r.status != http.StatusConflict {
		t.Fatalf("release of a done key = %d %q; want 409", r.status, r.body)
	}

	// The operator commands work on the same file once the proxy is gone.
	if err := p.stop(); err != nil {
		t.Fatal(err)
	}
	var out syncBuffer
	ctx := context.Background()
	env := noEnv
	if err := run(ctx, []string{"get", "-store", "bolt:" + path, "held"}, &out, &out, env); err != nil || !strings.Contains(out.String(), `"DONE"`) {
		t.Fatalf("idemproxy get = %v %q", err, out.String())
	}
	out.Reset()
	if err := run(ctx, []string{"get", "-store", "bolt:" + path, `"held"`}, &out, &out, env); err != nil || !strings.Contains(out.String(), `"DONE"`) {
		t.Fatalf(`idemproxy get '"held"' = %v %q; want the record of held`, err, out.String())
	}
	if err := run(ctx, []string{"get", "-store", "bolt:" + path, `"held`}, &out, &out, env); !errors.Is(err, errUsage) {
		t.Fatalf("get of a malformed key = %v; want errUsage", err)
	}
	if err := run(ctx, []string{"release", "-store", "bolt:" + path, "held"}, &out, &out, env); !errors.Is(err, errNotInFlight) {
		t.Fatalf("idemproxy release of a done key = %v; want errNotInFlight", err)
	}
	if err := run(ctx, []string{"delete", "-store", "bolt:" + path, "held"}, &out, &out, env); err != nil {
		t.Fatalf("idemproxy delete = %v", err)
	}
	if err := run(ctx, []string{"get", "-store", "bolt:" + path, "held"}, &out, &out, env); err == nil {
		t.Fatal("idemproxy get after delete succeeded")
	}
	if err := run(ctx, []string{"get", "-store", "bolt:" + path}, &out, &out, env); !errors.Is(err, errUsage) {
		t.Fatalf("get without a key = %v; want errUsage", err)
	}
}

func TestReadyzBrokenStore(t *testing.T) {
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", "redis://127.0.0.1:1/0?dial_timeout=100ms&max_retries=-1")
	if r := get(t, "http://"+p.admin+"/readyz"); r.status != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with an unreachable store = %d %q; want 503", r.status, r.body)
	}
	if r := get(t, "http://"+p.admin+"/healthz"); r.status != http.StatusOK {
		t.Fatalf("/healthz = %d; want 200 (the process is up)", r.status)
	}
	r := mustPost(t, p.proxy, "/orders", "k", "x")
	if r.status != http.StatusServiceUnavailable || up.total.Load() != 0 {
		t.Fatalf("POST with the store down = %d, upstream calls %d; want 503 and none (fail closed)", r.status, up.total.Load())
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"-upstream", "ftp://x"},
		{"-upstream", "http://x", "-lease", "0s"},
		{"-upstream", "http://x", "-log-format", "xml"},
		{"-upstream", "http://x", "stray"},
	} {
		err := run(context.Background(), args, &syncBuffer{}, &syncBuffer{}, noEnv)
		if !errors.Is(err, errUsage) {
			t.Errorf("run(%q) = %v; want a usage error", args, err)
		}
	}
	// The environment sets flags too.
	err := run(context.Background(), nil, &syncBuffer{}, &syncBuffer{}, envOf(map[string]string{"IDEMPROXY_UPSTREAM": "gopher://x"}))
	if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "gopher") {
		t.Errorf("IDEMPROXY_UPSTREAM was not read: %v", err)
	}
	if err := run(context.Background(), []string{"-upstream", "http://x", "-store", "nosuch://"}, &syncBuffer{}, &syncBuffer{},
		noEnv); err == nil {
		t.Error("an unknown store scheme started")
	}
}
