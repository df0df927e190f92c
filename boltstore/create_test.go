//go:build unix

package boltstore

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
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
	// The size limit is the whole process's: the cut Open runs in a child,
	// so that no file this process writes meanwhile (the test log of a
	// cached go test run, another test's) is cut by it.
	cmd := exec.Command(os.Args[0], "-test.run=^TestCutCreationChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), cutChildVar+"="+path)
	out, err := cmd.CombinedOutput()
	switch {
	case bytes.Contains(out, []byte("--- SKIP: TestCutCreationChild")):
		t.Skipf("the child could not limit the file size:\n%s", out)
	case err != nil:
		t.Fatalf("the cut Open in a child process: %v\n%s", err, out)
	case !bytes.Contains(out, []byte("--- PASS: TestCutCreationChild")):
		t.Fatalf("the child ran no check:\n%s", out)
	}
	if fi, err := os.Stat(path); err == nil {
		t.Errorf("the cut creation left %s of %d bytes", path, fi.Size())
	} else if !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "*")); len(left) != 0 {
		t.Errorf("the cut creation left %q", left)
	}

	var s *Store
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

const cutChildVar = "BOLTSTORE_TEST_CUT_CHILD"

// TestCutCreationChild opens the path TestCutCreationLeavesNoFile names
// under a file size limit of two pages, in a child process; it is skipped
// otherwise. Two pages fit: the meta pages are written, the freelist and
// the root leaf are not.
func TestCutCreationChild(t *testing.T) {
	path := os.Getenv(cutChildVar)
	if path == "" {
		t.Skip("run by TestCutCreationLeavesNoFile")
	}
	var limited syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &limited); err != nil {
		t.Fatal(err)
	}
	limited.Cur = uint64(2 * os.Getpagesize())
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &limited); err != nil {
		t.Skipf("cannot limit the file size: %v", err)
	}
	s, err := Open(path, &Options{OpenTimeout: time.Second})
	if err == nil {
		s.Close()
		t.Fatal("Open under a file size limit of two pages succeeded")
	}
	t.Logf("Open cut short: %v", err)
}
