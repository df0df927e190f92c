package boltstore

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/archlab/idempotency"
)

// holdChildVar names the file the child process of TestOpenHeldByProcess
// opens and holds until it is killed.
const holdChildVar = "BOLTSTORE_HOLD_CHILD_DB"

// holdChild opens the Store at path, says so on stdout, and keeps it open
// until stdin ends (the parent kills it first).
func holdChild(path string) error {
	s, err := Open(path, nil)
	if err != nil {
		return err
	}
	defer s.Close()
	if _, err := os.Stdout.WriteString("open\n"); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(crashMaxTime):
	}
	return nil
}

// Open of a file another process holds fails after OpenTimeout with
// ErrUnavailable and bbolt's ErrTimeout; once that process is killed (no
// Close, the kernel drops its lock), Open succeeds on a consistent file.
func TestOpenHeldByProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "held.db")
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), holdChildVar+"="+path)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "open\n" {
		t.Fatalf("the child did not open %s: %q, %v", path, line, err)
	}

	s, err := Open(path, &Options{OpenTimeout: 200 * time.Millisecond})
	if err == nil {
		s.Close()
		t.Fatal("Open of a file another process holds succeeded")
	}
	if !errors.Is(err, idempotency.ErrUnavailable) || !errors.Is(err, bolt.ErrTimeout) {
		t.Errorf("Open of a file another process holds: %v, want ErrUnavailable and bolt.ErrTimeout", err)
	}

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	killed = true
	s, err = Open(path, &Options{OpenTimeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("Open once the holder was killed: %v", err)
	}
	defer s.Close()
	checkFile(t, s.DB())
	if _, ok, err := s.Begin(ctx, "k", "fp", t0, lease, retention); err != nil || !ok {
		t.Errorf("Begin once the holder was killed = %v, %v; want a claim", ok, err)
	}
}
