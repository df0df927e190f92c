//go:build windows || plan9 || solaris || aix || android

package boltstore

import (
	"errors"
	"os"
	"time"
)

// Here bbolt locks its file by other means than flock, or not at all:
// Open checks the file without a lock, and takes no temporary file of
// create for one in use (removing one that is costs its creator nothing
// once the database exists: see removeStaleTemps).

func lockShared(*os.File, time.Duration) error { return nil }

func unlock(*os.File) {}

func lockedByOther(string) bool { return false }

// mapFile maps nothing here: verifyFile reads the file.
func mapFile(*os.File, int64) ([]byte, error) { return nil, errors.ErrUnsupported }

func unmapFile([]byte) {}
