package boltstore

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/archlab/idempotency"
)

// damagedChildVar names the file TestDamagedFileChild opens, in a child
// process of TestOpenDamagedFile.
const damagedChildVar = "BOLTSTORE_TEST_DAMAGED_FILE"

// storeFile makes, at path, the file of a Store that holds n completed
// records, and returns it closed.
func storeFile(t *testing.T, path string, n int) {
	t.Helper()
	s, err := Open(path, &Options{SweepPerWrite: -1})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		key := fmt.Sprint("key-", i)
		r, _, err := s.Begin(ctx, key, "fp", t0, lease, retention)
		if err == nil {
			err = s.Complete(ctx, key, r.Token, idempotency.Response{Status: 200, Body: bytes.Repeat([]byte{'b'}, 100)}, t0, retention)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestOpenDamagedFile: Open of a file that is not a whole bbolt database
// returns an error wrapping ErrUnavailable and ErrDamagedFile that names
// the file, and leaves the file as it was. Some of these files killed the
// process inside bolt.Open (SIGBUS on pages past the end of the file, or an
// assertion failing in a goroutine of bbolt's own), so each Open runs in a
// child process.
func TestOpenDamagedFile(t *testing.T) {
	ps := os.Getpagesize()
	shapes := []struct {
		name string
		make func(t *testing.T, path string)
	}{
		// An older build's creation in place, killed once it had
		// written the meta pages but not the pages they name.
		{"meta pages only", func(t *testing.T, path string) {
			storeFile(t, path, 0)
			if err := os.Truncate(path, int64(2*ps)); err != nil {
				t.Fatal(err)
			}
		}},
		{"three pages of a new file", func(t *testing.T, path string) {
			storeFile(t, path, 0)
			if err := os.Truncate(path, int64(3*ps)); err != nil {
				t.Fatal(err)
			}
		}},
		{"truncated to half", func(t *testing.T, path string) {
			storeFile(t, path, 500)
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(path, fi.Size()/2); err != nil {
				t.Fatal(err)
			}
		}},
		{"pages zeroed after the meta pages", func(t *testing.T, path string) {
			storeFile(t, path, 500)
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			clear(data[2*ps:])
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"zeros", func(t *testing.T, path string) {
			if err := os.WriteFile(path, make([]byte, 16*ps), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"a few zeros", func(t *testing.T, path string) {
			if err := os.WriteFile(path, make([]byte, 100), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"random bytes", func(t *testing.T, path string) {
			data := make([]byte, 64<<10)
			r := rand.New(rand.NewPCG(1, 2))
			for i := range data {
				data[i] = byte(r.Uint32())
			}
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"a text file", func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte("not a database\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, shape := range shapes {
		t.Run(shape.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "damaged.db")
			shape.make(t, path)
			before, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestDamagedFileChild$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), damagedChildVar+"="+path)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Errorf("Open in a child process: %v\n%s", err, lastLines(out, 30))
			} else if !bytes.Contains(out, []byte("--- PASS: TestDamagedFileChild")) {
				t.Errorf("the child ran no check:\n%s", out)
			}
			after, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(before, after) {
				t.Errorf("Open changed the damaged file (%d bytes, now %d)", len(before), len(after))
			}
			if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 1 {
				t.Errorf("files beside the damaged one after Open: %q", left)
			}
		})
	}
}

// lastLines is the end of a child's output, where a crash says why.
func lastLines(out []byte, n int) []byte {
	lines := bytes.Split(out, []byte("\n"))
	return bytes.Join(lines[max(0, len(lines)-n):], []byte("\n"))
}

// TestDamagedFileChild opens the file TestOpenDamagedFile made, in a
// child process; it is skipped otherwise.
func TestDamagedFileChild(t *testing.T) {
	path := os.Getenv(damagedChildVar)
	if path == "" {
		t.Skip("run by TestOpenDamagedFile")
	}
	s, err := Open(path, &Options{OpenTimeout: time.Second})
	if err == nil {
		s.Close()
		t.Fatalf("Open(%s) of a damaged file succeeded", path)
	}
	t.Logf("Open: %v", err)
	if !errors.Is(err, ErrDamagedFile) || !errors.Is(err, idempotency.ErrUnavailable) {
		t.Errorf("Open = %v, want ErrDamagedFile and ErrUnavailable", err)
	}
	if !strings.Contains(err.Error(), path) {
		t.Errorf("Open = %q, want it to name %s", err, path)
	}
}

// verifyFile takes every whole database it is given, whatever bbolt put
// in it: branch pages, overflow pages, buckets inline and not, nested, a
// synced freelist or none, free pages; and the file an older build wrote.
func TestVerifyFileAcceptsWholeFiles(t *testing.T) {
	for _, noFreelistSync := range []bool{false, true} {
		t.Run(fmt.Sprint("NoFreelistSync=", noFreelistSync), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "whole.db")
			db, err := bolt.Open(path, 0o600, &bolt.Options{NoFreelistSync: noFreelistSync})
			if err != nil {
				t.Fatal(err)
			}
			err = db.Update(func(tx *bolt.Tx) error {
				big, err := tx.CreateBucket([]byte("big"))
				if err != nil {
					return err
				}
				for i := range 3000 {
					if err := big.Put(fmt.Appendf(nil, "k%05d", i), bytes.Repeat([]byte{byte(i)}, 200)); err != nil {
						return err
					}
				}
				if err := big.Put([]byte("overflow"), make([]byte, 5*os.Getpagesize())); err != nil {
					return err
				}
				inline, err := big.CreateBucket([]byte("inline"))
				if err != nil {
					return err
				}
				if err := inline.Put([]byte("a"), []byte("b")); err != nil {
					return err
				}
				nested, err := inline.CreateBucket([]byte("nested"))
				if err != nil {
					return err
				}
				return nested.Put([]byte("c"), []byte("d"))
			})
			if err == nil {
				// Free pages, in the middle of the file.
				err = db.Update(func(tx *bolt.Tx) error {
					b := tx.Bucket([]byte("big"))
					for i := range 1500 {
						if err := b.Delete(fmt.Appendf(nil, "k%05d", i)); err != nil {
							return err
						}
					}
					return nil
				})
			}
			if cerr := db.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				t.Fatal(err)
			}
			checkWhole(t, path)
			// And once Open has written it, as a Store's file.
			storeFile(t, path, 50)
			checkWhole(t, path)
		})
	}
	t.Run("older build", func(t *testing.T) {
		checkWhole(t, filepath.Join("testdata", "upgrade", "records-10b0c63.db"))
	})
}

func checkWhole(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if err := verifyFile(f, fi.Size()); err != nil {
		t.Errorf("verifyFile(%s) = %v, want nil", path, err)
	}
}

// An empty file is bbolt's to make a database of, as it always was.
func TestOpenEmptyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "empty.db")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Open(path, nil)
	if err != nil {
		t.Fatalf("Open of an empty file: %v", err)
	}
	defer s.Close()
	if _, ok, err := s.Begin(ctx, "k", "fp", t0, lease, retention); err != nil || !ok {
		t.Errorf("Begin = %v, %v; want a claim", ok, err)
	}
}
