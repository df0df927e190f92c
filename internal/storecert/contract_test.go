package storecert

import (
	"context"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemtest"
	"github.com/archlab/idempotency/internal/verdict"
)

// testClauseTimeout stands in for the minute a clause gets on a live store.
const testClauseTimeout = 200 * time.Millisecond

// certifyContract certifies a target whose contract runs on contract, with
// clauses given up after testClauseTimeout, and whose campaign runs
// briefly on a correct MemoryStore (the campaign's own bound on a hung
// store is TestCampaignHungStore's), and returns the contract's checks by
// clause name.
func certifyContract(t *testing.T, desc string, contract idempotency.Store) (*verdict.Report, map[string]verdict.Check) {
	t.Helper()
	tgt := &target{desc: desc, contract: contract,
		campaign: func(_ context.Context, seed int64) (*faulty, error) {
			f := injected(idempotency.NewMemoryStore(), nopCloser{}, seed, false)
			f.phases = nil
			return f, nil
		}}
	opts, _ := testOptions()
	opts.Duration = time.Second
	opts.clauseTimeout = testClauseTimeout
	rep := verdict.New()
	if err := certify(context.Background(), tgt, opts, rep); err != nil {
		t.Fatal(err)
	}
	checks := map[string]verdict.Check{}
	for _, c := range rep.Checks() {
		if name, ok := strings.CutPrefix(c.Name, "contract: "); ok {
			checks[name] = c
		}
	}
	return rep, checks
}

// example is the first failure example of c ("" if none).
func example(c verdict.Check) string {
	if len(c.Examples) == 0 {
		return ""
	}
	return c.Examples[0]
}

// A store that blocks in every call, whatever its ctx, does not hold the
// contract phase for a clause timeout per clause: the first clause is
// given up as hung, naming the method, and each other clause fails as not
// run, naming that clause (a clause that calls no store method may pass),
// at most maxHungClauses of them having waited
// for the whole timeout.
func TestContractStoreHungEverywhere(t *testing.T) {
	s := misbehaves{MemoryStore: idempotency.NewMemoryStore(), method: anyMethod, block: blocker(t)}
	rep, checks := certifyContract(t, "a store that blocks in every call", s)
	if rep.OK() {
		t.Fatalf("the certification passed a store that blocks in every call:\n%s", report(rep))
	}
	clauses := idemtest.Clauses()
	first := clauses[0].Name
	if ex := example(checks[first]); !strings.Contains(ex, "abandoned") || !strings.Contains(ex, "hung") || !strings.Contains(ex, "Begin") {
		t.Errorf("the first clause, %s, was reported %q; want it given up as hung in Begin", first, ex)
	}
	calls := callsOf(t)
	waited := 0
	for _, cl := range clauses {
		c := checks[cl.Name]
		ex := example(c)
		if len(calls[cl.Name]) == 0 && c.OK() {
			continue // it calls no store method (Sweep on a store without one)
		}
		if c.Failed != 1 || c.Passed != 0 {
			t.Errorf("%s: passed %d, failed %d; want one failure", cl.Name, c.Passed, c.Failed)
		}
		if strings.Contains(ex, "abandoned") {
			waited++
			continue
		}
		if !strings.Contains(ex, "not run") || !strings.Contains(ex, first) {
			t.Errorf("%s was reported %q; want it not run, naming %s where the store hung", cl.Name, ex, first)
		}
	}
	if waited > maxHungClauses {
		t.Errorf("%d clauses waited for the whole clause timeout; want at most %d", waited, maxHungClauses)
	}
	t.Logf("%d of %d clauses waited for the timeout:\n%s", waited, len(clauses), report(rep))
}

// callsOf returns, for each clause, the store methods it calls on a
// correct store.
func callsOf(t *testing.T) map[string]map[string]bool {
	t.Helper()
	out := map[string]map[string]bool{}
	for _, cl := range idemtest.Clauses() {
		spy := &spyStore{MemoryStore: idempotency.NewMemoryStore(), called: map[string]bool{}}
		if err := cl.Check(context.Background(), spy); err != nil {
			t.Fatalf("%s fails on a MemoryStore: %v", cl.Name, err)
		}
		spy.mu.Lock()
		out[cl.Name] = maps.Clone(spy.called)
		spy.mu.Unlock()
	}
	return out
}

// spyStore is a MemoryStore that notes the methods called.
type spyStore struct {
	*idempotency.MemoryStore
	mu     sync.Mutex
	called map[string]bool
}

func (s *spyStore) note(method string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.called[method] = true
}

func (s *spyStore) Begin(ctx context.Context, key, fp string, now time.Time, lease, retention time.Duration) (idempotency.Record, bool, error) {
	s.note("Begin")
	return s.MemoryStore.Begin(ctx, key, fp, now, lease, retention)
}

func (s *spyStore) Complete(ctx context.Context, key string, token uint64, resp idempotency.Response, now time.Time, retention time.Duration) error {
	s.note("Complete")
	return s.MemoryStore.Complete(ctx, key, token, resp, now, retention)
}

func (s *spyStore) Extend(ctx context.Context, key string, token uint64, now time.Time, lease time.Duration) error {
	s.note("Extend")
	return s.MemoryStore.Extend(ctx, key, token, now, lease)
}

func (s *spyStore) Release(ctx context.Context, key string, token uint64) error {
	s.note("Release")
	return s.MemoryStore.Release(ctx, key, token)
}

func (s *spyStore) Get(ctx context.Context, key string, now time.Time) (idempotency.Record, error) {
	s.note("Get")
	return s.MemoryStore.Get(ctx, key, now)
}

func (s *spyStore) Delete(ctx context.Context, key string) error {
	s.note("Delete")
	return s.MemoryStore.Delete(ctx, key)
}

// A store that blocks in one method only (Delete, which no clause calls
// from a timer) loses only the clauses that call it: the first is given up
// as hung in Delete, the others stop at their first Delete, which is
// refused at once, and fail as not run to their end; every clause that
// does not call Delete runs and passes.
func TestContractStoreHungInOneMethod(t *testing.T) {
	const method = "Delete"
	calls := callsOf(t)
	s := misbehaves{MemoryStore: idempotency.NewMemoryStore(), method: method, block: blocker(t)}
	_, checks := certifyContract(t, "a store whose Delete never returns", s)
	hungIn := ""
	calling := 0
	for _, cl := range idemtest.Clauses() {
		c := checks[cl.Name]
		ex := example(c)
		switch {
		case !calls[cl.Name][method]:
			if !c.OK() {
				t.Errorf("%s does not call %s, but did not pass: passed %d, failed %d, %q", cl.Name, method, c.Passed, c.Failed, ex)
			}
		case hungIn == "":
			hungIn = cl.Name
			calling++
			if c.OK() || !strings.Contains(ex, "hung") || !strings.Contains(ex, method) {
				t.Errorf("%s, the first clause to call %s, was reported %q; want it given up as hung in %s", cl.Name, method, ex, method)
			}
		default:
			calling++
			if c.OK() || !strings.Contains(ex, "not run") || !strings.Contains(ex, hungIn) || !strings.Contains(ex, method) {
				t.Errorf("%s calls %s, which hung in %s, and was reported %q; want it not run to its end, naming %s and the clause", cl.Name, method, hungIn, ex, method)
			}
		}
	}
	if calling < 2 || calling == len(calls) {
		t.Fatalf("%d of %d clauses call %s; the test wants some that do and some that do not", calling, len(calls), method)
	}
}
