package idemtest_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemtest"
)

func TestMemoryStore(t *testing.T) {
	idemtest.TestStore(t, func(*testing.T) idempotency.Store { return idempotency.NewMemoryStore() })
}

// bugs are stores that break one clause each. The suite must fail each of
// them, naming the clause.
var bugs = []struct {
	name   string
	clause string // a subtest that must fail
}{
	{"complete-ignores-token", "Fencing/stale-complete-rejected"},
	{"wall-clock-lease", "Begin/processing-past-lease-takes-over"},
	{"shared-response", "Copies/returned-records"},
	{"ignores-ctx", "Context/canceled-begin"},
	{"release-noop", "Release/removes-claim"},
	{"extend-noop", "Extend/moves-lease"},
	{"truncates-body", "Body/large-1MiB"},
	{"truncates-keys", "Keys/255-bytes"},
	{"plain-errors", "Unavailable/begin"},
	{"second-claim", "Concurrency/one-claim-of-64"},
}

const bugVar = "IDEMTEST_BUG"

// TestBuggyStore is run by TestSuiteCatchesBugs in a child process.
func TestBuggyStore(t *testing.T) {
	bug := os.Getenv(bugVar)
	if bug == "" {
		t.Skip("run by TestSuiteCatchesBugs with " + bugVar + " set")
	}
	idemtest.Run(t, idemtest.Harness{
		New: func(*testing.T) idempotency.Store { return &buggy{Store: idempotency.NewMemoryStore(), bug: bug} },
		Broken: func(*testing.T) idempotency.Store {
			m := idempotency.NewMemoryStore()
			m.Fault = func(string) error { return errors.New("down") }
			return &buggy{Store: m, bug: bug}
		},
	})
}

func TestSuiteCatchesBugs(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a child test binary per bug")
	}
	for _, b := range bugs {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestBuggyStore$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), bugVar+"="+b.name)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Fatalf("the suite passed a store with bug %q (err %v); output:\n%s", b.name, err, tail(out))
			}
			if want := "--- FAIL: TestBuggyStore/" + b.clause + " "; !strings.Contains(string(out), want) {
				t.Fatalf("bug %q: clause %s did not fail; output:\n%s", b.name, b.clause, tail(out))
			}
		})
	}
}

func tail(b []byte) string {
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// buggy breaks a MemoryStore in the way its bug names.
type buggy struct {
	idempotency.Store
	bug string

	mu      sync.Mutex
	claimed map[string]bool
	last    map[string]idempotency.Response
}

func (b *buggy) key(k string) string {
	if b.bug == "truncates-keys" && len(k) > 250 {
		return k[:250]
	}
	return k
}

func (b *buggy) Begin(ctx context.Context, key, fp string, now time.Time, lease, retention time.Duration) (idempotency.Record, bool, error) {
	switch b.bug {
	case "wall-clock-lease":
		now = time.Now()
	case "ignores-ctx":
		ctx = context.Background()
	}
	rec, ok, err := b.Store.Begin(ctx, b.key(key), fp, now, lease, retention)
	if b.bug == "second-claim" && err == nil && !ok && rec.State == idempotency.Processing {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.claimed == nil {
			b.claimed = map[string]bool{}
		}
		if !b.claimed[key] {
			b.claimed[key] = true
			return rec, true, nil // a second caller is told it holds the claim
		}
	}
	if b.bug == "plain-errors" && err != nil {
		return rec, ok, errors.New(strings.ReplaceAll(err.Error(), "unavailable", "broken"))
	}
	return rec, ok, err
}

func (b *buggy) Complete(ctx context.Context, key string, token uint64, resp idempotency.Response, now time.Time, retention time.Duration) error {
	switch b.bug {
	case "complete-ignores-token":
		if rec, err := b.Store.Get(ctx, key, now); err == nil {
			token = rec.Token
		}
	case "truncates-body":
		if len(resp.Body) > 64<<10 {
			resp.Body = resp.Body[:64<<10]
		}
	}
	return b.Store.Complete(ctx, b.key(key), token, resp, now, retention)
}

func (b *buggy) Extend(ctx context.Context, key string, token uint64, now time.Time, lease time.Duration) error {
	if b.bug == "extend-noop" {
		return nil
	}
	return b.Store.Extend(ctx, b.key(key), token, now, lease)
}

func (b *buggy) Release(ctx context.Context, key string, token uint64) error {
	if b.bug == "release-noop" {
		return nil
	}
	return b.Store.Release(ctx, b.key(key), token)
}

func (b *buggy) Get(ctx context.Context, key string, now time.Time) (idempotency.Record, error) {
	rec, err := b.Store.Get(ctx, b.key(key), now)
	if b.bug == "shared-response" && err == nil {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.last == nil {
			b.last = map[string]idempotency.Response{}
		}
		if prev, ok := b.last[key]; ok {
			rec.Response = prev // hands out the same slices and maps again
		} else {
			b.last[key] = rec.Response
		}
	}
	return rec, err
}

func (b *buggy) Delete(ctx context.Context, key string) error {
	return b.Store.Delete(ctx, b.key(key))
}

func BenchmarkMemoryStore(b *testing.B) {
	idemtest.BenchmarkStore(b, idempotency.NewMemoryStore())
}

// TestClauseCheck runs the clauses the way idemcheck does, without a
// testing.T: they hold on a MemoryStore, and the clause a bug breaks
// reports it as an error naming the clause.
func TestClauseCheck(t *testing.T) {
	ctx := context.Background()
	clauses := idemtest.Clauses()
	if len(clauses) < 40 {
		t.Fatalf("Clauses() = %d clauses, want the whole suite", len(clauses))
	}
	s := idempotency.NewMemoryStore()
	for _, c := range clauses {
		if err := c.Check(ctx, s); err != nil {
			t.Errorf("%s on a MemoryStore: %v", c.Name, err)
		}
	}
	for _, b := range bugs {
		if strings.HasPrefix(b.clause, "Unavailable/") {
			continue
		}
		var c idemtest.Clause
		for _, cl := range clauses {
			if cl.Name == b.clause {
				c = cl
			}
		}
		err := c.Check(ctx, &buggy{Store: idempotency.NewMemoryStore(), bug: b.name})
		if err == nil || !strings.Contains(err.Error(), b.clause) {
			t.Errorf("bug %q: Check of %s = %v, want an error naming the clause", b.name, b.clause, err)
		}
	}
	broken := idempotency.NewMemoryStore()
	broken.Fault = func(string) error { return errors.New("down") }
	for _, c := range idemtest.UnavailableClauses() {
		if err := c.Check(ctx, broken); err != nil {
			t.Errorf("%s on a failing MemoryStore: %v", c.Name, err)
		}
		if err := c.Check(ctx, idempotency.NewMemoryStore()); err == nil {
			t.Errorf("%s on a working MemoryStore passed, want a failure", c.Name)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := clauses[0].Check(cctx, idempotency.NewMemoryStore()); !errors.Is(err, context.Canceled) {
		t.Errorf("Check with a cancelled ctx = %v, want context.Canceled", err)
	}
}
