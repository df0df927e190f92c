package storecert

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/faultstore"
	"github.com/archlab/idempotency/internal/verdict"
)

// Stores with one defect each, over a MemoryStore.

// extendAlways says yes to every Extend, applying only those of the
// current holder: a holder whose key was taken over goes on renewing.
type extendAlways struct {
	*idempotency.MemoryStore
	stale *atomic.Int64 // stale renewals said yes to
}

func (s extendAlways) Extend(ctx context.Context, key string, token uint64, now time.Time, lease time.Duration) error {
	err := s.MemoryStore.Extend(ctx, key, token, now, lease)
	if errors.Is(err, idempotency.ErrLeaseLost) {
		s.stale.Add(1)
		return nil
	}
	return err
}

// releaseAnyToken releases with any token, as a naive DEL would: a holder
// whose key was taken over wipes its successor's claim, or its result.
type releaseAnyToken struct{ *idempotency.MemoryStore }

func (s releaseAnyToken) Release(ctx context.Context, key string, token uint64) error {
	if err := s.MemoryStore.Release(ctx, key, token); !errors.Is(err, idempotency.ErrLeaseLost) {
		return err
	}
	return s.Delete(ctx, key)
}

// dropsCompletes acknowledges every Complete and keeps one in two: the
// result of the other is lost, and the key is taken over once its lease
// ends (what a store losing its writes on a restart looks like from here).
type dropsCompletes struct {
	*idempotency.MemoryStore
	n *atomic.Int64
}

func (s dropsCompletes) Complete(ctx context.Context, key string, token uint64, resp idempotency.Response, now time.Time, retention time.Duration) error {
	if s.n.Add(1)%2 == 0 {
		return nil
	}
	return s.MemoryStore.Complete(ctx, key, token, resp, now, retention)
}

// staleToken hands out, on a takeover, the token of the claim it took
// over (a cached record), while the store holds the new one.
type staleToken struct {
	*idempotency.MemoryStore
}

func (s staleToken) Begin(ctx context.Context, key, fp string, now time.Time, lease, retention time.Duration) (idempotency.Record, bool, error) {
	old, gerr := s.Get(ctx, key, now)
	rec, ok, err := s.MemoryStore.Begin(ctx, key, fp, now, lease, retention)
	if err == nil && ok && gerr == nil && old.State == idempotency.Processing {
		rec.Token = old.Token
	}
	return rec, ok, err
}

// checkThenSet looks the key up, and if it is free, waits a moment and then
// claims it over whatever is there: two Begins racing both claim.
type checkThenSet struct {
	*idempotency.MemoryStore
}

func (s checkThenSet) Begin(ctx context.Context, key, fp string, now time.Time, lease, retention time.Duration) (idempotency.Record, bool, error) {
	rec, err := s.Get(ctx, key, now)
	free := errors.Is(err, idempotency.ErrNotFound) ||
		(err == nil && rec.State == idempotency.Processing && rec.Fingerprint == fp && !now.Before(rec.LeaseUntil))
	if !free {
		return s.MemoryStore.Begin(ctx, key, fp, now, lease, retention)
	}
	time.Sleep(200 * time.Microsecond) // the gap between the check and the set
	if err := s.Delete(ctx, key); err != nil {
		return idempotency.Record{}, false, err
	}
	return s.MemoryStore.Begin(ctx, key, fp, now, lease, retention)
}

// certifyBroken runs the contract and the campaign on s, with no injected
// faults (the worker mix alone), and returns the report.
func certifyBroken(t *testing.T, desc string, s idempotency.Store) *verdict.Report {
	t.Helper()
	tgt := &target{desc: desc, contract: s,
		campaign: func(_ context.Context, seed int64) (*faulty, error) {
			f := injected(s, nopCloser{}, seed, false)
			f.phases = nil
			return f, nil
		}}
	opts, progress := testOptions()
	rep := verdict.New()
	if err := certify(context.Background(), tgt, opts, rep); err != nil {
		t.Fatal(err)
	}
	t.Logf("seed %d:\n%s\nprogress:\n%s", opts.Seed, report(rep), progress)
	return rep
}

func TestBrokenStores(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store func(*idempotency.MemoryStore) idempotency.Store
	}{
		{"extend always succeeds", func(m *idempotency.MemoryStore) idempotency.Store { return extendAlways{m, new(atomic.Int64)} }},
		{"stale token on takeover", func(m *idempotency.MemoryStore) idempotency.Store { return staleToken{m} }},
		{"check-then-set Begin", func(m *idempotency.MemoryStore) idempotency.Store { return checkThenSet{m} }},
		{"acknowledged Completes lost", func(m *idempotency.MemoryStore) idempotency.Store { return dropsCompletes{m, new(atomic.Int64)} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.store(idempotency.NewMemoryStore())
			rep := certifyBroken(t, tc.name, s)
			if e, ok := s.(extendAlways); ok {
				t.Logf("stale renewals accepted: %d", e.stale.Load())
			}
			if rep.OK() {
				t.Fatalf("the report passed a store whose %s", tc.name)
			}
			var contract, campaign []string
			for _, c := range rep.Checks() {
				if c.Skipped != "" || c.OK() {
					continue
				}
				if strings.HasPrefix(c.Name, "campaign: ") {
					campaign = append(campaign, c.Name)
				} else {
					contract = append(contract, c.Name)
				}
			}
			// The contract finds each; the campaign finds them too, most
			// runs (it depends on the interleavings), which is logged only.
			t.Logf("failed contract clauses: %v", contract)
			t.Logf("failed campaign checks: %v", campaign)
			if len(contract) == 0 {
				t.Errorf("no contract clause failed on a store whose %s", tc.name)
			}
		})
	}
}

// For redis:// and postgres:// URLs the contract runs on a second handle
// on the caller's clock, and only the campaign sees the store as the URL
// configures it (the server's clock, by default, where Redis draws tokens
// from its TIME). A fencing defect of that path alone must be found by the
// campaign: here the contract's store is correct, the campaign's is not.
func TestCampaignAloneFindsStaleRenewAndRelease(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store idempotency.Store
	}{
		{"renews for a stale holder", extendAlways{idempotency.NewMemoryStore(), new(atomic.Int64)}},
		{"releases for a stale holder", releaseAnyToken{idempotency.NewMemoryStore()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, progress, seed := certifyUnfaulted(t, "a store that "+tc.name, tc.store, idempotency.NewMemoryStore())
			if rep.OK() {
				t.Errorf("the campaign passed a store that %s (seed %d):\n%s\nprogress:\n%s", tc.name, seed, report(rep), progress)
				return
			}
			t.Logf("seed %d:\n%s", seed, report(rep))
		})
	}
}

// retriesUnavailable sends a write again when it failed with
// ErrUnavailable, as a client with blind retries does: a write whose
// acknowledgement was lost is applied twice, and the second answer (the
// claim found in flight, the result found stored) is the one returned.
type retriesUnavailable struct{ idempotency.Store }

func (s retriesUnavailable) Begin(ctx context.Context, key, fp string, now time.Time, lease, retention time.Duration) (idempotency.Record, bool, error) {
	rec, ok, err := s.Store.Begin(ctx, key, fp, now, lease, retention)
	if errors.Is(err, idempotency.ErrUnavailable) {
		return s.Store.Begin(ctx, key, fp, now, lease, retention)
	}
	return rec, ok, err
}

func (s retriesUnavailable) Complete(ctx context.Context, key string, token uint64, resp idempotency.Response, now time.Time, retention time.Duration) error {
	err := s.Store.Complete(ctx, key, token, resp, now, retention)
	if errors.Is(err, idempotency.ErrUnavailable) {
		return s.Store.Complete(ctx, key, token, resp, now, retention)
	}
	return err
}

// A store whose writes are applied twice when their acknowledgement is
// lost (faultstore's lost-ack fault under a client that retries blindly)
// passes the contract, which injects no faults; the campaign's lost-ack
// phase must find it.
func TestCampaignFindsWritesAppliedTwice(t *testing.T) {
	fs := faultstore.New(idempotency.NewMemoryStore(), nil)
	set := func(inj faultstore.Injector) func() error { return func() error { fs.SetInjector(inj); return nil } }
	tgt := &target{desc: "a store retrying writes whose acknowledgement was lost", contract: idempotency.NewMemoryStore(),
		campaign: func(_ context.Context, seed int64) (*faulty, error) {
			return &faulty{store: retriesUnavailable{fs}, heal: set(nil), close: func() {}, phases: []phase{
				{"lost acknowledgements (applied)", set(faultstore.Random(uint64(seed), 0.3, faultstore.LostAck(nil)))},
			}}, nil
		}}
	opts, progress := testOptions()
	rep := verdict.New()
	if err := certify(context.Background(), tgt, opts, rep); err != nil {
		t.Fatal(err)
	}
	if rep.OK() || fs.Injected(faultstore.OpBegin) == 0 {
		t.Fatalf("the campaign passed a store that applies writes twice (%d lost Begin acknowledgements; seed %d):\n%s\nprogress:\n%s",
			fs.Injected(faultstore.OpBegin), opts.Seed, report(rep), progress)
	}
	t.Logf("seed %d:\n%s", opts.Seed, report(rep))
}
