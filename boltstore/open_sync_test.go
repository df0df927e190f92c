package boltstore

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/archlab/idempotency"
)

// A file that Open creates is synced into its directory: bbolt syncs the
// file but not the directory entry naming it, so a power cut could take a
// new file away, with every write acknowledged in it. A sync that fails
// fails Open and leaves the file unlocked.
func TestOpenSyncsNewFileIntoDir(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "new.db")
	var synced []string
	record := func(d string) error {
		synced = append(synced, d)
		return nil
	}
	s, err := open(path, nil, record)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if want := []string{dir}; !slices.Equal(synced, want) {
		t.Errorf("creating %s synced directories %q, want %q", path, synced, want)
	}

	boom := errors.New("boom")
	failing := filepath.Join(dir, "failing.db")
	if s, err := open(failing, nil, func(string) error { return boom }); !errors.Is(err, idempotency.ErrUnavailable) || !errors.Is(err, boom) {
		if s != nil {
			s.Close()
		}
		t.Fatalf("Open with a failing directory sync: %v, want ErrUnavailable and the sync's error", err)
	}
	s, err = Open(failing, &Options{OpenTimeout: time.Second})
	if err != nil {
		t.Fatalf("Open after a failed directory sync: %v (the file was left locked?)", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// syncDir works on a real directory of this platform.
func TestSyncDir(t *testing.T) {
	if err := syncDir(t.TempDir()); err != nil {
		t.Fatal(err)
	}
}

// A process killed after bbolt created its file, before Open synced the
// directory, leaves a file whose name may not be durable: the next Open
// must sync the directory too, though the file exists, or every write it
// acknowledges may go with the name at a power cut. Open cannot tell that
// file from one whose directory was synced, so it syncs it every time.
func TestOpenSyncsDirOfExistingFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "killed.db")
	db, err := bolt.Open(path, 0o600, nil) // what the killed process left
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	var synced []string
	s, err := open(path, nil, func(d string) error {
		synced = append(synced, d)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if want := []string{dir}; !slices.Equal(synced, want) {
		t.Errorf("opening the existing %s synced directories %q, want %q", path, synced, want)
	}
}
