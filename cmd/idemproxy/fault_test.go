package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/archlab/idempotency/internal/testenv"
)

// redisServer is a redis-server of this test's own, on a free loopback
// port with its files in a t.TempDir, so that pausing it touches nobody
// else.
type redisServer struct {
	cmd  *exec.Cmd
	addr string
	done chan struct{}
}

func startRedisServer(t *testing.T) *redisServer {
	t.Helper()
	bin := testenv.Binary(t, "redis-server")
	addr := freeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	dir := t.TempDir()
	cmd := exec.Command(bin, "--bind", "127.0.0.1", "--port", port, "--dir", dir,
		"--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction", "--logfile", dir+"/redis.log")
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	s := &redisServer{cmd: cmd, addr: addr, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(s.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT) // a paused server cannot die
		_ = cmd.Process.Kill()
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			t.Errorf("redis-server %d did not exit", cmd.Process.Pid)
		}
	})
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 200 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return s
		}
		select {
		case <-s.done:
			log, _ := os.ReadFile(dir + "/redis.log")
			t.Fatalf("redis-server exited at start: %s", log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not answer: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *redisServer) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to redis-server: %v", sig, err)
	}
}

// TestPausedRedisFailsClosed stops the proxy's Redis with SIGSTOP: a paused
// server accepts connections and never answers, the worst case for a
// client. Guarded requests must get 503 problem+json within a bounded time
// without reaching the upstream; after SIGCONT they must succeed again.
func TestPausedRedisFailsClosed(t *testing.T) {
	bin := binary(t)
	rs := startRedisServer(t)
	up := newUpstream(t)
	store := "redis://" + rs.addr + "/0?dial_timeout=300ms&read_timeout=300ms&write_timeout=300ms&pool_timeout=300ms&max_retries=-1"
	p := startProc(t, bin, "-upstream", up.URL, "-store", store, "-lease", "2s")
	c := &http.Client{Timeout: 10 * time.Second}

	if r := mustPost(t, p.proxy, "/orders", "before", "x"); r.status != http.StatusCreated {
		t.Fatalf("with the store up = %d %q; want 201", r.status, r.body)
	}

	rs.signal(t, syscall.SIGSTOP)
	calls := up.total.Load()
	const bound = 5 * time.Second
	for i := range 4 {
		key := fmt.Sprintf("paused-%d", i)
		start := time.Now()
		r, err := post(t, c, p.proxy, "/orders", key, "x")
		took := time.Since(start)
		if err != nil {
			t.Fatalf("POST %s with the store paused: %v after %v", key, err, took)
		}
		if r.status != http.StatusServiceUnavailable || r.header.Get("Content-Type") != "application/problem+json" ||
			!strings.Contains(r.body, "store-unavailable") || r.header.Get("Retry-After") == "" {
			t.Fatalf("POST %s with the store paused = %d %v %q; want 503 problem+json store-unavailable with Retry-After",
				key, r.status, r.header, r.body)
		}
		if took > bound {
			t.Fatalf("503 took %v with the store paused; want under %v", took, bound)
		}
		t.Logf("%s: 503 after %v", key, took.Round(time.Millisecond))
	}
	if r := get(t, "http://"+p.admin+"/readyz"); r.status != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with the store paused = %d; want 503", r.status)
	}
	if n := up.total.Load() - calls; n != 0 {
		t.Fatalf("the upstream was called %d times with the store paused; want 0 (fail closed)", n)
	}

	rs.signal(t, syscall.SIGCONT)
	// Fresh keys succeed again once the pool has replaced its timed-out
	// connections.
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := post(t, c, p.proxy, "/orders", "after", "x")
		if err == nil && r.status == http.StatusCreated {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after SIGCONT: %d %q %v; want 201 within 10s", r.status, r.body, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r := mustPost(t, p.proxy, "/orders", "before", "x"); r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the key stored before the pause = %d %v; want a replay", r.status, r.header)
	}
	// A claim written while the server was paused may have been applied
	// when it resumed (the command was in its socket). Then its key is in
	// flight until the lease ends, never run twice: retrying ends in one
	// execution.
	deadline = time.Now().Add(15 * time.Second)
	for {
		r, err := post(t, c, p.proxy, "/orders", "paused-0", "x")
		if err == nil && r.status == http.StatusCreated {
			break
		}
		if err == nil && r.status != http.StatusConflict && r.status != http.StatusServiceUnavailable {
			t.Fatalf("retry of a key refused while paused = %d %q", r.status, r.body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("retry of a key refused while paused: %d %q %v; want 201 within 15s", r.status, r.body, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := up.ran("paused-0"); n != 1 {
		t.Fatalf("paused-0 ran %d times upstream; want 1", n)
	}
}

// resetUpstream answers its first request with a header promising 100
// bytes, 7 of them, and a TCP reset; later requests get a whole 201.
type resetUpstream struct {
	*httptest.Server
	calls atomic.Int64
}

func newResetUpstream(t *testing.T) *resetUpstream {
	u := &resetUpstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		n := u.calls.Add(1)
		if n > 1 {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, "whole response, call %d", n)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		defer conn.Close()
		_, _ = brw.WriteString("HTTP/1.1 201 Created\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\npartial")
		_ = brw.Flush()
		time.Sleep(50 * time.Millisecond) // let the proxy read the header and the first bytes
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // close with RST
		}
	}))
	t.Cleanup(u.Close)
	return u
}

// TestUpstreamResetMidBody: the upstream did the work and broke off in the
// middle of its response. The client must see an error (not a short body
// passed off as whole), nothing is stored, and the claim is kept until its
// lease ends, after which a retry runs again.
func TestUpstreamResetMidBody(t *testing.T) {
	up := newResetUpstream(t)
	const lease = 1500 * time.Millisecond
	p := startInproc(t, "-upstream", up.URL, "-store", "memory", "-lease", lease.String())
	c := &http.Client{Timeout: 10 * time.Second}

	start := time.Now()
	req, _ := http.NewRequest(http.MethodPost, "http://"+p.proxy+"/pay", strings.NewReader("x"))
	req.Header.Set("Idempotency-Key", `"cut"`)
	resp, err := c.Do(req)
	if err == nil {
		body, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		if rerr == nil {
			t.Fatalf("the client got a whole response from a broken upstream: %d %q", resp.StatusCode, body)
		}
		t.Logf("client: %d, then %v after %q", resp.StatusCode, rerr, body)
	} else {
		t.Logf("client: %v", err)
	}
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("upstream calls = %d; want 1", n)
	}

	r := get(t, "http://"+p.admin+"/keys/cut")
	if r.status != http.StatusOK || !strings.Contains(r.body, `"PROCESSING"`) {
		t.Fatalf("the key after the reset = %d %q; want its claim kept (PROCESSING), nothing stored", r.status, r.body)
	}

	// Inside the lease a retry is refused, not run.
	if r := mustPost(t, p.proxy, "/pay", "cut", "x"); time.Since(start) < lease && r.status != http.StatusConflict {
		t.Fatalf("retry inside the lease = %d %q; want 409", r.status, r.body)
	}
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("upstream calls inside the lease = %d; want 1", n)
	}
	// After the lease it runs again, and that response is stored.
	deadline := time.Now().Add(10 * time.Second)
	var last reply
	for time.Now().Before(deadline) {
		last = mustPost(t, p.proxy, "/pay", "cut", "x")
		if last.status == http.StatusCreated {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if last.status != http.StatusCreated || last.header.Get("Idempotent-Replayed") != "" || up.calls.Load() != 2 {
		t.Fatalf("retry after the lease = %d %q, upstream calls %d; want 201 executed, 2 calls", last.status, last.body, up.calls.Load())
	}
	if time.Since(start) < lease {
		t.Fatalf("the retry ran %v after the reset, inside the %v lease", time.Since(start), lease)
	}
	if r := mustPost(t, p.proxy, "/pay", "cut", "x"); r.header.Get("Idempotent-Replayed") != "true" || r.body != last.body {
		t.Fatalf("next retry = %d %v %q; want %q replayed", r.status, r.header, r.body, last.body)
	}
	m := get(t, "http://"+p.admin+"/metrics").body
	if !strings.Contains(m, `idemproxy_requests_total{outcome="abandoned"} 1`) {
		t.Fatalf("metrics: want one abandoned request:\n%s", grepLines(m, "idemproxy_requests_total"))
	}
}

// TestClientGoneMidBodyReplays: the client hangs up while the proxy is
// still copying a long upstream response to it. The upstream call is not
// cut short, the response is stored whole, and the client's retry replays
// it without a second upstream call.
func TestClientGoneMidBodyReplays(t *testing.T) {
	const chunks, size = 64, 8 << 10
	var calls atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		calls.Add(1)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusCreated)
		chunk := make([]byte, size)
		for i := range chunks {
			for j := range chunk {
				chunk[j] = byte('a' + i%26)
			}
			_, _ = w.Write(chunk)
			http.NewResponseController(w).Flush()
			time.Sleep(2 * time.Millisecond)
		}
	}))
	t.Cleanup(up.Close)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory", "-wait", "10s")

	req, _ := http.NewRequest(http.MethodPost, "http://"+p.proxy+"/export", strings.NewReader("x"))
	req.Header.Set("Idempotency-Key", `"big"`)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 100)
	if _, err := io.ReadFull(resp.Body, buf); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("first response: %d %v", resp.StatusCode, err)
	}
	resp.Body.Close() // hang up with most of the body still to come

	r := mustPost(t, p.proxy, "/export", "big", "x") // waits for the original (-wait), then replays
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" || len(r.body) != chunks*size {
		t.Fatalf("retry = %d %v, %d bytes; want the whole %d-byte response replayed", r.status, r.header, len(r.body), chunks*size)
	}
	if r.body[len(r.body)-1] != byte('a'+(chunks-1)%26) {
		t.Fatal("the replayed body is not the upstream's")
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("upstream ran %d times; want 1", n)
	}
}
