//go:build linux

package boltstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/archlab/idempotency"
	bolt "go.etcd.io/bbolt"
)

// These tests put the Store on a disk that really fails: a small tmpfs
// filled with a ballast file (ENOSPC from write), and an ext2 file system on
// a loop device whose backing file lives in such a tmpfs (ENOSPC from
// fdatasync, after which the page cache still shows the data the disk lost).

// mountTmpfs mounts a tmpfs of size bytes in a new temporary directory.
func mountTmpfs(t *testing.T, size int) string {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir).CombinedOutput()
	if err != nil {
		t.Skipf("needs root to mount tmpfs: %v: %s", err, out)
	}
	// Registered after TempDir's cleanup, so it runs before the removal.
	t.Cleanup(func() { unmount(t, dir) })
	return dir
}

func unmount(t *testing.T, dir string) {
	t.Helper()
	if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
		t.Errorf("umount %s: %v: %s", dir, err, out)
	}
}

// fill writes the file path until the file system holding it is full and
// reports how many bytes it wrote.
func fill(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var total int64
	for _, chunk := range []int{1 << 20, 4096, 1} {
		buf := make([]byte, chunk)
		for {
			n, err := f.Write(buf)
			total += int64(n)
			if errors.Is(err, syscall.ENOSPC) {
				break
			}
			if err != nil {
				t.Fatalf("fill %s: %v", path, err)
			}
		}
	}
	return total
}

func diskFullBody(key string, size int) []byte {
	return bytes.Repeat([]byte(key+";"), size/(len(key)+1)+1)[:size]
}

// checkDone fails unless key's record is Done with body.
func checkDone(t *testing.T, s *Store, key string, body []byte, now time.Time) {
	t.Helper()
	r, err := s.Get(context.Background(), key, now)
	if err != nil {
		t.Errorf("Get %s: %v", key, err)
		return
	}
	if r.State != idempotency.Done || !bytes.Equal(r.Response.Body, body) {
		t.Errorf("Get %s: %s with a body of %d bytes; want DONE with %d bytes", key, r.State, len(r.Response.Body), len(body))
	}
}

// A full disk fails a commit while bbolt writes the transaction's pages,
// before its meta page: every write of the batch fails with ErrUnavailable
// wrapping ENOSPC, nothing of it is left (a failed claim does not block its
// key), the Store keeps answering from what was acknowledged, and once space
// is freed it writes again and every acknowledged record is there after a
// reopen.
func TestDiskFullFailsTheWholeCommit(t *testing.T) {
	dir := mountTmpfs(t, 8<<20)
	path := filepath.Join(dir, "x.db")
	ctx := context.Background()
	now := time.Now()
	const bigBody = 256 << 10 // 64 pages: no free run that long, the file must grow

	// Acknowledged before the disk fills: finished keys, and claims whose
	// results are stored while it is full.
	s, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	bodies := map[string][]byte{}
	for i := range 10 {
		key := fmt.Sprintf("acked-%d", i)
		r, ok, err := s.Begin(ctx, key, "fp", now, time.Minute, time.Hour)
		if err != nil || !ok {
			t.Fatalf("Begin %s: %v %v", key, ok, err)
		}
		bodies[key] = diskFullBody(key, 100)
		if err := s.Complete(ctx, key, r.Token, idempotency.Response{Status: 200, Body: bodies[key]}, now, time.Hour); err != nil {
			t.Fatalf("Complete %s: %v", key, err)
		}
	}
	tokens := map[string]uint64{}
	for i := range 4 {
		key := fmt.Sprintf("big-%d", i)
		r, ok, err := s.Begin(ctx, key, "fp", now, time.Hour, time.Hour)
		if err != nil || !ok {
			t.Fatalf("Begin %s: %v %v", key, ok, err)
		}
		tokens[key] = r.Token
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// The nine writes below go into one commit: the committer waits for
	// them all (a batch of nine), however late the last one comes on a
	// loaded machine; the minute only bounds a test that goes wrong.
	const batchWrites = 9
	s, err = Open(path, &Options{MaxBatchSize: batchWrites, MaxBatchDelay: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if s != nil {
			s.Close()
		}
	}()
	g, err := idempotency.NewGuard(s, &idempotency.Options{Lease: time.Hour, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}

	ballast := filepath.Join(dir, "ballast")
	t.Logf("ballast of %d bytes fills the tmpfs", fill(t, ballast))

	// One batch: the Completes need new pages, and the Begins of new keys
	// and the Guard's claim ride in the same commit.
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		errs    = map[string]error{}
		ran     bool
		outcome idempotency.Outcome
	)
	commits := s.commits.Load()
	report := func(name string, err error) {
		mu.Lock()
		defer mu.Unlock()
		errs[name] = err
	}
	for key, tok := range tokens {
		wg.Go(func() {
			report("complete "+key, s.Complete(ctx, key, tok,
				idempotency.Response{Status: 200, Body: diskFullBody(key, bigBody)}, now, time.Hour))
		})
	}
	for i := range 4 {
		key := fmt.Sprintf("new-%d", i)
		wg.Go(func() {
			_, ok, err := s.Begin(ctx, key, "fp", now, time.Hour, time.Hour)
			if err == nil && !ok {
				err = errors.New("not claimed")
			}
			report("begin "+key, err)
		})
	}
	wg.Go(func() {
		_, out, err := g.Do(ctx, "guard", "fp", func(context.Context) (idempotency.Response, error) {
			mu.Lock()
			ran = true
			mu.Unlock()
			return idempotency.Response{Status: 200}, nil
		})
		mu.Lock()
		outcome = out
		mu.Unlock()
		report("guard", err)
	})
	wg.Wait()
	if n := s.commits.Load() - commits; n != 1 {
		t.Fatalf("the writes took %d commits; the test needs them in one", n)
	}
	if len(errs) != batchWrites {
		t.Fatalf("%d writes, want %d", len(errs), batchWrites)
	}
	// From here on each write goes alone, at once. The committer reads
	// batchDelay as it takes a batch's first write, after the writes above
	// were answered.
	s.batchDelay = 0
	for name, err := range errs {
		if !errors.Is(err, idempotency.ErrUnavailable) || !errors.Is(err, syscall.ENOSPC) {
			t.Errorf("%s: %v; want ErrUnavailable wrapping ENOSPC", name, err)
		}
		if errors.Is(err, ErrFailedClosed) {
			t.Errorf("%s: %v; a commit rolled back before its meta page need not fail the Store closed", name, err)
		}
	}
	if ran || outcome != idempotency.Unavailable {
		t.Errorf("Guard.Do: fn ran %v, outcome %s; want fn not run, %s", ran, outcome, idempotency.Unavailable)
	}
	if err := s.Failed(); err != nil {
		t.Errorf("Failed after a commit rolled back before its meta page: %v, want nil", err)
	}

	// bbolt rolled the transaction back before writing its meta page: the
	// Store answers from what was acknowledged, and nothing of the failed
	// commit is there.
	for key, body := range bodies {
		checkDone(t, s, key, body, now)
	}
	for key := range tokens {
		if r, err := s.Get(ctx, key, now); err != nil || r.State != idempotency.Processing {
			t.Errorf("Get %s: %v %v; want the claim, still PROCESSING", key, r.State, err)
		}
	}
	for _, key := range []string{"new-0", "new-1", "new-2", "new-3", "guard"} {
		if _, err := s.Get(ctx, key, now); !errors.Is(err, idempotency.ErrNotFound) {
			t.Errorf("Get %s after its failed claim: %v; want ErrNotFound", key, err)
		}
	}

	// Space freed: the same Store writes again, without a reopen, and the
	// keys whose claims failed are free.
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	for key, tok := range tokens {
		bodies[key] = diskFullBody(key, bigBody)
		if err := s.Complete(ctx, key, tok, idempotency.Response{Status: 200, Body: bodies[key]}, now, time.Hour); err != nil {
			t.Errorf("Complete %s after space was freed: %v", key, err)
		}
	}
	if _, ok, err := s.Begin(ctx, "new-0", "fp", now, time.Hour, time.Hour); err != nil || !ok {
		t.Errorf("Begin new-0 after space was freed: claimed %v, %v; want a claim", ok, err)
	}
	ran = false
	if _, out, err := g.Do(ctx, "guard", "fp", func(context.Context) (idempotency.Response, error) {
		ran = true
		return idempotency.Response{Status: 200, Body: []byte("guarded")}, nil
	}); err != nil || !ran || out != idempotency.Executed {
		t.Errorf("Guard.Do after space was freed: fn ran %v, %s, %v; want it executed", ran, out, err)
	}
	bodies["guard"] = []byte("guarded")

	// Reopened, the file holds every acknowledged record.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(path, nil)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	for key, body := range bodies {
		checkDone(t, s, key, body, now)
	}
	if r, err := s.Get(ctx, "new-0", now); err != nil || r.State != idempotency.Processing {
		t.Errorf("Get new-0 after reopen: %v %v; want PROCESSING", r.State, err)
	}
	checkIndex(t, s)
}

// loopExt2 is an ext2 file system on a loop device whose backing file is
// fully allocated in a tmpfs of its own.
type loopExt2 struct {
	tmpfs, image, dev, mnt string
	mounted                bool
}

// mountLoopExt2 makes a loopExt2 of imageSize bytes, with free room in its
// tmpfs for a ballast file.
func mountLoopExt2(t *testing.T, imageSize int) *loopExt2 {
	t.Helper()
	if os.Getpagesize() != 4096 {
		t.Skipf("needs 4096-byte pages to map bbolt pages to ext2 blocks, not %d", os.Getpagesize())
	}
	for _, tool := range []string{"losetup", "mkfs.ext2", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (util-linux, e2fsprogs): %v", tool, err)
		}
	}
	l := &loopExt2{tmpfs: mountTmpfs(t, imageSize+(8<<20))}
	l.image = filepath.Join(l.tmpfs, "image")
	f, err := os.Create(l.image)
	if err != nil {
		t.Fatal(err)
	}
	// Every block of the image is backed by tmpfs pages, so that the file
	// system writes fail only where a test punches a hole.
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, int64(imageSize)); err != nil {
		f.Close()
		t.Fatal(err)
	}
	f.Close()
	if out, err := exec.Command("mkfs.ext2", "-F", "-q", "-b", "4096", "-E", "nodiscard", l.image).CombinedOutput(); err != nil {
		t.Skipf("mkfs.ext2: %v: %s", err, out)
	}
	out, err := exec.Command("losetup", "--find", "--show", l.image).Output()
	if err != nil {
		t.Skipf("needs a loop device: losetup: %v", err)
	}
	l.dev = string(bytes.TrimSpace(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "-d", l.dev).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v: %s", l.dev, err, out)
		}
	})
	l.mnt = t.TempDir()
	t.Cleanup(func() {
		if l.mounted {
			unmount(t, l.mnt)
		}
	})
	l.mount(t)
	return l
}

func (l *loopExt2) mount(t *testing.T) {
	t.Helper()
	if out, err := exec.Command("mount", "-t", "ext2", l.dev, l.mnt).CombinedOutput(); err != nil {
		t.Skipf("needs ext2 on a loop device: mount: %v: %s", err, out)
	}
	l.mounted = true
}

// remount drops what the kernel caches of the file system, so that what is
// read next comes from the device.
func (l *loopExt2) remount(t *testing.T) {
	t.Helper()
	unmount(t, l.mnt)
	l.mounted = false
	l.mount(t)
}

// punch takes the backing of the file system block under page of path
// away: with the tmpfs full, the next write of that block fails.
func (l *loopExt2) punch(t *testing.T, path string, page int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	blk := int32(page) // FIBMAP: logical block in, physical block out
	const fibmap = 1
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), fibmap, uintptr(unsafe.Pointer(&blk))); errno != 0 || blk == 0 {
		t.Fatalf("FIBMAP %s block %d: %v (physical block %d)", path, page, errno, blk)
	}
	img, err := os.OpenFile(l.image, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	const punchHole, keepSize = 0x2, 0x1
	if err := syscall.Fallocate(int(img.Fd()), punchHole|keepSize, int64(blk)*4096, 4096); err != nil {
		t.Fatalf("punch block %d of %s: %v", blk, l.image, err)
	}
}

// A commit whose meta page reached the page cache but whose fdatasync
// failed: bbolt shows that transaction to later transactions although the
// disk may never get it (Linux reports a writeback error once and may drop
// the data: "fsyncgate"). The Store fails closed until it is reopened, and
// after a reopen it has every acknowledged record.
func TestFailedMetaSyncFailsClosed(t *testing.T) {
	l := mountLoopExt2(t, 16<<20)
	path := filepath.Join(l.mnt, "x.db")
	ctx := context.Background()
	now := time.Now()
	s, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if s != nil {
			s.Close()
		}
	}()
	bodies := map[string][]byte{}
	var claimToken uint64
	for i := range 10 {
		key := fmt.Sprintf("acked-%d", i)
		r, ok, err := s.Begin(ctx, key, "fp", now, time.Hour, time.Hour)
		if err != nil || !ok {
			t.Fatalf("Begin %s: %v %v", key, ok, err)
		}
		if i == 9 {
			claimToken = r.Token // left Processing
			break
		}
		bodies[key] = diskFullBody(key, 3000)
		if err := s.Complete(ctx, key, r.Token, idempotency.Response{Status: 200, Body: bodies[key]}, now, time.Hour); err != nil {
			t.Fatalf("Complete %s: %v", key, err)
		}
	}

	// The next commit writes the meta page txid%2; take its block's backing
	// away and fill the tmpfs, so that its data pages are synced but its
	// meta page is not.
	var txid int
	if err := s.db.View(func(tx *bolt.Tx) error { txid = tx.ID(); return nil }); err != nil {
		t.Fatal(err)
	}
	ballast := filepath.Join(l.tmpfs, "ballast")
	fill(t, ballast)
	l.punch(t, path, (txid+1)%2)
	fill(t, ballast)

	_, _, err = s.Begin(ctx, "phantom", "fp", now, time.Hour, time.Hour)
	phantomErr := err
	if !errors.Is(err, idempotency.ErrUnavailable) || !(errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EIO)) {
		t.Fatalf("Begin phantom: %v; want ErrUnavailable wrapping the failed sync", err)
	}
	t.Logf("Begin phantom: %v", err)
	if err := s.db.View(func(tx *bolt.Tx) error { txid = tx.ID(); return nil }); err == nil {
		t.Logf("bbolt shows transaction %d, the one whose commit failed", txid)
	}

	// Failed closed: no answer from a state the disk may not hold, no write
	// on top of it; the native error is kept.
	checkClosed := func(op string, err error) {
		t.Helper()
		if !errors.Is(err, idempotency.ErrUnavailable) || !errors.Is(err, ErrFailedClosed) ||
			!(errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EIO)) {
			t.Errorf("%s after the failed commit: %v; want ErrUnavailable and ErrFailedClosed wrapping the failed sync", op, err)
		}
	}
	checkClosed("Begin phantom, whose commit failed", phantomErr)
	if err := s.Failed(); !errors.Is(err, ErrFailedClosed) || !(errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EIO)) {
		t.Errorf("Failed after the failed commit: %v; want ErrFailedClosed wrapping the failed sync", err)
	}
	r, err := s.Get(ctx, "phantom", now)
	checkClosed("Get phantom", err)
	if err == nil {
		t.Errorf("Get phantom answered %s from the commit that failed", r.State)
	}
	_, err = s.Get(ctx, "acked-0", now)
	checkClosed("Get acked-0", err)
	_, _, err = s.Begin(ctx, "acked-0", "fp", now, time.Hour, time.Hour)
	checkClosed("Begin acked-0 (a replay)", err)
	_, _, err = s.Begin(ctx, "other", "fp", now, time.Hour, time.Hour)
	checkClosed("Begin other", err)
	checkClosed("Complete acked-9", s.Complete(ctx, "acked-9", claimToken, idempotency.Response{Status: 200}, now, time.Hour))
	checkClosed("Extend acked-9", s.Extend(ctx, "acked-9", claimToken, now, time.Hour))
	checkClosed("Release acked-9", s.Release(ctx, "acked-9", claimToken))
	checkClosed("Delete acked-0", s.Delete(ctx, "acked-0"))
	_, err = s.Sweep(ctx, now, 0)
	checkClosed("Sweep", err)

	// Freeing space is not enough: the Store stays closed until reopened.
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	_, _, err = s.Begin(ctx, "other", "fp", now, time.Hour, time.Hour)
	checkClosed("Begin other after space was freed", err)

	if err := s.Close(); err != nil {
		t.Logf("Close: %v", err)
	}
	s = nil
	l.remount(t)
	s, err = Open(path, nil)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	for key, body := range bodies {
		checkDone(t, s, key, body, now)
	}
	if r, err := s.Get(ctx, "acked-9", now); err != nil || r.State != idempotency.Processing || r.Token != claimToken {
		t.Errorf("Get acked-9 after reopen: %+v %v; want the claim of token %d", r, err, claimToken)
	}
	// The failed commit never reached the disk: the record that Get
	// showed before the fix is not there.
	if _, err := s.Get(ctx, "phantom", now); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Get phantom after reopen: %v; want ErrNotFound", err)
	}
	if err := s.Complete(ctx, "acked-9", claimToken, idempotency.Response{Status: 201}, now, time.Hour); err != nil {
		t.Errorf("Complete acked-9 after reopen: %v", err)
	}
	checkIndex(t, s)
}
