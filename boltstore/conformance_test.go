package boltstore

import (
	"path/filepath"
	"testing"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemtest"
	bolt "go.etcd.io/bbolt"
)

func TestConformance(t *testing.T) {
	idemtest.Run(t, idemtest.Harness{
		New: func(t *testing.T) idempotency.Store { return openTest(t, nil) },
		// A store whose DB was closed under it: every call reaches bbolt
		// and must fail with ErrUnavailable, promptly.
		Broken: func(t *testing.T) idempotency.Store {
			db, err := bolt.Open(filepath.Join(t.TempDir(), "broken.db"), 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			s, err := New(db, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			return s
		},
	})
}
