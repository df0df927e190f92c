package boltstore

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// searchOnlyChildVar names, in a child of TestOpenInSearchOnlyDir, the file
// the child opens (and closes) as an unprivileged user.
const searchOnlyChildVar = "BOLTSTORE_SEARCH_ONLY_CHILD"

func searchOnlyChild(path string) error {
	s, err := Open(path, nil)
	if err != nil {
		return err
	}
	return s.Close()
}

// TestOpenInSearchOnlyDir: a service that owns its file in a directory it
// may search but not read (root-owned, 0711) opens it. Open syncs the
// directory on every open, which needs it opened for reading: the file
// system is synced instead. It needs root (to run the child as nobody) and
// setpriv, and skips, saying so, without them.
func TestOpenInSearchOnlyDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to run the opening process as an unprivileged user")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("needs setpriv (util-linux), to run the opening process as an unprivileged user")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	const nobody = 65534
	// Every directory up to the file must be searchable by nobody; the
	// last one is not readable.
	top := t.TempDir()
	for d := top; d != filepath.Dir(os.TempDir()) && d != "/"; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(d, fi.Mode().Perm()|0o001); err != nil {
				t.Fatal(err)
			}
		}
	}
	dir := filepath.Join(top, "d")
	if err := os.Mkdir(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o711); err != nil { // past the umask
		t.Fatal(err)
	}
	path := filepath.Join(dir, "idem.db")
	s, err := Open(path, nil) // as root: the file is made
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(setpriv, fmt.Sprintf("--reuid=%d", nobody), fmt.Sprintf("--regid=%d", nobody), "--clear-groups",
		exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), searchOnlyChildVar+"="+path)
	out, err := cmd.CombinedOutput()
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) && ee.ExitCode() == 2 {
		t.Fatalf("Open as nobody of a file in a search-only directory: %s", out)
	} else if err != nil {
		t.Fatalf("running the child as nobody: %v: %s", err, out)
	}
}
