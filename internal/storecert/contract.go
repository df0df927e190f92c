package storecert

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemtest"
	"github.com/archlab/idempotency/internal/verdict"
)

// A store that hangs (a call that neither returns nor honours its ctx)
// would hold the contract phase for a clause timeout per clause, over an
// hour for every clause. Once a clause has used its whole timeout, the
// store has shown it hangs, and waiting a minute again tells nothing new:
//
//   - A method with a call of that clause still running hangGrace after
//     the clause was given up is hung. A later clause's call of it is
//     refused at once (an error wrapping ErrUnavailable), and a clause that
//     was refused a call fails as not run to its end, naming the method
//     and the clause it hung in. Clauses that do not call it run as
//     before.
//   - Once maxHungClauses clauses have used their whole timeout (a store
//     may hang in several methods, or be too slow to finish a clause), the
//     remaining clauses fail as not run, naming those clauses.
//
// So the contract phase waits at most maxHungClauses times
// (clauseTimeout+hangGrace) on a store that hangs, and a clause that ends
// within its timeout, however slowly, counts for nothing here.
const (
	maxHungClauses = 2
	hangGrace      = time.Second
)

// contract runs the contract's clauses on a live store, stopping waiting
// on one that hangs.
type contract struct {
	timeout time.Duration
	// hung is each method that hung, with the first clause it hung in.
	hung map[string]string
	// waited are the clauses that used their whole timeout.
	waited []string
}

// clauseRun is what one clause did on the store.
type clauseRun struct {
	err error
	// notRun: the clause was not run, because of the clauses in waited.
	notRun bool
	// timedOut: the clause used its whole timeout.
	timedOut bool
	// stuck are the methods with calls of the clause still running
	// hangGrace after it was given up.
	stuck []string
	// refused are the methods the clause called that had hung before.
	refused []string
}

// stopped reports whether enough clauses have hung to run no more.
func (k *contract) stopped() bool { return len(k.waited) >= maxHungClauses }

// run checks cl on s, unless the contract has stopped. It only reads k, so
// clauses may run in parallel; record then takes the result in.
func (k *contract) run(ctx context.Context, cl idemtest.Clause, s idempotency.Store) clauseRun {
	if k.stopped() {
		return clauseRun{notRun: true}
	}
	cs := &clauseStore{inner: s, hung: maps.Clone(k.hung), inFlight: map[string]int{}, changed: make(chan struct{})}
	var store idempotency.Store = cs
	if _, ok := s.(sweeper); ok {
		// Keep the store's Sweep visible to the clauses that use one.
		store = sweepingClauseStore{cs}
	}
	cctx, cancel := context.WithTimeout(ctx, k.timeout)
	defer cancel()
	r := clauseRun{err: cl.Check(cctx, store)}
	// Only the clause's own deadline: a run cut short by ctx is not the
	// store's doing.
	r.timedOut = ctx.Err() == nil && errors.Is(cctx.Err(), context.DeadlineExceeded)
	if r.timedOut {
		r.stuck = cs.drain(hangGrace)
	}
	r.refused = cs.refusedMethods()
	return r
}

// record puts r, the run of cl, in rep and in k.
func (k *contract) record(rep *verdict.Report, cl idemtest.Clause, r clauseRun) bool {
	name := "contract: " + cl.Name
	switch {
	case r.notRun:
		rep.Fail(name, "%s: not run: the store hung in clauses %s, and each would wait %v", cl.Name, strings.Join(k.waited, " and "), k.timeout)
		return false
	case r.timedOut:
		k.waited = append(k.waited, cl.Name)
		for _, m := range r.stuck {
			if _, ok := k.hung[m]; !ok {
				k.hung[m] = cl.Name
			}
		}
		if len(r.stuck) == 0 {
			rep.Fail(name, "%v (the clause did not end within %v)", r.err, k.timeout)
		} else {
			rep.Fail(name, "%v (the store hung: its %s had not returned %v after the clause was given up)",
				r.err, strings.Join(r.stuck, " and "), hangGrace)
		}
		return false
	case len(r.refused) > 0:
		var where []string
		for _, m := range r.refused {
			where = append(where, fmt.Sprintf("%s, which hung in clause %s", m, k.hung[m]))
		}
		rep.Fail(name, "%s: not run to its end: it calls %s", cl.Name, strings.Join(where, ", and "))
		return false
	}
	return rep.Check(name, r.err == nil, "%v", r.err)
}

// sweeper is the optional Sweep that idemtest's clauses look for.
type sweeper interface {
	Sweep(ctx context.Context, now time.Time, limit int) (int, error)
}

// clauseStore is the store as one clause sees it: it counts the clause's
// calls in flight by method, and refuses at once a call of a method that
// hung before.
type clauseStore struct {
	inner idempotency.Store
	// hung is read-only: a clause that was given up may still call.
	hung map[string]string

	mu       sync.Mutex
	inFlight map[string]int
	refused  []string
	// changed is closed, and replaced, when a call returns.
	changed chan struct{}
}

// enter starts a call of method, or refuses it.
func (s *clauseStore) enter(method string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if clause, ok := s.hung[method]; ok {
		if !slices.Contains(s.refused, method) {
			s.refused = append(s.refused, method)
		}
		return fmt.Errorf("storecert: %s not called: it hung in clause %s: %w", method, clause, idempotency.ErrUnavailable)
	}
	s.inFlight[method]++
	return nil
}

// exit ends a call of method, however it ended (deferred: a panic too).
func (s *clauseStore) exit(method string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inFlight[method]--
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *clauseStore) refusedMethods() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.refused)
}

// drain waits up to grace for the calls in flight to return, and returns
// the methods of those that did not, sorted.
func (s *clauseStore) drain(grace time.Duration) []string {
	timer := time.NewTimer(grace)
	defer timer.Stop()
	for {
		s.mu.Lock()
		var stuck []string
		for m, n := range s.inFlight {
			if n > 0 {
				stuck = append(stuck, m)
			}
		}
		changed := s.changed
		s.mu.Unlock()
		slices.Sort(stuck)
		if len(stuck) == 0 {
			return nil
		}
		select {
		case <-changed:
		case <-timer.C:
			return stuck
		}
	}
}

var _ idempotency.Store = (*clauseStore)(nil)

func (s *clauseStore) Begin(ctx context.Context, key, fp string, now time.Time, lease, retention time.Duration) (idempotency.Record, bool, error) {
	if err := s.enter("Begin"); err != nil {
		return idempotency.Record{}, false, err
	}
	defer s.exit("Begin")
	return s.inner.Begin(ctx, key, fp, now, lease, retention)
}

func (s *clauseStore) Complete(ctx context.Context, key string, token uint64, resp idempotency.Response, now time.Time, retention time.Duration) error {
	if err := s.enter("Complete"); err != nil {
		return err
	}
	defer s.exit("Complete")
	return s.inner.Complete(ctx, key, token, resp, now, retention)
}

func (s *clauseStore) Extend(ctx context.Context, key string, token uint64, now time.Time, lease time.Duration) error {
	if err := s.enter("Extend"); err != nil {
		return err
	}
	defer s.exit("Extend")
	return s.inner.Extend(ctx, key, token, now, lease)
}

func (s *clauseStore) Release(ctx context.Context, key string, token uint64) error {
	if err := s.enter("Release"); err != nil {
		return err
	}
	defer s.exit("Release")
	return s.inner.Release(ctx, key, token)
}

func (s *clauseStore) Get(ctx context.Context, key string, now time.Time) (idempotency.Record, error) {
	if err := s.enter("Get"); err != nil {
		return idempotency.Record{}, err
	}
	defer s.exit("Get")
	return s.inner.Get(ctx, key, now)
}

func (s *clauseStore) Delete(ctx context.Context, key string) error {
	if err := s.enter("Delete"); err != nil {
		return err
	}
	defer s.exit("Delete")
	return s.inner.Delete(ctx, key)
}

// sweepingClauseStore is a clauseStore over a store with a Sweep.
type sweepingClauseStore struct{ *clauseStore }

func (s sweepingClauseStore) Sweep(ctx context.Context, now time.Time, limit int) (int, error) {
	if err := s.enter("Sweep"); err != nil {
		return 0, err
	}
	defer s.exit("Sweep")
	return s.inner.(sweeper).Sweep(ctx, now, limit)
}
