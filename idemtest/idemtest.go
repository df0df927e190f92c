// Package idemtest is the conformance suite of idempotency.Store: every
// store of this module runs it in a short TestConformance, and so should a
// third-party store.
//
//	func TestConformance(t *testing.T) {
//		idemtest.Run(t, idemtest.Harness{
//			New:    func(t *testing.T) idempotency.Store { return newStore(t) },
//			Broken: func(t *testing.T) idempotency.Store { return storeOfDeadServer(t) },
//		})
//	}
//
// Each subtest is named after the clause of the Store contract it checks
// (Begin/processing-past-lease-takes-over, Fencing/stale-complete-rejected,
// ...) and its failure messages name that clause, so a failing engine reads
// the contract in store.go to see what it owes.
//
// Time. The suite moves time only through the now arguments: it starts
// near time.Now(), truncated to the millisecond, and jumps forward by up to
// hours without sleeping. A store must therefore judge leases and expiry by
// the now it is given (stored times compared with it); a server-side TTL
// may only collect garbage. Times are compared with a tolerance of one
// millisecond, so engines may store milliseconds.
//
// Sweep. A store with a method Sweep(ctx, now time.Time, limit int) (int,
// error) that collects expired records (boltstore, pgstore) has it called
// by the clauses that check tokens across collection, with now the time
// the clause began: it removes only records that have expired by the wall
// clock too. Without one, those clauses check the rest.
//
// Outside of go test. Clauses and UnavailableClauses return the same
// clauses for Clause.Check, which reports failures as an error instead of
// failing a testing.T (as testing/fstest.TestFS does): idemcheck -store
// certifies a live store with them.
//
// Isolation. New is called once per subtest and must return a store with a
// fresh namespace, but every subtest also uses keys of its own, so a
// harness that hands out one shared store works too. Subtests do not run in
// parallel, except those of Unavailable, which wait on a dead backend.
package idemtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// Harness tells Run how to build the stores under test.
type Harness struct {
	// New returns a fresh store (a fresh namespace of a shared backend will
	// do) for one subtest. Required. Register cleanup with t.Cleanup.
	New func(t *testing.T) idempotency.Store
	// Broken returns a store whose backend cannot be reached (a closed
	// port, a closed database). Optional: without it the Unavailable
	// clauses are skipped.
	Broken func(t *testing.T) idempotency.Store
}

// TestStore runs the conformance suite on the stores newStore returns. It
// is Run without the Unavailable clauses.
func TestStore(t *testing.T, newStore func(t *testing.T) idempotency.Store) {
	t.Helper()
	Run(t, Harness{New: newStore})
}

// The suite's durations. Lease and retention are long enough that a slow
// engine cannot run out of them by the wall clock, which the suite never
// relies on anyway.
const (
	lease     = 10 * time.Second
	retention = time.Hour
	// tolerance is how far a stored time may be from the one asked for.
	tolerance = time.Millisecond
	// hangLimit bounds one call on a broken store. It is a guard against
	// hangs, not a performance goal.
	hangLimit = 10 * time.Second
)

type clause struct {
	name string
	fn   func(e *env)
}

type group struct {
	name    string
	clauses []clause
}

// Run runs the conformance suite described by h.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil {
		t.Fatal("idemtest: Harness.New is nil")
	}
	for _, g := range groups() {
		t.Run(g.name, func(t *testing.T) {
			for _, c := range g.clauses {
				t.Run(c.name, func(t *testing.T) {
					c.fn(newEnv(t, g.name+"/"+c.name, h.New(t)))
				})
			}
		})
	}
	t.Run("Unavailable", func(t *testing.T) {
		if h.Broken == nil {
			t.Skip("idemtest: no Harness.Broken; the Unavailable clauses are not checked")
		}
		for _, c := range unavailableClauses {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				c.fn(newEnv(t, "Unavailable/"+c.name, h.Broken(t)))
			})
		}
	})
}

func groups() []group {
	return []group{
		{"Begin", beginClauses},
		{"Conflict", conflictClauses},
		{"Concurrency", concurrencyClauses},
		{"Fencing", fencingClauses},
		{"Complete", completeClauses},
		{"Extend", extendClauses},
		{"Release", releaseClauses},
		{"Get", getClauses},
		{"Delete", deleteClauses},
		{"Copies", copyClauses},
		{"Context", contextClauses},
		{"Keys", keyClauses},
		{"Body", bodyClauses},
		{"Guard", guardClauses},
	}
}

// runID keeps the keys of one test process apart from those of another
// using the same backend.
var runID = func() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}()

var keySeq atomic.Uint64

// env is one clause's view: where its failures go, its store, its clause, a
// base time.
type env struct {
	t      TB
	clause string
	s      idempotency.Store
	ctx    context.Context
	t0     time.Time
}

func newEnv(t TB, clause string, s idempotency.Store) *env {
	t.Helper()
	if s == nil {
		t.Fatalf("%s: the harness returned a nil store", clause)
	}
	return &env{t: t, clause: clause, s: s, ctx: context.Background(),
		t0: time.Now().Truncate(time.Millisecond)}
}

// key returns a key no other subtest, run or process uses.
func (e *env) key(name string) string {
	return fmt.Sprintf("idemtest:%s:%d:%s", runID, keySeq.Add(1), name)
}

func (e *env) at(d time.Duration) time.Time { return e.t0.Add(d) }

func (e *env) fatalf(format string, args ...any) {
	e.t.Helper()
	e.t.Fatalf("%s: "+format, append([]any{e.clause}, args...)...)
}

func (e *env) errorf(format string, args ...any) {
	e.t.Helper()
	e.t.Errorf("%s: "+format, append([]any{e.clause}, args...)...)
}

func (e *env) begin(key, fp string, now time.Time) (idempotency.Record, bool) {
	e.t.Helper()
	rec, ok, err := e.s.Begin(e.ctx, key, fp, now, lease, retention)
	if err != nil {
		e.fatalf("Begin(%q, %q): unexpected error: %v", key, fp, err)
	}
	return rec, ok
}

// claim begins key and requires a new claim with a fresh token.
func (e *env) claim(key, fp string, now time.Time) idempotency.Record {
	e.t.Helper()
	rec, ok := e.begin(key, fp, now)
	if !ok {
		e.fatalf("Begin(%q, %q) at %v: claimed = false (record %+v), want a new claim", key, fp, now, rec)
	}
	if rec.State != idempotency.Processing {
		e.fatalf("Begin(%q) claimed with State %q, want %q", key, rec.State, idempotency.Processing)
	}
	if rec.Token == 0 {
		e.fatalf("Begin(%q) claimed with Token 0; 0 never names a claim", key)
	}
	return rec
}

func (e *env) complete(key string, token uint64, resp idempotency.Response, now time.Time) {
	e.t.Helper()
	if err := e.s.Complete(e.ctx, key, token, resp, now, retention); err != nil {
		e.fatalf("Complete(%q, token %d): unexpected error: %v", key, token, err)
	}
}

func (e *env) get(key string, now time.Time) idempotency.Record {
	e.t.Helper()
	rec, err := e.s.Get(e.ctx, key, now)
	if err != nil {
		e.fatalf("Get(%q): unexpected error: %v", key, err)
	}
	return rec
}

func (e *env) wantNotFound(key string, now time.Time) {
	e.t.Helper()
	rec, err := e.s.Get(e.ctx, key, now)
	if !errors.Is(err, idempotency.ErrNotFound) {
		e.fatalf("Get(%q) = %+v, %v; want an error wrapping ErrNotFound", key, rec, err)
	}
}

func (e *env) wantLeaseLost(op string, err error) {
	e.t.Helper()
	if !errors.Is(err, idempotency.ErrLeaseLost) {
		e.fatalf("%s = %v, want an error wrapping ErrLeaseLost", op, err)
	}
}

func (e *env) wantTime(what string, got, want time.Time) {
	e.t.Helper()
	if d := got.Sub(want); d < -tolerance || d > tolerance {
		e.errorf("%s = %v, want %v (±%v)", what, got, want, tolerance)
	}
}

// wantState checks the fields of rec that the contract fixes.
func (e *env) wantState(what string, rec idempotency.Record, state idempotency.State, fp string, token uint64) {
	e.t.Helper()
	if rec.State != state || rec.Fingerprint != fp || rec.Token != token {
		e.fatalf("%s: State %q, Fingerprint %q, Token %d; want %q, %q, %d",
			what, rec.State, rec.Fingerprint, rec.Token, state, fp, token)
	}
}

// wantResponse compares responses; nil and empty Body or Header are equal,
// since engines may not tell them apart. Bodies are compared as bytes (a
// structural diff of a megabyte takes seconds).
func (e *env) wantResponse(what string, got, want idempotency.Response) {
	e.t.Helper()
	if !bytes.Equal(got.Body, want.Body) {
		i := 0
		for i < len(got.Body) && i < len(want.Body) && got.Body[i] == want.Body[i] {
			i++
		}
		e.fatalf("%s: Body of %d bytes differs from the %d bytes stored, first at offset %d (got %q, want %q)",
			what, len(got.Body), len(want.Body), i, excerpt(got.Body, i), excerpt(want.Body, i))
	}
	got.Body, want.Body = nil, nil
	if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
		e.fatalf("%s: Response differs (-want +got):\n%s", what, diff)
	}
}

func excerpt(b []byte, at int) []byte {
	return b[min(at, len(b)):min(at+16, len(b))]
}

// unchanged checks that the live record of key is still before.
func (e *env) unchanged(key string, now time.Time, before idempotency.Record) {
	e.t.Helper()
	after := e.get(key, now)
	e.wantState("record after the rejected call", after, before.State, before.Fingerprint, before.Token)
	e.wantTime("LeaseUntil after the rejected call", after.LeaseUntil, before.LeaseUntil)
	e.wantTime("ExpiresAt after the rejected call", after.ExpiresAt, before.ExpiresAt)
	e.wantResponse("record after the rejected call", after.Response, before.Response)
}

func sampleResponse(tag string) idempotency.Response {
	return idempotency.Response{
		Status: 201,
		Header: map[string][]string{
			"Content-Type": {"application/json"},
			"X-Multi":      {"first", "second"},
		},
		Body: []byte(`{"result":"` + tag + `"}`),
	}
}

func shorten(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return strings.ToValidUTF8(s, "?")
}
