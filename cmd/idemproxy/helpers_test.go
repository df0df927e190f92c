package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// syncBuffer is a log sink that tests read while the proxy writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b.Reset()
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var (
	proxyAddrRE = regexp.MustCompile(`proxy=(\S+)|"proxy":"([^"]+)"`)
	adminAddrRE = regexp.MustCompile(`admin=(\S+)|"admin":"([^"]+)"`)
)

// waitListening waits for the "listening" log line and returns the
// proxy's and the admin's addresses.
func waitListening(t *testing.T, logs func() string, exited <-chan struct{}) (proxy, admin string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		s := logs()
		for _, line := range strings.Split(s, "\n") {
			if strings.Contains(line, "msg=listening") || strings.Contains(line, `"msg":"listening"`) {
				if m := proxyAddrRE.FindStringSubmatch(line); m != nil {
					proxy = m[1] + m[2]
				}
				if m := adminAddrRE.FindStringSubmatch(line); m != nil {
					admin = m[1] + m[2]
				}
				return proxy, admin
			}
		}
		select {
		case <-exited:
			t.Fatalf("proxy exited before listening:\n%s", s)
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("proxy did not start listening:\n%s", logs())
	return "", ""
}

// noEnv is an empty environment for run.
func noEnv(string) (string, bool) { return "", false }

// envOf is the environment vars for run: a name is set only if vars has it.
func envOf(vars map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
}

// inproc is a proxy running run() in this process.
type inproc struct {
	proxy, admin string
	logs         *syncBuffer
	stop         func() error
}

// startInproc runs the proxy with args (plus -listen and -admin on free
// ports) until the test ends or stop is called.
func startInproc(t *testing.T, args ...string) *inproc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs := &syncBuffer{}
	done := make(chan struct{})
	var runErr error
	args = append([]string{"-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0", "-shutdown-timeout", "10s"}, args...)
	go func() {
		defer close(done)
		runErr = run(ctx, args, io.Discard, logs, noEnv)
	}()
	p := &inproc{logs: logs}
	var once sync.Once
	p.stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				runErr = errors.New("run did not return within 30s of cancellation")
			}
		})
		return runErr
	}
	t.Cleanup(func() {
		if err := p.stop(); err != nil {
			t.Errorf("run: %v\n%s", err, logs.String())
		}
	})
	p.proxy, p.admin = waitListening(t, logs.String, done)
	return p
}

// upstream is an httptest service that counts how often each
// Idempotency-Key reached it.
type upstream struct {
	*httptest.Server
	total atomic.Int64
	mu    sync.Mutex
	runs  map[string]int
	// gate, when set, blocks /block until it is closed.
	gate chan struct{}
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{runs: map[string]int{}, gate: make(chan struct{})}
	u.Server = httptest.NewUnstartedServer(u.handler())
	u.Start()
	t.Cleanup(func() {
		u.open()
		u.Close()
	})
	return u
}

func (u *upstream) open() {
	u.mu.Lock()
	defer u.mu.Unlock()
	select {
	case <-u.gate:
	default:
		close(u.gate)
	}
}

func (u *upstream) handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		key := r.Header.Get("Idempotency-Key")
		n := u.total.Add(1)
		u.mu.Lock()
		u.runs[key]++
		k := u.runs[key]
		u.mu.Unlock()
		if d, err := time.ParseDuration(r.URL.Query().Get("sleep")); err == nil {
			time.Sleep(d)
		}
		if r.URL.Path == "/block" {
			select {
			case <-u.gate:
			case <-time.After(20 * time.Second):
			}
		}
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("X-Run", fmt.Sprint(k))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "run %d of key %q (call %d) body=%s", k, key, n, body)
	})
}

func (u *upstream) ran(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.runs[`"`+key+`"`] + u.runs[key]
}

type reply struct {
	status int
	header http.Header
	body   string
}

func post(t *testing.T, c *http.Client, addr, path, key, body string) (reply, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", `"`+key+`"`)
	}
	resp, err := c.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: string(b)}, err
}

func mustPost(t *testing.T, addr, path, key, body string) reply {
	t.Helper()
	r, err := post(t, &http.Client{Timeout: 30 * time.Second}, addr, path, key, body)
	if err != nil {
		t.Fatalf("POST %s key %s: %v", path, key, err)
	}
	return r
}

func get(t *testing.T, url string) reply {
	t.Helper()
	return do(t, http.MethodGet, url)
}

func do(t *testing.T, method, url string) reply {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Timeout: 30 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// freeAddr returns a loopback address nobody listens on (just now).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// binary builds cmd/idemproxy once per test run.
func binary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binary; skipped in -short mode")
	}
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "idemproxy-bin-")
		if buildErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", filepath.Join(buildDir, "idemproxy"), ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(buildDir, "idemproxy")
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	if code == 0 {
		// Every in-process proxy was stopped: its sweeper, delete watcher,
		// servers and store must be gone with it.
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// proc is the proxy running as a real process.
type proc struct {
	cmd          *exec.Cmd
	proxy, admin string
	logs         *syncBuffer
	exited       chan struct{}
}

func startProc(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	args = append([]string{"-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0"}, args...)
	cmd := exec.Command(bin, args...)
	logs := &syncBuffer{}
	cmd.Stderr = logs
	cmd.Stdout = logs
	cmd.Env = append(os.Environ(), "IDEMPROXY_LOG_FORMAT=text")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, logs: logs, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = cmd.Process.Kill()
			<-p.exited
		}
	})
	p.proxy, p.admin = waitListening(t, logs.String, p.exited)
	return p
}

func (p *proc) signal(t *testing.T, sig os.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

func (p *proc) wait(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(d):
		t.Fatalf("process did not exit within %v:\n%s", d, p.logs.String())
	}
}
