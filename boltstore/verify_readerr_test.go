package boltstore

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// failingReader reads data until its nth read, which fails with err or,
// with panicWith set, panics with it.
type failingReader struct {
	data      []byte
	n         int
	err       error
	panicWith any
}

func (r *failingReader) ReadAt(p []byte, off int64) (int, error) {
	if r.n--; r.n == 0 {
		if r.panicWith != nil {
			panic(r.panicWith)
		}
		return 0, r.err
	}
	return memFile(r.data).ReadAt(p, off)
}

// fakeFault is a panic value as a memory fault's is: it has an Addr.
type fakeFault struct{}

func (fakeFault) Error() string { return "unexpected fault address 0x7f00" }
func (fakeFault) Addr() uintptr { return 0x7f00 }

// TestCheckDataReadFailures: a file that cannot be read (an I/O error, a
// fault reading its mapping) gets no verdict on its contents: the error
// says what failed and does not wrap ErrDamagedFile, whose advice (move the
// file aside) would be wrong for a disk that failed a read. A panic of the
// check itself still refuses the file. (Every failure read as damaged.)
func TestCheckDataReadFailures(t *testing.T) {
	path := filepath.Join(t.TempDir(), "whole.db")
	storeFile(t, path, 20)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkData(memFile(data), int64(len(data))); err != nil {
		t.Fatalf("checkData of a whole file: %v", err)
	}
	for _, n := range []int{1, 2, 3, 4} {
		err := checkData(&failingReader{data: data, n: n, err: syscall.EIO}, int64(len(data)))
		if err == nil || errors.Is(err, ErrDamagedFile) || !errors.Is(err, syscall.EIO) {
			t.Errorf("read %d failing with EIO: %v; want EIO, not ErrDamagedFile", n, err)
		}
	}
	err = checkData(&failingReader{data: data, n: 3, panicWith: fakeFault{}}, int64(len(data)))
	if err == nil || errors.Is(err, ErrDamagedFile) {
		t.Errorf("a fault reading: %v; want an error, not ErrDamagedFile", err)
	}
	err = checkData(&failingReader{data: data, n: 3, panicWith: "bug"}, int64(len(data)))
	if !errors.Is(err, ErrDamagedFile) {
		t.Errorf("a panic of the check: %v; want ErrDamagedFile", err)
	}
}
