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

	bolt "go.etcd.io/bbolt"

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
// still ends by itself. Of its workers, crashTakers take the shared keys
// over and over (each takeover a new, larger token of the same key),
// crashSweepers write records that expire at once (so that the writes
// after them sweep all the time); the others run new keys through a Guard.
const (
	crashWorkers    = 16
	crashTakers     = 4
	crashSweepers   = 2
	crashSharedKeys = 8
	crashPerChild   = 200_000
	crashMaxTime    = 30 * time.Second
)

func crashBody(key string) []byte { return []byte("body of " + key) }

func sharedKey(i int) string { return fmt.Sprint("shared-", i%crashSharedKeys) }

// A child prints "claim KEY TOKEN" once Begin claimed KEY with TOKEN (and
// so once the claim is on disk), and "done KEY" once its Complete has
// returned.
const (
	claimPrefix = "claim "
	donePrefix  = "done "
)

// crashChild is the child process of TestCrash (TestMain runs it instead of
// the tests when crashChildVar is set): a write storm on the file it names
// that prints each claim, with its token, on stdout once Begin has returned
// it, and each key again once its Complete has returned, each on disk by
// then.
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
	ack := func(format string, args ...any) error {
		mu.Lock()
		defer mu.Unlock()
		_, err := fmt.Fprintf(out, format+"\n", args...)
		return err
	}
	take := func() int {
		mu.Lock()
		defer mu.Unlock()
		next++
		return next - 1
	}
	// ahead is a token that a lying child acknowledges before the claim
	// that would get it is written: the key's sequence, read from a
	// snapshot, plus more claims than a batch can hold.
	ahead := func() uint64 {
		var seq uint64
		_ = s.db.View(func(tx *bolt.Tx) error {
			b, err := s.buckets(tx)
			if err == nil {
				seq = b.recs.Sequence()
			}
			return err
		})
		return seq + 2*crashWorkers
	}
	key := func(i int) string { return fmt.Sprintf("crash-%d-%d", os.Getpid(), i) } // new keys every round
	for w := range crashWorkers {
		if w < crashTakers {
			wg.Go(func() {
				for i := w; ctx.Err() == nil && i < crashPerChild; i += crashTakers {
					k := sharedKey(i)
					if lie && ack(claimPrefix+"%s %d", k, ahead()) != nil {
						return
					}
					// A lease of 1ns has run out by the next Begin: each
					// claim takes the key over from the one before.
					rec, ok, err := s.Begin(ctx, k, "fp", time.Now(), time.Nanosecond, time.Hour)
					if err != nil {
						fmt.Fprintf(os.Stderr, "child: Begin(%s): %v\n", k, err)
						continue
					}
					if ok && !lie && ack(claimPrefix+"%s %d", k, rec.Token) != nil {
						return
					}
				}
			})
			continue
		}
		if w < crashTakers+crashSweepers {
			wg.Go(func() {
				for i := 0; ctx.Err() == nil && i < crashPerChild; i++ {
					k := fmt.Sprintf("gone-%d-%d-%d", os.Getpid(), w, i)
					now := time.Now()
					rec, ok, err := s.Begin(ctx, k, "fp", now, time.Nanosecond, time.Microsecond)
					if err == nil && ok {
						err = s.Complete(ctx, k, rec.Token, idempotency.Response{Status: 200, Body: crashBody(k)}, now, time.Microsecond)
					}
					if err != nil {
						fmt.Fprintf(os.Stderr, "child: %s: %v\n", k, err)
					}
				}
			})
			continue
		}
		wg.Go(func() {
			// A lying child acknowledges each Complete before its Do, and
			// each claim crashWorkers keys ahead of its Do: the workers keep
			// in step with the group commit, so a kill may find none of them
			// inside a Begin, but it always finds claims acknowledged of
			// keys not yet taken.
			for i := take(); ctx.Err() == nil && i < crashPerChild; i = take() {
				if lie && (ack(claimPrefix+"%s %d", key(i+crashWorkers), ahead()) != nil || ack(donePrefix+key(i)) != nil) {
					return
				}
				k := key(i)
				_, outcome, err := g.Do(ctx, k, "fp", func(ctx context.Context) (idempotency.Response, error) {
					// fn runs once Begin has returned the claim.
					tok, _ := idempotency.TokenFrom(ctx)
					if !lie && ack(claimPrefix+"%s %d", k, tok) != nil {
						return idempotency.Response{}, errors.New("stdout closed")
					}
					return idempotency.Response{Status: 200, Body: crashBody(k)}, nil
				})
				if err != nil || outcome != idempotency.Executed {
					fmt.Fprintf(os.Stderr, "child: %s: %s %v\n", k, outcome, err)
					continue
				}
				if !lie && ack(donePrefix+k) != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	return nil
}

// crashSeed, when not 0, repeats a run of TestCrash.
var crashSeed uint64

// TestCrash kills a child process with SIGKILL in the middle of a write
// storm, at random moments, and checks that every claim and every Complete
// it acknowledged survived, that the Completes replay, that a claim after
// the crash gets a larger token than any acknowledged before it (of the
// same key, and of any), and that the file opens consistent. Some rounds
// kill the child at a random moment after its start, so that the kill may
// land in Open (bbolt's recovery of the file) or before the storm.
func TestCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	seed := crashSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (set crashSeed to repeat)", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	path := filepath.Join(t.TempDir(), "crash.db")
	all := acks{claimed: map[string]uint64{}}
	for round := range 10 {
		// The same file every round: later rounds recover from the crash of
		// the earlier ones and crash again on top, so every round checks the
		// acknowledgments of all of them.
		kill := crashKill{delay: time.Duration(rng.IntN(900)) * time.Millisecond}
		if round == 0 || rng.IntN(3) == 0 {
			kill = crashKill{fromStart: true, delay: time.Duration(rng.IntN(80)) * time.Millisecond}
		}
		acked := crashRound(t, exe, path, kill, false)
		t.Logf("round %d: killed %v, %d acknowledged claims, %d acknowledged Completes",
			round, kill, len(acked.claimed), len(acked.done))
		all.merge(acked)
		loss := verifyCrash(t, path, all, true)
		if loss.claims > 0 {
			t.Errorf("round %d: %d of %d acknowledged claims lost", round, loss.claims, len(all.claimed))
		}
		if loss.done > 0 {
			t.Errorf("round %d: %d of %d acknowledged Completes lost", round, loss.done, len(all.done))
		}
		if loss.tokens > 0 {
			t.Errorf("round %d: %d claims after the crash got a token not above one acknowledged before", round, loss.tokens)
		}
		if t.Failed() {
			return
		}
	}
}

// TestCrashCheckCanFail runs a child that acknowledges claims, their
// tokens and Completes before writing them: the check of TestCrash must
// find some of each missing.
func TestCrashCheckCanFail(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "lie.db")
	acked := crashRound(t, exe, path, crashKill{delay: 100 * time.Millisecond}, true)
	loss := verifyCrash(t, path, acked, false)
	t.Logf("a lying child: %d of %d early claims, %d of %d early Completes missing, %d tokens not exceeded after the crash",
		loss.claims, len(acked.claimed), loss.done, len(acked.done), loss.tokens)
	if loss.claims == 0 {
		t.Error("the crash check found no claim missing from a child that acknowledged claims before writing them")
	}
	if loss.done == 0 {
		t.Error("the crash check found no Complete missing from a child that acknowledged Completes before writing them")
	}
	if loss.tokens == 0 {
		t.Error("the crash check found no token reused by a child that acknowledged tokens before claiming them")
	}
}

// acks are what a child acknowledged: claims (key: its largest token) and
// Completes.
type acks struct {
	claimed map[string]uint64
	done    []string
}

func (a *acks) merge(b acks) {
	for k, tok := range b.claimed {
		a.claimed[k] = max(a.claimed[k], tok)
	}
	a.done = append(a.done, b.done...)
}

// crashKill is when a round kills its child: delay after its first
// acknowledged Complete, or after its start.
type crashKill struct {
	fromStart bool
	delay     time.Duration
}

func (k crashKill) String() string {
	if k.fromStart {
		return fmt.Sprintf("%v after its start", k.delay)
	}
	return fmt.Sprintf("%v after its first Complete", k.delay)
}

// crashRound runs one child, kills it as kill says, and returns what it
// acknowledged.
func crashRound(t *testing.T, exe, path string, kill crashKill, lie bool) acks {
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
		// Only whole lines count: a line cut by the kill was not
		// acknowledged.
		keys := acks{claimed: map[string]uint64{}}
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
			if rest, ok := strings.CutPrefix(line, claimPrefix); ok {
				key, tok, _ := strings.Cut(rest, " ")
				n, err := strconv.ParseUint(tok, 10, 64)
				if err != nil {
					t.Errorf("child printed %q", line)
					continue
				}
				keys.claimed[key] = max(keys.claimed[key], n)
			} else if key, ok := strings.CutPrefix(line, donePrefix); ok {
				if len(keys.done) == 0 {
					close(first)
				}
				keys.done = append(keys.done, key)
			}
		}
		lines <- keys
	}()
	if !kill.fromStart {
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
	}
	time.Sleep(kill.delay)
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

// crashLoss counts what a crash lost: acknowledged claims without their
// record (or with a smaller token than acknowledged), acknowledged
// Completes not Done, and claims after the crash whose token is not above
// every one acknowledged before.
type crashLoss struct{ claims, done, tokens int }

// verifyCrash reopens the file after a crash, checks its consistency and
// what the crash lost. When strict, it also reports each loss, replays
// every acknowledged Complete through a Guard, and records the tokens of
// its own claims in acked.
func verifyCrash(t *testing.T, path string, acked acks, strict bool) (loss crashLoss) {
	t.Helper()
	s, err := Open(path, nil)
	if err != nil {
		t.Fatalf("reopen after the crash: %v", err)
	}
	defer s.Close()
	checkFile(t, s.DB())
	checkIndex(t, s)
	if strict {
		r, _ := counts(t, s)
		t.Logf("reopened: %d records, %d acknowledged claims", r, len(acked.claimed))
	}
	g, err := idempotency.NewGuard(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var top uint64
	for key, tok := range acked.claimed {
		top = max(top, tok)
		// A claim lost to the crash would let a retry run the operation
		// again at once.
		rec, err := s.Get(ctx, key, time.Now())
		if err != nil || rec.Fingerprint != "fp" || strict && rec.Token < tok {
			loss.claims++
			if strict && loss.claims <= 5 {
				t.Errorf("acknowledged claim of %s with token %d after the crash: %+v, %v; want its record", key, tok, rec, err)
			}
		}
	}
	for _, key := range acked.done {
		rec, err := s.Get(ctx, key, time.Now())
		if err != nil || rec.State != idempotency.Done {
			loss.done++
			if strict && loss.done <= 5 {
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
	// Claims after the crash: each shared key taken over once more, and a
	// new key. Each must get a token above every one acknowledged of that
	// key, and (tokens come from one sequence) above every one at all.
	claim := func(key string, above uint64) {
		rec, ok, err := s.Begin(ctx, key, "fp", time.Now(), time.Nanosecond, time.Hour)
		if err != nil || !ok {
			t.Fatalf("Begin(%s) after the crash = %+v, %v, %v; want a claim", key, rec, ok, err)
		}
		if rec.Token <= above {
			loss.tokens++
			if strict {
				t.Errorf("Begin(%s) after the crash: token %d, not above %d acknowledged before", key, rec.Token, above)
			}
		}
		if strict {
			acked.claimed[key] = rec.Token // the next round's claims must exceed it too
		}
	}
	for i := range crashSharedKeys {
		claim(sharedKey(i), acked.claimed[sharedKey(i)])
	}
	claim(fmt.Sprint("fresh-", rand.Uint64()), top)
	return loss
}
