package idemtest

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// canceled returns a context that is already done.
func canceled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

func (e *env) wantCanceled(op string, err error) {
	e.t.Helper()
	if !errors.Is(err, context.Canceled) {
		e.fatalf("%s with a cancelled ctx = %v, want an error wrapping context.Canceled", op, err)
	}
}

var contextClauses = []clause{
	{"canceled-begin", func(e *env) {
		k := e.key("ctx-begin")
		_, _, err := e.s.Begin(canceled(), k, "fp", e.at(0), lease, retention)
		e.wantCanceled("Begin", err)
		e.wantNotFound(k, e.at(0))
		// Nor does a cancelled Begin take over an expired lease.
		rec := e.claim(k, "fp", e.at(0))
		_, _, err = e.s.Begin(canceled(), k, "fp", e.at(lease), lease, retention)
		e.wantCanceled("Begin past the lease", err)
		e.unchanged(k, e.at(lease), rec)
		// Nor does it answer, though the answer needs no write (a replay
		// cache, a read-only path): in flight, a replay, a conflict.
		ans, _, err := e.s.Begin(canceled(), k, "fp", e.at(1), lease, retention)
		e.wantCanceled(fmt.Sprintf("Begin of a key in flight (answered %+v)", ans), err)
		e.complete(k, rec.Token, sampleResponse("done"), e.at(1))
		ans, _, err = e.s.Begin(canceled(), k, "fp", e.at(2), lease, retention)
		e.wantCanceled(fmt.Sprintf("Begin of a Done key (answered State %q)", ans.State), err)
		ans, _, err = e.s.Begin(canceled(), k, "other", e.at(2), lease, retention)
		e.wantCanceled(fmt.Sprintf("Begin with another fingerprint (answered State %q)", ans.State), err)
	}},
	{"canceled-complete", func(e *env) {
		k := e.key("ctx-complete")
		rec := e.claim(k, "fp", e.at(0))
		e.wantCanceled("Complete", e.s.Complete(canceled(), k, rec.Token, sampleResponse("x"), e.at(1), retention))
		e.unchanged(k, e.at(1), rec)
		e.complete(k, rec.Token, sampleResponse("y"), e.at(1)) // the claim is intact
	}},
	{"canceled-extend", func(e *env) {
		k := e.key("ctx-extend")
		rec := e.claim(k, "fp", e.at(0))
		e.wantCanceled("Extend", e.s.Extend(canceled(), k, rec.Token, e.at(lease/2), lease))
		e.unchanged(k, e.at(lease/2), rec)
	}},
	{"canceled-release", func(e *env) {
		k := e.key("ctx-release")
		rec := e.claim(k, "fp", e.at(0))
		e.wantCanceled("Release", e.s.Release(canceled(), k, rec.Token))
		e.unchanged(k, e.at(1), rec)
	}},
	{"canceled-get", func(e *env) {
		k := e.key("ctx-get")
		e.claim(k, "fp", e.at(0))
		_, err := e.s.Get(canceled(), k, e.at(1))
		e.wantCanceled("Get", err)
	}},
	{"deadline-exceeded", func(e *env) {
		// A ctx whose deadline passed is done as surely as a cancelled one:
		// every method returns its error and changes nothing.
		k := e.key("ctx-deadline")
		expired, cancel := context.WithDeadline(context.Background(), time.Unix(0, 0))
		defer cancel()
		wantDeadline := func(op string, err error) {
			e.t.Helper()
			if !errors.Is(err, context.DeadlineExceeded) {
				e.fatalf("%s with a ctx past its deadline = %v, want an error wrapping context.DeadlineExceeded", op, err)
			}
		}
		_, _, err := e.s.Begin(expired, k, "fp", e.at(0), lease, retention)
		wantDeadline("Begin", err)
		e.wantNotFound(k, e.at(0))
		rec := e.claim(k, "fp", e.at(0))
		now := e.at(lease / 2)
		wantDeadline("Complete", e.s.Complete(expired, k, rec.Token, sampleResponse("x"), now, retention))
		wantDeadline("Extend", e.s.Extend(expired, k, rec.Token, now, lease))
		wantDeadline("Release", e.s.Release(expired, k, rec.Token))
		wantDeadline("Delete", e.s.Delete(expired, k))
		_, err = e.s.Get(expired, k, now)
		wantDeadline("Get", err)
		e.unchanged(k, now, rec)
	}},
	{"canceled-delete", func(e *env) {
		k := e.key("ctx-delete")
		rec := e.claim(k, "fp", e.at(0))
		e.wantCanceled("Delete", e.s.Delete(canceled(), k))
		e.unchanged(k, e.at(1), rec)
	}},
}
