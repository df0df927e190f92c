package boltstore

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/archlab/idempotency"
)

// callsWithLongKey runs every call of the Store on a key longer than the
// limit and returns their errors by name.
func callsWithLongKey(s *Store) map[string]error {
	long := strings.Repeat("k", maxKeyLen+1)
	errs := map[string]error{}
	_, _, errs["begin"] = s.Begin(ctx, long, "fp", t0, lease, retention)
	errs["complete"] = s.Complete(ctx, long, 1, idempotency.Response{}, t0, retention)
	errs["extend"] = s.Extend(ctx, long, 1, t0, lease)
	errs["release"] = s.Release(ctx, long, 1)
	errs["delete"] = s.Delete(ctx, long)
	_, errs["get"] = s.Get(ctx, long, t0)
	return errs
}

// short cuts an error that may quote a long key.
func short(err error) error {
	if err != nil && len(err.Error()) > 200 {
		return errors.New(err.Error()[:200] + "...")
	}
	return err
}

// TestLongKeyAfterClose: "all calls after Close" wrap ErrUnavailable and
// bbolt.ErrDatabaseNotOpen, those with a key over the limit too.
func TestLongKeyAfterClose(t *testing.T) {
	s := openTest(t, nil)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for op, err := range callsWithLongKey(s) {
		if !errors.Is(err, idempotency.ErrUnavailable) || !errors.Is(err, bolt.ErrDatabaseNotOpen) {
			err = short(err)
			t.Errorf("%s of a long key after Close: %v; want ErrUnavailable and bolt.ErrDatabaseNotOpen", op, err)
		}
	}
}

// TestLongKeyAfterFailedClosed: once the Store failed closed, "every later
// call" wraps ErrUnavailable and ErrFailedClosed, those with a key over the
// limit too. (TestFailedMetaSyncFailsClosed fails a real commit; here the
// state is set as failClosed sets it.)
func TestLongKeyAfterFailedClosed(t *testing.T) {
	s := openTest(t, nil)
	ferr := fmt.Errorf("%w: transaction 9: %w", ErrFailedClosed, errors.New("sync failed"))
	s.failed.Store(&ferr)
	for op, err := range callsWithLongKey(s) {
		if !errors.Is(err, idempotency.ErrUnavailable) || !errors.Is(err, ErrFailedClosed) {
			err = short(err)
			t.Errorf("%s of a long key after the Store failed closed: %v; want ErrUnavailable and ErrFailedClosed", op, err)
		}
	}
}
