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

// claimPrefix starts the line a child prints for a key once its Begin
// claimed it (and so once the claim is on disk); a line of the key alone
// follows once its Complete has returned.
const claimPrefix = "claim "

// crashChild is the child process of TestCrash (TestMain runs it instead of
// the tests when crashChildVar is set): a write storm on the file it names
// that prints each key on stdout once its Begin has claimed it and again
// once its Complete has returned, each on disk by then.
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
	ack := func(line string) error {
		mu.Lock()
		defer mu.Unlock()
		_, err := io.WriteString(out, line+"\n")
		return err
	}
	take := func() int {
		mu.Lock()
		defer mu.Unlock()
		next++
		return next - 1
	}
	key := func(i int) string { return fmt.Sprintf("crash-%d-%d", os.Getpid(), i) } // new keys every round
	for range crashWorkers {
		wg.Go(func() {
			// A lying child acknowledges each Complete before its Do, and
			// each claim crashWorkers keys ahead of its Do: the workers keep
			// in step with the group commit, so a kill may find none of them
			// inside a Begin, but it always finds claims acknowledged of
			// keys not yet taken.
			for i := take(); ctx.Err() == nil && i < crashPerChild; i = take() {
				if lie && (ack(claimPrefix+key(i+crashWorkers)) != nil || ack(key(i)) != nil) {
					return
				}
				k := key(i)
				_, outcome, err := g.Do(ctx, k, "fp", func(context.Context) (idempotency.Response, error) {
					// fn runs once Begin has returned the claim.
					if !lie && ack(claimPrefix+k) != nil {
						return idempotency.Response{}, errors.New("stdout closed")
					}
					return idempotency.Response{Status: 200, Body: crashBody(k)}, nil
				})
				if err != nil || outcome != idempotency.Executed {
					fmt.Fprintf(os.Stderr, "child: %s: %s %v\n", k, outcome, err)
					continue
				}
				if !lie && ack(k) != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	return nil
}

// TestCrash kills a child process with SIGKILL in the middle of a write
// storm and checks that every claim and every Complete it acknowledged
// survived, that the Completes replay, and that the file is consistent.
// Each round kills at another moment.
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
	var all acks
	for round, delay := range delays {
		// The same file every round: later rounds recover from the crash of
		// the earlier ones and crash again on top, so every round checks the
		// acknowledgments of all of them.
		acked := crashRound(t, exe, path, delay, false)
		t.Logf("round %d: killed after %v, %d acknowledged claims, %d acknowledged Completes",
			round, delay, len(acked.claimed), len(acked.done))
		all.claimed = append(all.claimed, acked.claimed...)
		all.done = append(all.done, acked.done...)
		lostClaims, lostDone := verifyCrash(t, path, all, true)
		if lostClaims > 0 {
			t.Errorf("round %d: %d of %d acknowledged claims lost", round, lostClaims, len(all.claimed))
		}
		if lostDone > 0 {
			t.Errorf("round %d: %d of %d acknowledged Completes lost", round, lostDone, len(all.done))
		}
		if t.Failed() {
			return
		}
	}
}

// TestCrashCheckCanFail runs a child that acknowledges claims and Completes
// before writing them: the check of TestCrash must find some of each
// missing.
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
	lostClaims, lostDone := verifyCrash(t, path, acked, false)
	t.Logf("a lying child: %d of %d early claims, %d of %d early Completes missing after the crash",
		lostClaims, len(acked.claimed), lostDone, len(acked.done))
	if lostClaims == 0 {
		t.Error("the crash check found no claim missing from a child that acknowledged claims before writing them")
	}
	if lostDone == 0 {
		t.Error("the crash check found no Complete missing from a child that acknowledged Completes before writing them")
	}
}

// acks are the keys a child acknowledged: claimed by Begin, and Done.
type acks struct{ claimed, done []string }

// crashRound runs one child, kills it delay after its first acknowledged
// Complete, and returns the keys it acknowledged.
func crashRound(t *testing.T, exe, path string, delay time.Duration, lie bool) acks {
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
	lines := make(chan acks, 1)
	go func() {
		// Only whole lines count: a key cut by the kill was not
		// acknowledged.
		var keys acks
		r := bufio.NewReader(stdout)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				break
			}
			line, ok := strings.CutSuffix(line, "\n")
			if !ok {
				continue
			}
			if key, ok := strings.CutPrefix(line, claimPrefix); ok && strings.HasPrefix(key, "crash-") {
				keys.claimed = append(keys.claimed, key)
			} else if strings.HasPrefix(line, "crash-") {
				if len(keys.done) == 0 {
					close(first)
				}
				keys.done = append(keys.done, line)
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
// returns how many acknowledged claims have no live record of theirs
// (Processing or Done), and how many acknowledged Completes are not Done.
// When strict, it also reports each of them and replays every acknowledged
// Complete through a Guard.
func verifyCrash(t *testing.T, path string, acked acks, strict bool) (lostClaims, lostDone int) {
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
	for _, key := range acked.claimed {
		// A claim lost to the crash would let a retry run the operation
		// again at once.
		rec, err := s.Get(ctx, key, time.Now())
		if err != nil || rec.Fingerprint != "fp" || rec.Token == 0 {
			lostClaims++
			if strict && lostClaims <= 5 {
				t.Errorf("acknowledged claim of %s after the crash: %+v, %v; want its record", key, rec, err)
			}
		}
	}
	for _, key := range acked.done {
		rec, err := s.Get(ctx, key, time.Now())
		if err != nil || rec.State != idempotency.Done {
			lostDone++
			if strict && lostDone <= 5 {
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
	return lostClaims, lostDone
}
