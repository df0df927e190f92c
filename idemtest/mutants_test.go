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

// mutants are Stores that each break one rule of the Store contract. The
// suite must reject every one of them, and the clause named with it must be
// among the clauses that fail: a suite that cannot fail is worse than none.
// Most are a MemoryStore behind a mutant wrapper; the rest are the
// reference store of contract_gaps_test.go with a switch that the wrapper
// cannot express (how tokens and times are computed inside, atomicity).
var mutants = []struct {
	name   string
	clause string
	store  func() idempotency.Store
}{
	// Begin.
	{"begin-takes-over-live-lease", "Begin/processing-inside-lease-in-flight", wrap("begin-takes-over-live-lease")},
	{"takeover-keeps-token", "Begin/processing-past-lease-takes-over", ref("takeover-keeps-token")},
	{"takeover-window-not-extended", "Begin/takeover-extends-window-to-lease", ref("takeover-window-not-extended")},
	{"begin-ignores-fingerprint-on-done", "Conflict/done", wrap("begin-ignores-fingerprint-on-done")},
	{"expired-done-replays", "Begin/expired-done-creates-claim", ref("expired-done-replays")},
	{"expired-processing-taken-over", "Begin/expired-processing-creates-claim", ref("expired-processing-taken-over")},
	{"replay-without-response", "Begin/done-same-fingerprint-replays", wrap("replay-without-response")},
	{"conflict-past-lease-takes-over", "Conflict/processing-past-lease", wrap("conflict-past-lease-takes-over")},
	{"conflict-answered-in-flight", "Conflict/processing-in-lease", wrap("conflict-answered-in-flight")},
	// Concurrency.
	{"in-flight-told-claimed", "Concurrency/one-claim-of-64", wrap("in-flight-told-claimed")},
	{"create-not-atomic", "Concurrency/one-claim-of-64", ref("create-not-atomic")},
	{"complete-resurrects-deleted", "Concurrency/holder-races-delete", ref("complete-resurrects-deleted")},
	// Fencing, Complete, Extend, Release.
	{"complete-ignores-token", "Fencing/stale-complete-rejected", wrap("complete-ignores-token")},
	{"complete-after-release", "Release/fences-holder", wrap("complete-after-release")},
	{"extend-after-release", "Release/fences-holder", wrap("extend-after-release")},
	{"extend-done-record", "Fencing/done-not-processing-rejected", wrap("extend-done-record")},
	{"extend-ignores-token", "Fencing/stale-extend-rejected", wrap("extend-ignores-token")},
	{"release-removes-done", "Fencing/done-not-processing-rejected", wrap("release-removes-done")},
	{"release-ignores-token", "Fencing/stale-release-rejected", wrap("release-ignores-token")},
	{"release-resets-token", "Fencing/increase-across-release", ref("release-resets-token")},
	{"token-in-record", "Fencing/increase-across-release", ref("token-in-record")},
	// Get and Delete.
	{"get-returns-expired", "Get/expired-not-found", ref("get-returns-expired")},
	{"get-judges-lease", "Get/processing", wrap("get-judges-lease")},
	{"delete-leaves-record", "Delete/processing-fences-holder", wrap("delete-leaves-record")},
	{"delete-leaves-done", "Delete/done-forgets-result", wrap("delete-leaves-done")},
	{"delete-keeps-response", "Delete/done-forgets-result", wrap("delete-keeps-response")},
	// Copies, both ways: the store keeps the caller's memory, or hands its
	// own out.
	{"keeps-caller-body", "Copies/complete-argument", wrap("keeps-caller-body")},
	{"keeps-caller-header-values", "Copies/complete-argument", wrap("keeps-caller-header-values")},
	{"keeps-caller-header-map", "Copies/complete-argument", wrap("keeps-caller-header-map")},
	{"returns-stored-body", "Copies/returned-records", wrap("returns-stored-body")},
	{"returns-stored-header-values", "Copies/returned-records", wrap("returns-stored-header-values")},
	{"returns-stored-header-map", "Copies/returned-records", wrap("returns-stored-header-map")},
	{"replay-returns-stored-body", "Copies/returned-records", wrap("replay-returns-stored-body")},
	// Tokens drawn out of order, or counted anew after a Sweep.
	{"token-drawn-before-lock", "Concurrency/tokens-in-claim-order", ref("token-drawn-before-lock")},
	{"sweep-resets-token", "Fencing/increase-across-sweep", ref("sweep-resets-token")},
	{"sweep-judges-lease", "Fencing/increase-across-sweep", ref("sweep-judges-lease")},
	// Results, keys and fingerprints as bytes.
	{"complete-skips-empty-response", "Body/zero-response", wrap("complete-skips-empty-response")},
	{"keys-valid-utf8", "Keys/invalid-utf8", fold("keys-valid-utf8")},
	{"keys-cut-at-nul", "Keys/nul-byte", fold("keys-cut-at-nul")},
	{"fingerprint-valid-utf8", "Conflict/fingerprint-bytes", fold("fingerprint-valid-utf8")},
	{"fingerprint-cut-at-nul", "Conflict/fingerprint-bytes", fold("fingerprint-cut-at-nul")},
}

func TestSuiteKillsMutants(t *testing.T) {
	clauses := idemtest.Clauses()
	for _, m := range mutants {
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
			if len(failed) == 0 {
				t.Fatalf("the suite passed mutant %q", m.name)
			}
			t.Logf("mutant %q fails %v", m.name, failed)
			if !slices.Contains(failed, m.clause) {
				t.Fatalf("clause %s passed mutant %q (failing clauses: %v)", m.clause, m.name, failed)
			}
		})
	}
}

// TestMutantWrapperPasses: the wrapper without a bug is the MemoryStore,
// so each mutant fails for its bug alone.
func TestMutantWrapperPasses(t *testing.T) {
	for _, c := range idemtest.Clauses() {
		if err := c.Check(context.Background(), wrap("")()); err != nil {
			t.Errorf("%s on the mutant wrapper without a bug: %v", c.Name, err)
		}
	}
}

// mutant breaks a MemoryStore in the way its bug names, mostly by a second
// look at the record before or after the call, as a store that checks one
// condition too few would behave.
type mutant struct {
	inner idempotency.Store
	bug   string

	mu sync.Mutex
	// claims maps key and token to the fingerprint of the claim.
	claims map[claimID]string
	// released holds the claims given back by Release.
	released map[claimID]bool
	// kept holds, per claim, the Response given to Complete (the caller's
	// memory) or the first one handed out, to be handed out again.
	kept map[claimID]idempotency.Response
	// told holds the keys whose in-flight answer was turned into a claim.
	told map[string]bool
	// deleted holds the result of each deleted Done record.
	deleted map[string]idempotency.Response
}

type claimID struct {
	key   string
	token uint64
}

var _ idempotency.Store = (*mutant)(nil)

func wrap(bug string) func() idempotency.Store {
	return func() idempotency.Store {
		return &mutant{inner: idempotency.NewMemoryStore(), bug: bug, claims: map[claimID]string{},
			released: map[claimID]bool{}, kept: map[claimID]idempotency.Response{}, told: map[string]bool{},
			deleted: map[string]idempotency.Response{}}
	}
}

// current returns key's live record, if any.
func (m *mutant) current(ctx context.Context, key string, now time.Time) (idempotency.Record, bool) {
	rec, err := m.inner.Get(ctx, key, now)
	return rec, err == nil
}

func (m *mutant) Begin(ctx context.Context, key, fp string, now time.Time, lease, retention time.Duration) (idempotency.Record, bool, error) {
	rec, ok, err := m.inner.Begin(ctx, key, fp, now, lease, retention)
	if err != nil {
		return rec, ok, err
	}
	switch {
	case m.bug == "begin-takes-over-live-lease" && !ok && rec.State == idempotency.Processing && now.Before(rec.LeaseUntil):
		// Take over at the end of the lease, with a lease that ends where
		// one taken now would.
		rec, ok, err = m.inner.Begin(ctx, key, fp, rec.LeaseUntil, lease-rec.LeaseUntil.Sub(now), retention)
	case m.bug == "begin-ignores-fingerprint-on-done" && rec.State == idempotency.Conflict:
		if cur, live := m.current(ctx, key, now); live && cur.State == idempotency.Done {
			return cur, false, nil
		}
	case m.bug == "conflict-past-lease-takes-over" && rec.State == idempotency.Conflict:
		if cur, live := m.current(ctx, key, now); live && cur.State == idempotency.Processing && !now.Before(cur.LeaseUntil) {
			if err := m.inner.Delete(ctx, key); err != nil {
				return idempotency.Record{}, false, err
			}
			rec, ok, err = m.inner.Begin(ctx, key, fp, now, lease, cur.ExpiresAt.Sub(now))
		}
	case m.bug == "conflict-answered-in-flight" && rec.State == idempotency.Conflict:
		if cur, live := m.current(ctx, key, now); live && cur.State == idempotency.Processing && now.Before(cur.LeaseUntil) {
			return cur, false, nil
		}
	case m.bug == "replay-without-response" && !ok && rec.State == idempotency.Done:
		rec.Response = idempotency.Response{}
	case m.bug == "in-flight-told-claimed" && !ok && rec.State == idempotency.Processing:
		m.mu.Lock()
		first := !m.told[key]
		m.told[key] = true
		m.mu.Unlock()
		if first {
			return rec, true, nil // a second caller is told it holds the claim
		}
	}
	if err == nil && ok {
		m.mu.Lock()
		m.claims[claimID{key, rec.Token}] = fp
		m.mu.Unlock()
	}
	if err == nil && !ok && rec.State == idempotency.Done {
		rec.Response = m.handOut(key, rec, false)
	}
	return rec, ok, err
}

// handOut returns the Response to answer with for rec, a Done record of
// key: its own copy for a correct store, or one sharing memory with the
// caller of Complete (keeps-caller-*) or with earlier answers
// (returns-stored-*: the first answer is kept and handed out again).
func (m *mutant) handOut(key string, rec idempotency.Record, fromGet bool) idempotency.Response {
	m.mu.Lock()
	defer m.mu.Unlock()
	id := claimID{key, rec.Token}
	resp := rec.Response
	kept, ok := m.kept[id]
	switch m.bug {
	case "keeps-caller-body", "keeps-caller-header-values", "keeps-caller-header-map",
		"returns-stored-body", "returns-stored-header-values", "returns-stored-header-map":
	case "replay-returns-stored-body":
		if fromGet {
			return resp // Get copies; only replays share
		}
	default:
		return resp
	}
	if !ok {
		m.kept[id] = resp
		return resp
	}
	switch m.bug {
	case "keeps-caller-body", "returns-stored-body", "replay-returns-stored-body":
		resp.Body = kept.Body
	case "keeps-caller-header-values", "returns-stored-header-values":
		if kept.Header != nil {
			resp.Header = make(map[string][]string, len(kept.Header))
			for k, v := range kept.Header {
				resp.Header[k] = v
			}
		}
	case "keeps-caller-header-map", "returns-stored-header-map":
		resp.Header = kept.Header
	}
	return resp
}

func (m *mutant) Complete(ctx context.Context, key string, token uint64, resp idempotency.Response, now time.Time, retention time.Duration) error {
	if m.bug == "complete-skips-empty-response" && resp.Status == 0 && len(resp.Header) == 0 && len(resp.Body) == 0 {
		// Nothing to write, so nothing is written: the claim stays
		// Processing.
		if _, err := m.inner.Get(ctx, key, now); err != nil {
			return err
		}
		return nil
	}
	if m.bug == "complete-ignores-token" {
		if cur, live := m.current(ctx, key, now); live {
			token = cur.Token
		}
	}
	err := m.inner.Complete(ctx, key, token, resp, now, retention)
	id := claimID{key, token}
	if err == nil {
		switch m.bug {
		case "keeps-caller-body", "keeps-caller-header-values", "keeps-caller-header-map":
			m.mu.Lock()
			m.kept[id] = resp // the caller's memory, to be answered with
			m.mu.Unlock()
		}
		return nil
	}
	m.mu.Lock()
	fp, released := m.claims[id], m.released[id]
	m.mu.Unlock()
	if m.bug == "complete-after-release" && released && errors.Is(err, idempotency.ErrLeaseLost) {
		// The released claim's token is still good for a result, as with
		// a tombstone checked by token alone.
		rec, ok, berr := m.inner.Begin(ctx, key, fp, now, retention, retention)
		if berr != nil || !ok {
			return err
		}
		return m.inner.Complete(ctx, key, rec.Token, resp, now, retention)
	}
	return err
}

func (m *mutant) Extend(ctx context.Context, key string, token uint64, now time.Time, lease time.Duration) error {
	if m.bug == "extend-ignores-token" {
		if cur, live := m.current(ctx, key, now); live && cur.State == idempotency.Processing {
			token = cur.Token
		}
	}
	err := m.inner.Extend(ctx, key, token, now, lease)
	if !errors.Is(err, idempotency.ErrLeaseLost) {
		return err
	}
	switch m.bug {
	case "extend-done-record":
		if cur, live := m.current(ctx, key, now); live && cur.State == idempotency.Done && cur.Token == token {
			return nil
		}
	case "extend-after-release":
		m.mu.Lock()
		released := m.released[claimID{key, token}]
		m.mu.Unlock()
		if released {
			return nil
		}
	}
	return err
}

func (m *mutant) Release(ctx context.Context, key string, token uint64) error {
	if m.bug == "release-ignores-token" {
		if cur, live := m.current(ctx, key, time.Now()); live && cur.State == idempotency.Processing {
			token = cur.Token
		}
	}
	err := m.inner.Release(ctx, key, token)
	if err == nil {
		m.mu.Lock()
		m.released[claimID{key, token}] = true
		m.mu.Unlock()
		return nil
	}
	if m.bug == "release-removes-done" && errors.Is(err, idempotency.ErrLeaseLost) {
		// Release has no now; the suite's records live for an hour around
		// the wall clock.
		if cur, live := m.current(ctx, key, time.Now()); live && cur.State == idempotency.Done && cur.Token == token {
			return m.inner.Delete(ctx, key)
		}
	}
	return err
}

func (m *mutant) Get(ctx context.Context, key string, now time.Time) (idempotency.Record, error) {
	rec, err := m.inner.Get(ctx, key, now)
	if err != nil {
		return rec, err
	}
	if m.bug == "get-judges-lease" && rec.State == idempotency.Processing && !now.Before(rec.LeaseUntil) {
		return idempotency.Record{}, fmt.Errorf("mutant: %q: %w", key, idempotency.ErrNotFound)
	}
	if rec.State == idempotency.Done {
		rec.Response = m.handOut(key, rec, true)
	}
	if m.bug == "delete-keeps-response" && rec.State == idempotency.Processing {
		m.mu.Lock()
		rec.Response = m.deleted[key] // fields the Delete did not clear
		m.mu.Unlock()
	}
	return rec, nil
}

func (m *mutant) Delete(ctx context.Context, key string) error {
	switch m.bug {
	case "delete-leaves-record":
		return ctx.Err()
	case "delete-leaves-done":
		if cur, live := m.current(ctx, key, time.Now()); live && cur.State == idempotency.Done {
			return nil
		}
	case "delete-keeps-response":
		if cur, live := m.current(ctx, key, time.Now()); live && cur.State == idempotency.Done {
			m.mu.Lock()
			m.deleted[key] = cur.Response
			m.mu.Unlock()
		}
	}
	return m.inner.Delete(ctx, key)
}
