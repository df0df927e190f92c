package idemtest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemtest"
)

// contractGapBugs are stores that break one rule of the Store contract each,
// a rule the suite once did not check. Every one must fail the named
// clause (checked in process with Clause.Check).
var contractGapBugs = []struct {
	name   string
	clause string
	store  func() idempotency.Store
}{
	{"extend-shortens-window", "Extend/keeps-window", ref("extend-shortens-window")},
	{"extend-begin-lease", "Extend/uses-its-lease", ref("extend-begin-lease")},
	{"complete-begin-retention", "Complete/uses-its-retention", ref("complete-begin-retention")},
	{"complete-keeps-longer-window", "Complete/uses-its-retention", ref("complete-keeps-longer-window")},
	{"takeover-not-atomic", "Concurrency/one-takeover-of-64",
		ref("takeover-not-atomic")},
	{"reclaim-not-atomic", "Concurrency/one-claim-of-64-after-expiry",
		ref("reclaim-not-atomic")},
	{"fingerprint-truncated", "Conflict/fingerprint-exact", fold("fingerprint-truncated")},
	{"fingerprint-case-folded", "Conflict/fingerprint-exact", fold("fingerprint-case-folded")},
	{"keys-case-folded", "Keys/case", fold("keys-case-folded")},
	{"ignores-deadline", "Context/deadline-exceeded", fold("ignores-deadline")},
	{"release-judges-wall-clock", "Release/after-lease-without-takeover", fold("release-judges-wall-clock")},
	{"conflict-aliases-response", "Copies/conflict-answer", ref("conflict-aliases-response")},
	{"release-not-atomic", "Concurrency/holder-release-races-takeover", ref("release-not-atomic")},
	{"complete-not-atomic", "Concurrency/holder-races-takeover", ref("complete-not-atomic")},
	{"get-collects-token", "Fencing/increase-across-expiry", ref("get-collects-token")},
	{"begin-answers-despite-ctx", "Context/canceled-begin", fold("begin-answers-despite-ctx")},
	{"keys-truncated-at-256", "Keys/scoped-320-bytes", fold("keys-truncated-at-256")},
}

func TestRefStorePasses(t *testing.T) {
	ctx := context.Background()
	// "per-key-tokens" is no bug: the contract asks tokens to increase per
	// key, so counters of their own (kept by Release and Delete) are fine.
	for _, variant := range []string{"", "per-key-tokens"} {
		for _, c := range idemtest.Clauses() {
			if err := c.Check(ctx, newRefStore(variant)); err != nil {
				t.Errorf("%s on the reference store %q: %v", c.Name, variant, err)
			}
		}
	}
}

func TestSuiteCatchesContractGaps(t *testing.T) {
	ctx := context.Background()
	clauses := idemtest.Clauses()
	for _, b := range contractGapBugs {
		t.Run(b.name, func(t *testing.T) {
			var failed []string
			found := false
			for _, c := range clauses {
				if c.Name == b.clause {
					found = true
				}
				if err := c.Check(ctx, b.store()); err != nil {
					failed = append(failed, c.Name)
				}
			}
			if !found {
				t.Fatalf("the suite has no clause %s; it passed a store with bug %q (failing clauses: %v)", b.clause, b.name, failed)
			}
			t.Logf("bug %q fails %v", b.name, failed)
			if !slices.Contains(failed, b.clause) {
				t.Fatalf("clause %s passed a store with bug %q (failing clauses: %v)", b.clause, b.name, failed)
			}
		})
	}
}

// refStore is a small, plainly correct Store (one lock, one map) with
// switches that break it in ways a MemoryStore wrapper cannot express: how
// it computes the times it stores, and whether a takeover is atomic.
type refStore struct {
	bug    string
	mu     sync.Mutex
	recs   map[string]*refRecord
	tokens uint64
	// conflictResp is the Response handed out with Conflict answers, for
	// the "conflict-aliases-response" bug.
	conflictResp map[string]idempotency.Response
	// keyTokens are per-key token counters, for the "per-key-tokens"
	// variant and the "get-collects-token" bug: kept by Release and Delete
	// (a tombstone, as Redis keeps the token field), but with the bug
	// dropped with an expired record that Get collects.
	keyTokens map[string]uint64
	// early is the token counter of the "token-drawn-before-lock" bug,
	// read before the lock is taken.
	early atomic.Uint64
}

type refRecord struct {
	rec       idempotency.Record
	lease     time.Duration // given to the Begin that claimed it
	retention time.Duration
}

func newRefStore(bug string) *refStore {
	return &refStore{bug: bug, recs: map[string]*refRecord{}, conflictResp: map[string]idempotency.Response{},
		keyTokens: map[string]uint64{}}
}

// nextToken returns the token of a new claim of key.
func (s *refStore) nextToken(key string) uint64 {
	switch s.bug {
	case "per-key-tokens", "get-collects-token", "release-resets-token", "sweep-resets-token":
		s.keyTokens[key]++
		return s.keyTokens[key]
	case "token-in-record":
		// The next token is the stored record's plus one: a counter that
		// lives and dies with the record.
		if r := s.recs[key]; r != nil {
			return r.rec.Token + 1
		}
		return 1
	}
	s.tokens++
	return s.tokens
}

func cloneResponse(r idempotency.Response) idempotency.Response {
	out := idempotency.Response{Status: r.Status, Body: slices.Clone(r.Body)}
	if r.Header != nil {
		out.Header = make(map[string][]string, len(r.Header))
		for k, v := range r.Header {
			out.Header[k] = slices.Clone(v)
		}
	}
	return out
}

func cloneRecord(r idempotency.Record) idempotency.Record {
	r.Response = cloneResponse(r.Response)
	return r
}

func laterOf(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (s *refStore) live(key string, now time.Time) *refRecord {
	r := s.recs[key]
	if r == nil || !now.Before(r.rec.ExpiresAt) {
		return nil
	}
	return r
}

func (s *refStore) Begin(ctx context.Context, key, fp string, now time.Time, lease, retention time.Duration) (idempotency.Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return idempotency.Record{}, false, err
	}
	var drawn uint64
	if s.bug == "token-drawn-before-lock" {
		// As a sequence read before the row lock: the token may be
		// smaller than that of a claim made meanwhile.
		drawn = s.early.Add(1)
		if drawn%2 == 1 {
			time.Sleep(100 * time.Microsecond) // a slow claimer
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if drawn != 0 {
		s.tokens = drawn - 1
	}
	old := s.recs[key]
	if (s.bug == "reclaim-not-atomic" && old != nil && s.live(key, now) == nil) ||
		(s.bug == "create-not-atomic" && old == nil) {
		// An expired (or no) record is found, then overwritten without
		// checking that nobody (re-)created it in between.
		s.mu.Unlock()
		time.Sleep(time.Millisecond)
		s.mu.Lock()
		r := &refRecord{lease: lease, retention: retention, rec: idempotency.Record{Fingerprint: fp,
			State: idempotency.Processing, Token: s.nextToken(key), LeaseUntil: now.Add(lease), ExpiresAt: now.Add(retention)}}
		s.recs[key] = r
		return cloneRecord(r.rec), true, nil
	}
	if s.bug == "expired-processing-taken-over" && old != nil && s.live(key, now) == nil &&
		old.rec.State == idempotency.Processing && old.rec.Fingerprint == fp {
		// An expired claim is judged by its lease alone and taken over,
		// keeping its window (extended to the new lease).
		old.rec.Token = s.nextToken(key)
		old.rec.LeaseUntil = now.Add(lease)
		old.rec.ExpiresAt = laterOf(old.rec.ExpiresAt, old.rec.LeaseUntil)
		return cloneRecord(old.rec), true, nil
	}
	if s.bug == "expired-done-replays" && old != nil && old.rec.State == idempotency.Done && old.rec.Fingerprint == fp {
		// The fingerprint check judges expiry; the replay path does not.
		return cloneRecord(old.rec), false, nil
	}
	r := s.live(key, now)
	switch {
	case r == nil:
		r = &refRecord{lease: lease, retention: retention, rec: idempotency.Record{Fingerprint: fp,
			State: idempotency.Processing, Token: s.nextToken(key), LeaseUntil: now.Add(lease), ExpiresAt: now.Add(retention)}}
		s.recs[key] = r
		return cloneRecord(r.rec), true, nil
	case r.rec.Fingerprint != fp:
		ans := idempotency.Record{State: idempotency.Conflict}
		if s.bug == "conflict-aliases-response" && r.rec.State == idempotency.Done {
			// The stored result rides along with the conflict, shared.
			if _, ok := s.conflictResp[key]; !ok {
				s.conflictResp[key] = r.rec.Response
			}
			ans.Response = s.conflictResp[key]
			r.rec.Response = ans.Response
		}
		return ans, false, nil
	case r.rec.State == idempotency.Done || now.Before(r.rec.LeaseUntil):
		return cloneRecord(r.rec), false, nil
	}
	if s.bug == "takeover-not-atomic" {
		// Read, then write without checking that nobody wrote between.
		s.mu.Unlock()
		time.Sleep(time.Millisecond)
		s.mu.Lock()
		if r.rec.State != idempotency.Processing {
			return cloneRecord(r.rec), false, nil
		}
	}
	if s.bug != "takeover-keeps-token" {
		r.rec.Token = s.nextToken(key)
	}
	r.rec.LeaseUntil = now.Add(lease)
	if s.bug != "takeover-window-not-extended" {
		r.rec.ExpiresAt = laterOf(r.rec.ExpiresAt, r.rec.LeaseUntil)
	}
	return cloneRecord(r.rec), true, nil
}

func (s *refStore) claim(key string, token uint64) (*refRecord, error) {
	r := s.recs[key]
	if r == nil || r.rec.Token != token || r.rec.State != idempotency.Processing {
		return nil, fmt.Errorf("ref: token %d: %w", token, idempotency.ErrLeaseLost)
	}
	return r, nil
}

func (s *refStore) Complete(ctx context.Context, key string, token uint64, resp idempotency.Response, now time.Time, retention time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.claim(key, token)
	if err != nil {
		return err
	}
	if s.bug == "complete-not-atomic" || s.bug == "complete-resurrects-deleted" {
		// The token was checked; the result is written later, over
		// whatever claim holds the key by then, or (resurrects) into the
		// record that was deleted meanwhile.
		s.mu.Unlock()
		time.Sleep(time.Millisecond)
		s.mu.Lock()
		switch cur := s.recs[key]; {
		case s.bug == "complete-resurrects-deleted" && cur == nil:
			s.recs[key] = r
		case s.bug == "complete-resurrects-deleted":
			// A record that is there is checked again; only a deleted
			// one is missed.
			if r, err = s.claim(key, token); err != nil {
				return err
			}
		case cur != nil:
			r = cur
		default:
			return nil
		}
	}
	r.rec.State = idempotency.Done
	r.rec.Response = cloneResponse(resp)
	if s.bug != "done-keeps-lease" {
		r.rec.LeaseUntil = time.Time{}
	}
	switch s.bug {
	case "complete-begin-retention":
		r.rec.ExpiresAt = now.Add(r.retention)
	case "complete-keeps-longer-window":
		r.rec.ExpiresAt = laterOf(r.rec.ExpiresAt, now.Add(retention))
	default:
		r.rec.ExpiresAt = now.Add(retention)
	}
	return nil
}

func (s *refStore) Extend(ctx context.Context, key string, token uint64, now time.Time, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.claim(key, token)
	if err != nil {
		return err
	}
	if s.bug == "extend-begin-lease" {
		lease = r.lease
	}
	r.rec.LeaseUntil = now.Add(lease)
	if s.bug == "extend-shortens-window" {
		r.rec.ExpiresAt = r.rec.LeaseUntil
	} else {
		r.rec.ExpiresAt = laterOf(r.rec.ExpiresAt, r.rec.LeaseUntil)
	}
	return nil
}

func (s *refStore) Release(ctx context.Context, key string, token uint64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.claim(key, token); err != nil {
		return err
	}
	if s.bug == "release-not-atomic" {
		// The token was checked; the record is removed later, whoever
		// holds it by then.
		s.mu.Unlock()
		time.Sleep(time.Millisecond)
		s.mu.Lock()
	}
	delete(s.recs, key)
	if s.bug == "release-resets-token" {
		delete(s.keyTokens, key) // the counter goes with the claim
	}
	return nil
}

func (s *refStore) Get(ctx context.Context, key string, now time.Time) (idempotency.Record, error) {
	if err := ctx.Err(); err != nil {
		return idempotency.Record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.live(key, now)
	if s.bug == "get-returns-expired" {
		r = s.recs[key]
	}
	if r == nil {
		if s.bug == "get-collects-token" && s.recs[key] != nil {
			// The expired record is collected, and its counter with it.
			delete(s.recs, key)
			delete(s.keyTokens, key)
		}
		return idempotency.Record{}, fmt.Errorf("ref: %q: %w", key, idempotency.ErrNotFound)
	}
	return cloneRecord(r.rec), nil
}

// Sweep removes the records that expired at now (the "per-key-tokens"
// counters stay: they are the tombstones).
func (s *refStore) Sweep(ctx context.Context, now time.Time, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k, r := range s.recs {
		expired := !now.Before(r.rec.ExpiresAt)
		if s.bug == "sweep-judges-lease" && r.rec.State == idempotency.Processing {
			expired = !now.Before(r.rec.LeaseUntil)
		}
		if !expired || (limit > 0 && n >= limit) {
			continue
		}
		delete(s.recs, k)
		if s.bug == "sweep-resets-token" {
			delete(s.keyTokens, k) // the counter goes with the record
		}
		n++
	}
	return n, nil
}

func (s *refStore) Delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.recs, key)
	delete(s.conflictResp, key)
	return nil
}

// folding breaks a MemoryStore in what it passes on: keys or fingerprints
// folded, a context judged in part, a wall clock consulted.
type folding struct {
	idempotency.Store
	bug string
}

func (f *folding) key(k string) string {
	switch f.bug {
	case "keys-case-folded":
		return strings.ToLower(k)
	case "keys-truncated-at-256":
		return k[:min(len(k), 256)] // a VARCHAR(256) key
	case "keys-valid-utf8":
		return strings.ToValidUTF8(k, "\uFFFD") // a text column
	case "keys-cut-at-nul":
		return cutAtNUL(k) // a C string
	}
	return k
}

func (f *folding) ctx(ctx context.Context) context.Context {
	if f.bug == "ignores-deadline" && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return context.WithoutCancel(ctx) // only cancellation is noticed
	}
	return ctx
}

func (f *folding) Begin(ctx context.Context, key, fp string, now time.Time, lease, retention time.Duration) (idempotency.Record, bool, error) {
	switch f.bug {
	case "fingerprint-truncated":
		fp = fp[:min(len(fp), 64)] // a CHAR(64) column
	case "fingerprint-case-folded":
		fp = strings.ToLower(fp) // a case-insensitive collation
	case "fingerprint-valid-utf8":
		fp = strings.ToValidUTF8(fp, "\uFFFD")
	case "fingerprint-cut-at-nul":
		fp = cutAtNUL(fp)
	case "begin-answers-despite-ctx":
		if err := ctx.Err(); err != nil {
			// A replay or an in-flight answer is read (from a cache, or
			// on a read-only path) without looking at ctx; only a write
			// does.
			rec, gerr := f.Store.Get(context.WithoutCancel(ctx), f.key(key), now)
			if gerr == nil && rec.Fingerprint == fp && (rec.State == idempotency.Done || now.Before(rec.LeaseUntil)) {
				return rec, false, nil
			}
			return idempotency.Record{}, false, err
		}
	}
	return f.Store.Begin(f.ctx(ctx), f.key(key), fp, now, lease, retention)
}

func (f *folding) Complete(ctx context.Context, key string, token uint64, resp idempotency.Response, now time.Time, retention time.Duration) error {
	return f.Store.Complete(f.ctx(ctx), f.key(key), token, resp, now, retention)
}

func (f *folding) Extend(ctx context.Context, key string, token uint64, now time.Time, lease time.Duration) error {
	return f.Store.Extend(f.ctx(ctx), f.key(key), token, now, lease)
}

func (f *folding) Release(ctx context.Context, key string, token uint64) error {
	if f.bug == "release-judges-wall-clock" {
		// A lease that ran out by the server's clock is treated as lost.
		if rec, err := f.Store.Get(ctx, key, time.Now()); err == nil && !time.Now().Before(rec.LeaseUntil) {
			return fmt.Errorf("folding: release: %w", idempotency.ErrLeaseLost)
		}
	}
	return f.Store.Release(f.ctx(ctx), f.key(key), token)
}

func (f *folding) Get(ctx context.Context, key string, now time.Time) (idempotency.Record, error) {
	return f.Store.Get(f.ctx(ctx), f.key(key), now)
}

func (f *folding) Delete(ctx context.Context, key string) error {
	return f.Store.Delete(f.ctx(ctx), f.key(key))
}

func cutAtNUL(s string) string {
	before, _, _ := strings.Cut(s, "\x00")
	return before
}

// ref and fold make the broken stores of the table: a refStore or a
// folding MemoryStore with the named bug.
func ref(bug string) func() idempotency.Store {
	return func() idempotency.Store { return newRefStore(bug) }
}

func fold(bug string) func() idempotency.Store {
	return func() idempotency.Store { return &folding{Store: idempotency.NewMemoryStore(), bug: bug} }
}
