package idemgrpc_test

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemgrpc"
	"github.com/archlab/idempotency/internal/testenv"
	"github.com/archlab/idempotency/redisstore"
)

// pausedRedis is a redis-server of the test's own on a free port, killed at
// cleanup; the shared server is never paused.
type pausedRedis struct {
	cmd  *exec.Cmd
	addr string
}

func startPrivateRedis(t *testing.T) *pausedRedis {
	t.Helper()
	bin := testenv.Binary(t, "redis-server")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir := t.TempDir()
	log, err := os.Create(filepath.Join(dir, "redis.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--daemonize", "no", "--protected-mode", "no")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &pausedRedis{cmd: cmd, addr: "127.0.0.1:" + strconv.Itoa(port)}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	c := redis.NewClient(&redis.Options{Addr: r.addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	for deadline := time.Now().Add(10 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return r
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			t.Fatalf("private redis-server on %s did not start: %v\n%s", r.addr, err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *pausedRedis) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := r.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
}

// TestPausedRedis: a store that stops answering (a redis-server frozen with
// SIGSTOP: connections are accepted, nothing is answered). Before the
// handler runs, the call is answered Unavailable and the handler does not
// run (the store's OpTimeout bounds the wait). When it freezes while the
// handler runs, the handler's answer is sent, OnStoreError hears that it
// could not be stored, and the retry, once the server is back, is never a
// second execution: in flight (Aborted) while the claim lasts, or a replay
// if the frozen write was applied when the server resumed.
func TestPausedRedis(t *testing.T) {
	r := startPrivateRedis(t)
	client := redis.NewClient(&redis.Options{Addr: r.addr, ContextTimeoutEnabled: true, DialTimeout: time.Second})
	t.Cleanup(func() { _ = client.Close() })
	store, err := redisstore.New(client, &redisstore.Options{Prefix: "idemgrpc-paused:", OpTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var reported []error
	f := newFixture(t, fixtureOpts{
		store: store,
		guard: &idempotency.Options{Lease: time.Minute},
		server: &idemgrpc.Options{OnStoreError: func(_ context.Context, _ string, err error) {
			mu.Lock()
			defer mu.Unlock()
			reported = append(reported, err)
		}},
	})
	takeReported := func() []error {
		mu.Lock()
		defer mu.Unlock()
		out := reported
		reported = nil
		return out
	}
	paused := false
	pause := func(on bool) {
		if on {
			r.signal(t, syscall.SIGSTOP)
		} else {
			r.signal(t, syscall.SIGCONT)
		}
		paused = on
	}
	t.Cleanup(func() {
		if paused {
			r.signal(t, syscall.SIGCONT)
		}
	})

	t.Run("before-the-handler", func(t *testing.T) {
		pause(true)
		defer pause(false)
		_, _, err := f.echo(testCtx(t), "k-paused", "before")
		if status.Code(err) != codes.Unavailable {
			t.Errorf("call with the store frozen: %v, want Unavailable", err)
		}
		if n := f.svc.executions("before"); n != 0 {
			t.Errorf("handler ran %d times with the store frozen, want 0", n)
		}
		if rep := takeReported(); len(rep) != 1 || !errors.Is(rep[0], idempotency.ErrUnavailable) {
			t.Errorf("OnStoreError got %v, want one ErrUnavailable", rep)
		}
	})

	t.Run("while-the-handler-runs", func(t *testing.T) {
		f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
			if n == 1 {
				pause(true) // the handler's side effect is done; the store freezes
			}
			return wrapperspb.String("charged"), nil
		}
		out, _, err := f.echo(testCtx(t), "k-paused-mid", "mid")
		pause(false)
		if err != nil || out.GetValue() != "charged" {
			t.Errorf("call: %v, %v; want the handler's answer", out, err)
		}
		if rep := takeReported(); len(rep) != 1 || !errors.Is(rep[0], idempotency.ErrUnavailable) {
			t.Errorf("OnStoreError got %v, want one ErrUnavailable (result not stored)", rep)
		}
		out, h, err := f.echo(testCtx(t), "k-paused-mid", "mid")
		switch {
		case status.Code(err) == codes.Aborted:
		case err == nil && out.GetValue() == "charged" && len(h.Get(idemgrpc.ReplayedKey)) == 1:
		default:
			t.Errorf("retry after the store came back: %v, %v; want Aborted or a replay", out, err)
		}
		if n := f.svc.executions("mid"); n != 1 {
			t.Errorf("handler ran %d times, want 1", n)
		}
	})
}
