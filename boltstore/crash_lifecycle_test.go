package boltstore

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

// TestCrash checks the claims and Completes a killed process acknowledged;
// these tests do the same for the package's other writes: Extend, Release
// and Delete. An Extend lost to a crash would give a holder less lease than
// it was told it had (another process could take its key over while it
// runs); a Release or a Delete lost would bring back a record its caller
// had removed.

// lifecycleChildVar names the file the child process of
// TestCrashKeepsExtendReleaseDelete writes to; lifecycleLieVar makes the
// child acknowledge those writes without making them, to show that the
// check finds each kind missing.
const (
	lifecycleChildVar = "BOLTSTORE_LIFECYCLE_CHILD_DB"
	lifecycleLieVar   = "BOLTSTORE_LIFECYCLE_LIE"
)

// The child's acknowledgements: "extended KEY TOKEN" once Extend of KEY's
// claim TOKEN returned nil (the lease went from lifecycleLease to
// lifecycleExtended), "released KEY" once Release returned nil, "deleted
// KEY" once Delete of KEY's Done record returned nil.
const (
	extendedPrefix = "extended "
	releasedPrefix = "released "
	deletedPrefix  = "deleted "

	lifecycleWorkers  = 8
	lifecycleLease    = time.Minute
	lifecycleExtended = 10 * time.Hour
)

// lifecycleChild is the child process of TestCrashKeepsExtendReleaseDelete
// (TestMain runs it instead of the tests when lifecycleChildVar is set):
// workers that claim new keys and Extend, Release or Complete and Delete
// each, printing each write once it returned nil, until they are killed
// (or crashMaxTime passes).
func lifecycleChild(path string) error {
	s, err := Open(path, nil)
	if err != nil {
		return err
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), crashMaxTime)
	defer cancel()
	lie := os.Getenv(lifecycleLieVar) == "1"
	var mu sync.Mutex
	ack := func(format string, args ...any) error {
		mu.Lock()
		defer mu.Unlock()
		_, err := fmt.Fprintf(os.Stdout, format+"\n", args...) // unbuffered
		return err
	}
	var wg sync.WaitGroup
	for w := range lifecycleWorkers {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				key := fmt.Sprintf("lc-%d-%d-%d", os.Getpid(), w, i)
				now := time.Now()
				rec, ok, err := s.Begin(ctx, key, "fp", now, lifecycleLease, time.Hour)
				if err != nil || !ok {
					fmt.Fprintf(os.Stderr, "child: Begin(%s) = %v, %v\n", key, ok, err)
					continue
				}
				var line string
				switch i % 3 {
				case 0:
					if !lie {
						err = s.Extend(ctx, key, rec.Token, now, lifecycleExtended)
					}
					line = fmt.Sprintf(extendedPrefix+"%s %d", key, rec.Token)
				case 1:
					if !lie {
						err = s.Release(ctx, key, rec.Token)
					}
					line = releasedPrefix + key
				case 2:
					err = s.Complete(ctx, key, rec.Token, idempotency.Response{Status: 200}, now, time.Hour)
					if err == nil && !lie {
						err = s.Delete(ctx, key)
					}
					line = deletedPrefix + key
				}
				if err != nil {
					fmt.Fprintf(os.Stderr, "child: %s: %v\n", key, err)
					continue
				}
				if ack("%s", line) != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	return nil
}

// lifecycleAcks are what a child acknowledged: Extends (key: token),
// Releases and Deletes.
type lifecycleAcks struct {
	extended          map[string]uint64
	released, deleted []string
}

// TestCrashKeepsExtendReleaseDelete kills a child process with SIGKILL at
// random moments while it Extends, Releases and Deletes, and checks that
// every one it acknowledged is in the reopened file: an extended claim
// keeps its token and its longer lease, a released or deleted key has no
// record.
func TestCrashKeepsExtendReleaseDelete(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	path := filepath.Join(t.TempDir(), "lifecycle.db")
	all := lifecycleAcks{extended: map[string]uint64{}}
	for round := range 5 {
		// The same file every round, so each round's check covers the
		// acknowledgements of the rounds before, recovered again.
		delay := time.Duration(rng.IntN(300)) * time.Millisecond
		acked := lifecycleRound(t, path, delay, false)
		t.Logf("round %d: killed %v after the first of each write; %d Extends, %d Releases, %d Deletes acknowledged",
			round, delay, len(acked.extended), len(acked.released), len(acked.deleted))
		for k, tok := range acked.extended {
			all.extended[k] = tok
		}
		all.released = append(all.released, acked.released...)
		all.deleted = append(all.deleted, acked.deleted...)
		ext, rel, del := verifyLifecycle(t, path, all, true)
		if ext+rel+del > 0 {
			t.Fatalf("round %d: lost %d of %d acknowledged Extends, %d of %d Releases, %d of %d Deletes",
				round, ext, len(all.extended), rel, len(all.released), del, len(all.deleted))
		}
	}
}

// TestCrashLifecycleCheckCanFail: a child that acknowledges Extends,
// Releases and Deletes it never made is caught, for each kind.
func TestCrashLifecycleCheckCanFail(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	path := filepath.Join(t.TempDir(), "lie.db")
	acked := lifecycleRound(t, path, 0, true)
	ext, rel, del := verifyLifecycle(t, path, acked, false)
	t.Logf("a lying child: %d of %d Extends, %d of %d Releases, %d of %d Deletes missing",
		ext, len(acked.extended), rel, len(acked.released), del, len(acked.deleted))
	if ext == 0 || rel == 0 || del == 0 {
		t.Error("the check missed a kind of write that a lying child acknowledged without making it")
	}
}

// lifecycleRound runs one child until it has acknowledged each kind of
// write, kills it delay later, and returns what it acknowledged.
func lifecycleRound(t *testing.T, path string, delay time.Duration, lie bool) lifecycleAcks {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), lifecycleChildVar+"="+path)
	if lie {
		cmd.Env = append(cmd.Env, lifecycleLieVar+"=1")
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
	each := make(chan struct{})
	result := make(chan lifecycleAcks, 1)
	go func() {
		a := lifecycleAcks{extended: map[string]uint64{}}
		r := bufio.NewReader(stdout)
		signalled := false
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				break // a line the kill cut short was not acknowledged
			}
			line = strings.TrimSuffix(line, "\n")
			if rest, ok := strings.CutPrefix(line, extendedPrefix); ok {
				key, tok, _ := strings.Cut(rest, " ")
				n, err := strconv.ParseUint(tok, 10, 64)
				if err != nil {
					t.Errorf("child printed %q", line)
					continue
				}
				a.extended[key] = n
			} else if key, ok := strings.CutPrefix(line, releasedPrefix); ok {
				a.released = append(a.released, key)
			} else if key, ok := strings.CutPrefix(line, deletedPrefix); ok {
				a.deleted = append(a.deleted, key)
			}
			if !signalled && len(a.extended) > 0 && len(a.released) > 0 && len(a.deleted) > 0 {
				signalled = true
				close(each)
			}
		}
		result <- a
	}()
	select {
	case <-each:
	case <-result:
		_ = cmd.Wait()
		t.Fatalf("the child ended before acknowledging each kind of write; stderr:\n%s", stderr.String())
	case <-time.After(crashMaxTime):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("the child did not acknowledge each kind of write in %v; stderr:\n%s", crashMaxTime, stderr.String())
	}
	time.Sleep(delay)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL: %v", err)
	}
	a := <-result
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("child ended with %v, want killed; stderr:\n%s", err, stderr.String())
	}
	if ws, ok := exit.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child was not killed mid-storm (%v); stderr:\n%s", err, stderr.String())
	}
	return a
}

// verifyLifecycle reopens the file and counts the acknowledged writes it
// lacks; when strict, it reports the first few of each.
func verifyLifecycle(t *testing.T, path string, acked lifecycleAcks, strict bool) (ext, rel, del int) {
	t.Helper()
	s, err := Open(path, nil)
	if err != nil {
		t.Fatalf("reopen after the crash: %v", err)
	}
	defer s.Close()
	checkFile(t, s.DB())
	checkIndex(t, s)
	ctx := context.Background()
	now := time.Now()
	report := func(n *int, format string, args ...any) {
		*n++
		if strict && *n <= 5 {
			t.Errorf(format, args...)
		}
	}
	for key, tok := range acked.extended {
		// The lease was lifecycleLease at the claim; acknowledged, the
		// Extend made it lifecycleExtended, which has hours to run.
		rec, err := s.Get(ctx, key, now)
		if err != nil || rec.State != idempotency.Processing || rec.Token != tok ||
			!rec.LeaseUntil.After(now.Add(lifecycleExtended/2)) {
			report(&ext, "acknowledged Extend of %s (token %d) after the crash: %+v, %v; want the claim with its extended lease", key, tok, rec, err)
		}
	}
	for _, key := range acked.released {
		if rec, err := s.Get(ctx, key, now); !errors.Is(err, idempotency.ErrNotFound) {
			report(&rel, "acknowledged Release of %s after the crash: Get = %+v, %v; want ErrNotFound", key, rec, err)
		}
	}
	for _, key := range acked.deleted {
		if rec, err := s.Get(ctx, key, now); !errors.Is(err, idempotency.ErrNotFound) {
			report(&del, "acknowledged Delete of %s after the crash: Get = %+v, %v; want ErrNotFound", key, rec, err)
		}
	}
	return ext, rel, del
}
