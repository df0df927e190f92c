//go:build unix

package boltstore

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestOpenFIFOReturns: a FIFO at the path is refused, not waited on for
// ever (Open's check of the file opened it to read, which waits for a
// writer).
func TestOpenFIFOReturns(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Skipf("no FIFO here: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		s, err := Open(path, &Options{OpenTimeout: time.Second})
		if err == nil {
			s.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Open of a FIFO succeeded")
		}
		t.Logf("Open of a FIFO: %v", err)
	case <-time.After(30 * time.Second):
		// Unblock the reader so that the goroutine ends.
		if f, err := os.OpenFile(path, os.O_WRONLY, 0); err == nil {
			f.Close()
		}
		t.Fatal("Open of a FIFO did not return")
	}
}
