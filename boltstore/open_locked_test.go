package boltstore

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/archlab/idempotency"
)

// TestOpenLockedSaysLocked: an Open that gives up on a file whose lock is
// held (here by another Open in this process, which flock treats as another
// holder) says so, and how long it waited, rather than a bare "timeout"; it
// still wraps ErrUnavailable and bbolt's ErrTimeout.
func TestOpenLockedSaysLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "locked.db")
	held, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	_, err = Open(path, &Options{OpenTimeout: 50 * time.Millisecond})
	if !errors.Is(err, idempotency.ErrUnavailable) || !errors.Is(err, bolt.ErrTimeout) {
		t.Fatalf("Open of a locked file = %v, want ErrUnavailable and bbolt.ErrTimeout", err)
	}
	for _, want := range []string{path, "locked by another process (or another Open in this one)", "50ms", "OpenTimeout"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open of a locked file = %q, want it to say %q", err, want)
		}
	}
}
