package boltstore

import (
	"os"

	"golang.org/x/sys/unix"
)

// syncFS makes durable what is pending on the file system that holds path,
// the directory entry that names it included (syncfs(2)).
func syncFS(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	err = unix.Syncfs(int(f.Fd()))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
