package boltstore

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

// crashChildVar names the file the child process of TestCrash writes to;
// crashLieVar makes the child print keys before their write instead of
// after, to show that the check catches lost acknowledgments.
const (
	crashChildVar = "BOLTSTORE_CRASH_CHILD_DB"
	crashLieVar   = "BOLTSTORE_CRASH_LIE"
)

// The child's storm is bounded so that a child the parent fails to kill
// still ends by itself.
const (
	crashWorkers  = 16
	crashPerChild = 200_000
	crashMaxTime  = 30 * time.Second
)

func crashBody(key string) []byte { return []byte("body of " + key) }

// crashChild is the child process of TestCrash (TestMain runs it instead of
// the tests when crashChildVar is set): a write storm on the file it names
// that prints each key on stdout once its Complete has returned, and so is
// on disk.
func crashChild(path string) error {
	s, err := Open(path, nil)
	if err != nil {
		return err
	}
	defer s.Close()
	g, err := idempotency.NewGuard(s, nil)
	if err != nil {
		return err
	}
	var (
		mu   sync.Mutex
		next int
		wg   sync.WaitGroup
	)
	ctx, cancel := context.WithTimeout(context.Background(), crashMaxTime)
	defer cancel()
	out := os.Stdout // unbuffered: a line is in the pipe when Write returns
	lie := os.Getenv(crashLieVar) == "1"
	ack := func(key string) error {
		mu.Lock()
		defer mu.Unlock()
		_, err := io.WriteString(out, key+"\n")
		return err
	}
	for range crashWorkers {
		wg.Go(func() {
			for ctx.Err() == nil {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= crashPerChild {
					return
				}
				key := fmt.Sprintf("crash-%d-%d", os.Getpid(), i) // new keys every round
				if lie && ack(key) != nil {
					return
				}
				_, outcome, err := g.Do(ctx, key, "fp", func(context.Context) (idempotency.Response, error) {
					return idempotency.Response{Status: 200, Body: crashBody(key)}, nil
				})
				if err != nil || outcome != idempotency.Executed {
					fmt.Fprintf(os.Stderr, "child: %s: %s %v\n", key, outcome, err)
					continue
				}
				if !lie && ack(key) != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	return nil
}

// TestCrash kills a child process with SIGKILL in the middle of a write
// storm and checks that every Complete it acknowledged survived, replays,
// and that the file is consistent. Each round kills at another moment.
func TestCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	delays := []time.Duration{30 * time.Millisecond, 120 * time.Millisecond, 400 * time.Millisecond, 900 * time.Millisecond}
	path := filepath.Join(t.TempDir(), "crash.db")
	var all []string
	for round, delay := range delays {
		// The same file every round: later rounds recover from the crash of
		// the earlier ones and crash again on top, so every round checks the
		// acknowledgments of all of them.
		acked := crashRound(t, exe, path, delay, false)
		t.Logf("round %d: killed after %v, %d acknowledged Completes", round, delay, len(acked))
		all = append(all, acked...)
		if lost := verifyCrash(t, path, all, true); lost > 0 {
			t.Errorf("round %d: %d of %d acknowledged Completes lost", round, lost, len(all))
		}
		if t.Failed() {
			return
		}
	}
}

// TestCrashCheckCanFail runs a child that acknowledges keys before writing
// them: the check of TestCrash must find some of them missing.
func TestCrashCheckCanFail(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "lie.db")
	acked := crashRound(t, exe, path, 100*time.Millisecond, true)
	lost := verifyCrash(t, path, acked, false)
	t.Logf("a lying child: %d of %d early acknowledgments missing after the crash", lost, len(acked))
	if lost == 0 {
		t.Error("the crash check found nothing missing from a child that acknowledged before writing")
	}
}

// crashRound runs one child, kills it delay after its first acknowledgment,
// and returns the keys it acknowledged.
func crashRound(t *testing.T, exe, path string, delay time.Duration, lie bool) []string {
	t.Helper()
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), crashChildVar+"="+path)
	if lie {
		cmd.Env = append(cmd.Env, crashLieVar+"=1")
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	first := make(chan struct{})
	lines := make(chan []string, 1)
	go func() {
		// Only whole lines count: a key cut by the kill was not
		// acknowledged.
		var keys []string
		r := bufio.NewReader(stdout)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				break
			}
			if key, ok := strings.CutSuffix(line, "\n"); ok && strings.HasPrefix(key, "crash-") {
				if len(keys) == 0 {
					close(first)
				}
				keys = append(keys, key)
			}
		}
		lines <- keys
	}()
	select {
	case <-first:
	case <-lines:
		_ = cmd.Wait()
		t.Fatalf("the child ended without acknowledging anything; stderr:\n%s", stderr.String())
	case <-time.After(crashMaxTime):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("the child acknowledged nothing in %v; stderr:\n%s", crashMaxTime, stderr.String())
	}
	time.Sleep(delay)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL: %v", err)
	}
	keys := <-lines
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("child ended with %v, want killed; stderr:\n%s", err, stderr.String())
	}
	if ws, ok := exit.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child was not killed mid-storm (%v); stderr:\n%s", err, stderr.String())
	}
	return keys
}

// verifyCrash reopens the file after a crash, checks its consistency and
// returns how many acknowledged keys are not Done. When strict, it also
// reports each of them and replays every acknowledged key through a Guard.
func verifyCrash(t *testing.T, path string, acked []string, strict bool) (lost int) {
	t.Helper()
	s, err := Open(path, nil)
	if err != nil {
		t.Fatalf("reopen after the crash: %v", err)
	}
	defer s.Close()
	checkFile(t, s.DB())
	checkIndex(t, s)
	g, err := idempotency.NewGuard(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, key := range acked {
		rec, err := s.Get(ctx, key, time.Now())
		if err != nil || rec.State != idempotency.Done {
			lost++
			if strict && lost <= 5 {
				t.Errorf("acknowledged %s after the crash: %+v, %v; want Done", key, rec, err)
			}
			continue
		}
		if !strict {
			continue
		}
		resp, outcome, err := g.Do(ctx, key, "fp", func(context.Context) (idempotency.Response, error) {
			t.Errorf("acknowledged %s ran again after the crash", key)
			return idempotency.Response{}, nil
		})
		if err != nil || outcome != idempotency.Replayed || string(resp.Body) != string(crashBody(key)) {
			t.Errorf("Do(%s) after the crash = %q, %s, %v; want its body Replayed", key, resp.Body, outcome, err)
		}
	}
	return lost
}
