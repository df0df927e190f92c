//go:build !windows && !plan9 && !solaris && !aix && !android

package boltstore

import (
	"errors"
	"math"
	"os"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
)

// lockRetry is how often lockShared tries again, as bbolt does.
const lockRetry = 50 * time.Millisecond

// lockShared takes a shared flock on f, the lock that bbolt's exclusive
// one excludes, waiting up to timeout (0: for ever) as bbolt does; then it
// fails with bolt.ErrTimeout.
func lockShared(f *os.File, timeout time.Duration) error {
	start := time.Now()
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
		if err != syscall.EWOULDBLOCK {
			return err
		}
		if timeout != 0 && time.Since(start) > timeout-lockRetry {
			return bolt.ErrTimeout
		}
		time.Sleep(lockRetry)
	}
}

func unlock(f *os.File) { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }

// lockedByOther reports whether a process holds a flock on the file at
// path (whose temporary files create keeps locked while it works).
func lockedByOther(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return true // not known to be free
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return true
	}
	unlock(f)
	return false
}

// mapFile maps the first size bytes of f for reading, so that verifyFile
// reads pages without a system call each. Unmap with unmapFile.
func mapFile(f *os.File, size int64) ([]byte, error) {
	if size <= 0 || size > math.MaxInt {
		return nil, errors.ErrUnsupported
	}
	return syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
}

func unmapFile(b []byte) { _ = syscall.Munmap(b) }
