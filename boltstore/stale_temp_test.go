package boltstore

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/archlab/idempotency"
)

// TestOpenRemovesStaleTemps: the temporary files of creations killed
// before they removed them (a whole new database never linked, an empty
// file just made, a second name of the database itself) are removed by the
// next Open; files that only look alike, and a temporary file a creation
// under way holds locked, are left alone, as is every record of the
// database.
func TestOpenRemovesStaleTemps(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "idem.db")
	storeFile(t, path, 3)
	in := func(name string) string { return filepath.Join(dir, name) }

	// Killed between bbolt's making the file and the link.
	db, err := bolt.Open(in(".idem.db.creating-1234"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	// Killed right after os.CreateTemp.
	if err := os.WriteFile(in(".idem.db.creating-5678"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// Killed between the link and the removal.
	if err := os.Link(path, in(".idem.db.creating-42")); err != nil {
		t.Fatal(err)
	}
	// Not create's.
	kept := []string{".idem.db.creating-", ".idem.db.creating-12a", ".other.db.creating-1", "idem.db.creating-1", ".idem.db.creating-1.bak"}
	for _, name := range kept {
		if err := os.WriteFile(in(name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(in(".idem.db.creating-77"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(path, in(".idem.db.creating-88")); err != nil {
		t.Fatal(err)
	}
	kept = append(kept, ".idem.db.creating-77", ".idem.db.creating-88")
	// A creation under way: bbolt holds its file locked.
	busy, err := bolt.Open(in(".idem.db.creating-999"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	kept = append(kept, ".idem.db.creating-999")

	s, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	want := append([]string{"idem.db"}, kept...)
	slices.Sort(want)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if !slices.Equal(got, want) {
		t.Errorf("after Open the directory holds %q, want %q", got, want)
	}
	for _, key := range []string{"key-0", "key-1", "key-2"} {
		if r, err := s.Get(ctx, key, t0); err != nil || r.State != idempotency.Done {
			t.Errorf("Get(%s) after Open = %+v, %v; want it done", key, r, err)
		}
	}
}

// TestOpenThroughSymlinkKeepsTarget: a path that is a symbolic link to a
// file named like a temporary one of create's keeps its target: removing
// it as stale would leave the link dangling and the database gone once
// closed.
func TestOpenThroughSymlinkKeepsTarget(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, ".idem.db.creating-7")
	storeFile(t, target, 3)
	path := filepath.Join(dir, "idem.db")
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	s, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := os.Stat(target); err != nil {
		t.Fatalf("Open through a symbolic link removed its target: %v", err)
	}
}
