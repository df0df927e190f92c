package boltstore

import (
	"errors"
	"os"
	"path/filepath"
	"runtime/debug"
	"syscall"
	"testing"
	"time"
)

// A creation of the file cut short (here a file size limit stops bbolt's
// writing of its first pages, as a full disk or a kill in the middle of
// that write would) must not leave a file that every later Open chokes on:
// bbolt takes a file of two meta pages without the pages they name for a
// database and faults (SIGBUS) reading them, so the process crashed on
// every restart until someone removed the file. The file must appear
// under its name whole or not at all.
func TestCutCreationLeavesNoFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cut.db")
	var saved syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &saved); err != nil {
		t.Fatal(err)
	}
	// Two pages fit: the meta pages are written, the freelist and the
	// root leaf are not. The limit is the process's: nothing else in this
	// test process writes to a regular file while it is set.
	limited := saved
	limited.Cur = uint64(2 * os.Getpagesize())
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &limited); err != nil {
		t.Skipf("cannot limit the file size: %v", err)
	}
	s, err := Open(path, &Options{OpenTimeout: time.Second})
	if rerr := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &saved); rerr != nil {
		t.Fatal(rerr)
	}
	if err == nil {
		s.Close()
		t.Fatal("Open under a file size limit of two pages succeeded")
	}
	t.Logf("Open cut short: %v", err)
	if fi, err := os.Stat(path); err == nil {
		t.Errorf("the cut creation left %s of %d bytes", path, fi.Size())
	} else if !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "*")); len(left) != 0 {
		t.Errorf("the cut creation left %q", left)
	}

	// The next Open (the restarted process) must work, not fault.
	func() {
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("Open after a cut creation faulted: %v", r)
			}
		}()
		s, err = Open(path, &Options{OpenTimeout: time.Second})
	}()
	if err != nil {
		t.Fatalf("Open after a cut creation: %v", err)
	}
	defer s.Close()
	checkFile(t, s.DB())
	if _, ok, err := s.Begin(ctx, "k", "fp", t0, lease, retention); err != nil || !ok {
		t.Errorf("Begin after a cut creation = %v, %v; want a claim", ok, err)
	}
}
