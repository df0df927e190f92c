package idemtest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemtest"
)

// moreMutants break the clauses no mutant of mutants_test.go,
// contract_gaps_test.go or idemtest_test.go made fail: each must fail the
// clause named with it, so that every clause of the suite is shown able to
// fail.
var moreMutants = []struct {
	name   string
	clause string
	store  func() idempotency.Store
}{
	{"claim-window-is-lease", "Begin/absent-creates-claim", lapsed("claim-window-is-lease")},
	{"done-keeps-lease", "Complete/stores-result", ref("done-keeps-lease")},
	{"complete-judges-lease", "Complete/after-lease-without-takeover", lapsed("complete-judges-lease")},
	{"extend-judges-lease", "Extend/after-lease-without-takeover", lapsed("extend-judges-lease")},
	{"complete-upserts-absent", "Fencing/absent-key-rejected", lapsed("complete-upserts-absent")},
	{"complete-ignores-cancel", "Context/canceled-complete", lapsed("complete-ignores-cancel")},
	{"extend-ignores-cancel", "Context/canceled-extend", lapsed("extend-ignores-cancel")},
	{"release-ignores-cancel", "Context/canceled-release", lapsed("release-ignores-cancel")},
	{"get-ignores-cancel", "Context/canceled-get", lapsed("get-ignores-cancel")},
	{"delete-ignores-cancel", "Context/canceled-delete", lapsed("delete-ignores-cancel")},
	{"get-absent-zero-record", "Get/absent-not-found", lapsed("get-absent-zero-record")},
	{"get-done-without-response", "Get/done", lapsed("get-done-without-response")},
	{"delete-absent-not-found", "Delete/absent-ok", lapsed("delete-absent-not-found")},
	{"release-does-nothing", "Guard/retryable-releases", lapsed("release-does-nothing")},
	{"replay-by-fingerprint", "Concurrency/distinct-keys-64", lapsed("replay-by-fingerprint")},
}

func TestSuiteKillsMoreMutants(t *testing.T) {
	clauses := idemtest.Clauses()
	for _, m := range moreMutants {
		t.Run(m.name, func(t *testing.T) {
			var failed []string
			found := false
			for _, c := range clauses {
				found = found || c.Name == m.clause
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				err := c.Check(ctx, m.store())
				cancel()
				if err != nil {
					failed = append(failed, c.Name)
				}
			}
			if !found {
				t.Fatalf("the suite has no clause %s (failing clauses: %v)", m.clause, failed)
			}
			t.Logf("mutant %q fails %v", m.name, failed)
			if !slices.Contains(failed, m.clause) {
				t.Fatalf("clause %s passed mutant %q (failing clauses: %v)", m.clause, m.name, failed)
			}
		})
	}
}

// TestLapseWrapperPasses: the wrapper without a bug is the MemoryStore.
func TestLapseWrapperPasses(t *testing.T) {
	for _, c := range idemtest.Clauses() {
		if err := c.Check(context.Background(), lapsed("")()); err != nil {
			t.Errorf("%s on the wrapper without a bug: %v", c.Name, err)
		}
	}
}

// lapse is a MemoryStore that lapses in the way its bug names.
type lapse struct {
	inner idempotency.Store
	bug   string

	mu sync.Mutex
	// fps holds the fingerprint of each claim, and byFP the last result
	// stored per fingerprint (replay-by-fingerprint: a replay cache keyed
	// by the request's fingerprint instead of the key).
	fps  map[claimID]string
	byFP map[string]idempotency.Response
}

var _ idempotency.Store = (*lapse)(nil)

func lapsed(bug string) func() idempotency.Store {
	return func() idempotency.Store {
		return &lapse{inner: idempotency.NewMemoryStore(), bug: bug, fps: map[claimID]string{}, byFP: map[string]idempotency.Response{}}
	}
}

// ignoring returns ctx without its cancellation if the bug is op's.
func (l *lapse) ignoring(ctx context.Context, op string) context.Context {
	if l.bug == op+"-ignores-cancel" {
		return context.WithoutCancel(ctx)
	}
	return ctx
}

// pastLease reports whether key's live record is a claim whose lease ran
// out by now.
func (l *lapse) pastLease(ctx context.Context, key string, now time.Time) bool {
	rec, err := l.inner.Get(ctx, key, now)
	return err == nil && rec.State == idempotency.Processing && !now.Before(rec.LeaseUntil)
}

func (l *lapse) cached(rec idempotency.Record) idempotency.Record {
	if l.bug == "replay-by-fingerprint" && rec.State == idempotency.Done {
		l.mu.Lock()
		if resp, ok := l.byFP[rec.Fingerprint]; ok {
			rec.Response = resp
		}
		l.mu.Unlock()
	}
	return rec
}

func (l *lapse) Begin(ctx context.Context, key, fp string, now time.Time, lease, retention time.Duration) (idempotency.Record, bool, error) {
	if l.bug == "claim-window-is-lease" {
		retention = lease // the window of a new claim is its lease
	}
	rec, ok, err := l.inner.Begin(ctx, key, fp, now, lease, retention)
	if err == nil && ok {
		l.mu.Lock()
		l.fps[claimID{key, rec.Token}] = fp
		l.mu.Unlock()
	}
	return l.cached(rec), ok, err
}

func (l *lapse) Complete(ctx context.Context, key string, token uint64, resp idempotency.Response, now time.Time, retention time.Duration) error {
	ctx = l.ignoring(ctx, "complete")
	if l.bug == "complete-judges-lease" && l.pastLease(ctx, key, now) {
		return fmt.Errorf("lapse: %q: lease over: %w", key, idempotency.ErrLeaseLost)
	}
	err := l.inner.Complete(ctx, key, token, resp, now, retention)
	if l.bug == "complete-upserts-absent" && errors.Is(err, idempotency.ErrLeaseLost) {
		if _, gerr := l.inner.Get(ctx, key, now); errors.Is(gerr, idempotency.ErrNotFound) {
			// An UPSERT: no row to check the token against, so the
			// result is written as a new one.
			rec, ok, berr := l.inner.Begin(ctx, key, "", now, retention, retention)
			if berr != nil || !ok {
				return err
			}
			return l.inner.Complete(ctx, key, rec.Token, resp, now, retention)
		}
	}
	if err == nil && l.bug == "replay-by-fingerprint" {
		l.mu.Lock()
		l.byFP[l.fps[claimID{key, token}]] = resp
		l.mu.Unlock()
	}
	return err
}

func (l *lapse) Extend(ctx context.Context, key string, token uint64, now time.Time, lease time.Duration) error {
	ctx = l.ignoring(ctx, "extend")
	if l.bug == "extend-judges-lease" && l.pastLease(ctx, key, now) {
		return fmt.Errorf("lapse: %q: lease over: %w", key, idempotency.ErrLeaseLost)
	}
	return l.inner.Extend(ctx, key, token, now, lease)
}

func (l *lapse) Release(ctx context.Context, key string, token uint64) error {
	if l.bug == "release-does-nothing" {
		return nil
	}
	return l.inner.Release(l.ignoring(ctx, "release"), key, token)
}

func (l *lapse) Get(ctx context.Context, key string, now time.Time) (idempotency.Record, error) {
	rec, err := l.inner.Get(l.ignoring(ctx, "get"), key, now)
	switch {
	case l.bug == "get-absent-zero-record" && errors.Is(err, idempotency.ErrNotFound):
		return idempotency.Record{}, nil
	case err != nil:
		return rec, err
	case l.bug == "get-done-without-response" && rec.State == idempotency.Done:
		rec.Response = idempotency.Response{}
	}
	return l.cached(rec), nil
}

func (l *lapse) Delete(ctx context.Context, key string) error {
	ctx = l.ignoring(ctx, "delete")
	if l.bug == "delete-absent-not-found" {
		// Delete has no now; the suite's records live for an hour around
		// the wall clock.
		if _, err := l.inner.Get(ctx, key, time.Now()); err != nil {
			return err
		}
	}
	return l.inner.Delete(ctx, key)
}
