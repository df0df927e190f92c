package boltstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/archlab/idempotency"
)

// The property checked here: verifyFile takes every file bbolt writes.
// Open refuses what verifyFile refuses, so a valid file it refused would
// keep a service from starting.
const (
	// verifySeedVar fixes the seed of TestVerifyFileAcceptsValidDatabases
	// (default: a new one each run, printed on failure).
	verifySeedVar = "BOLTSTORE_VERIFY_SEED"
	// verifyScaleVar multiplies the number of databases it builds
	// (default 1).
	verifyScaleVar = "BOLTSTORE_VERIFY_SCALE"
)

// propertySeed is the seed of a property test: verifySeedVar's, or a new one.
func propertySeed(t *testing.T) uint64 {
	t.Helper()
	if s := os.Getenv(verifySeedVar); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", verifySeedVar, s, err)
		}
		return seed
	}
	return rand.Uint64()
}

func propertyScale(t *testing.T) int {
	t.Helper()
	s := os.Getenv(verifyScaleVar)
	if s == "" {
		return 1
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", verifyScaleVar, s)
	}
	return n
}

// validChecker checks that files bbolt wrote pass verifyFile, and counts
// what it checked.
type validChecker struct {
	seed uint64
	mu   sync.Mutex
	// files counts checks of a closed file: verifyFile by ReadAt and on a
	// copy in memory, inspectFile, and bbolt's own read-only walk;
	// liveFiles counts checks of a file bbolt held open between commits
	// (verifyFile only: inspectFile would wait for bbolt's lock).
	files, liveFiles int
	// leakyFiles counts closed files in which tx.Check found pages
	// bbolt leaked (see closed).
	leakyFiles int
	shapes     map[string]int
}

func newValidChecker(seed uint64) *validChecker {
	return &validChecker{seed: seed, shapes: make(map[string]int)}
}

func (c *validChecker) count(shape string, live bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.shapes[shape]++
	if live {
		c.liveFiles++
	} else {
		c.files++
	}
}

// live checks the file at path, which an open bbolt DB holds between
// transactions, by both of verifyFile's ways of reading.
func (c *validChecker) live(t *testing.T, path, what string) {
	t.Helper()
	c.verify(t, path, what)
	c.count("live", true)
}

// closed checks the closed file at path as live does, then by
// inspectFile (Open's check, through a mapping where there is one), then
// by bbolt itself: a read-only Open, tx.Check and a walk of every bucket,
// key and value. It returns the walk's digest of the contents.
func (c *validChecker) closed(t *testing.T, path, shape string) uint64 {
	t.Helper()
	c.verify(t, path, shape)
	if err := inspectFile(path, time.Second); err != nil {
		c.fail(t, path, shape, fmt.Sprintf("inspectFile = %v, want nil", err))
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatalf("%s: bbolt cannot open the file it wrote: %v (seed %d)", shape, err, c.seed)
	}
	defer db.Close()
	var sum uint64
	leaked := 0
	err = db.View(func(tx *bolt.Tx) error {
		var first error
		for err := range tx.Check() {
			// bbolt leaves a page now and then neither reachable nor
			// free after bucket deletes (seen with DeleteBucket in
			// the random transactions). A leaked page costs space,
			// not the opening: counted, not failed.
			if strings.HasSuffix(err.Error(), ": unreachable unfreed") {
				leaked++
			} else if first == nil {
				first = fmt.Errorf("tx.Check: %w", err)
			}
		}
		if first != nil {
			return first
		}
		var err error
		sum, err = digest(tx)
		return err
	})
	if err != nil {
		t.Fatalf("%s: bbolt's own check of the file it wrote: %v (seed %d)", shape, err, c.seed)
	}
	c.count(shape, false)
	if leaked > 0 {
		c.mu.Lock()
		c.leakyFiles++
		c.mu.Unlock()
	}
	return sum
}

func (c *validChecker) verify(t *testing.T, path, what string) {
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
		c.fail(t, path, what, fmt.Sprintf("verifyFile(*os.File) = %v, want nil", err))
		return
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := verifyFile(memFile(data), int64(len(data))); err != nil {
		c.fail(t, path, what, fmt.Sprintf("verifyFile(memFile) = %v, want nil", err))
	}
}

// fail reports a valid file refused, keeping a copy of it to look at.
func (c *validChecker) fail(t *testing.T, path, what, msg string) {
	t.Helper()
	kept := filepath.Join(os.TempDir(), fmt.Sprintf("boltstore-verify-%d-%d.db", c.seed, time.Now().UnixNano()))
	if data, err := os.ReadFile(path); err == nil && os.WriteFile(kept, data, 0o600) == nil {
		msg += "; the file is kept at " + kept
	}
	t.Errorf("%s (%s): %s\nseed %d; repeat with %s=%d go test -run '%s' ./boltstore/",
		what, filepath.Base(path), msg, c.seed, verifySeedVar, c.seed, t.Name())
}

// digest hashes every bucket (with its sequence), key and value of tx.
func digest(tx *bolt.Tx) (uint64, error) {
	h := fnv.New64a()
	put := func(tag byte, b []byte) {
		var n [9]byte
		n[0] = tag
		binary.BigEndian.PutUint64(n[1:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	var walk func(b *bolt.Bucket) error
	walk = func(b *bolt.Bucket) error {
		put('s', binary.BigEndian.AppendUint64(nil, b.Sequence()))
		return b.ForEach(func(k, v []byte) error {
			put('k', k)
			if v == nil {
				if sub := b.Bucket(k); sub != nil {
					put('b', nil)
					return walk(sub)
				}
			}
			put('v', v)
			return nil
		})
	}
	err := tx.ForEach(func(name []byte, b *bolt.Bucket) error {
		put('t', name)
		return walk(b)
	})
	return h.Sum64(), err
}

// boltShape is how one database of the property test is opened.
type boltShape struct {
	pageSize       int
	noFreelistSync bool
	freelist       bolt.FreelistType
}

func (s boltShape) String() string {
	return fmt.Sprintf("page%d/nofreelistsync=%t/%s", s.pageSize, s.noFreelistSync, s.freelist)
}

var propertyPageSizes = []int{1024, 4096, 16384, 65536}

// allBoltShapes is every combination of page size, freelist sync and
// freelist type.
func allBoltShapes() []boltShape {
	var shapes []boltShape
	for _, ps := range propertyPageSizes {
		for _, nfs := range []bool{false, true} {
			for _, ft := range []bolt.FreelistType{bolt.FreelistArrayType, bolt.FreelistMapType} {
				shapes = append(shapes, boltShape{ps, nfs, ft})
			}
		}
	}
	return shapes
}

func (s boltShape) options(r *rand.Rand) *bolt.Options {
	return &bolt.Options{
		Timeout:        time.Second,
		PageSize:       s.pageSize,
		NoFreelistSync: s.noFreelistSync,
		FreelistType:   s.freelist,
		NoSync:         true, // what reaches the file is the same; tests run faster
		// Without grow's truncation the file is only as long as what
		// was written to it.
		NoGrowSync: r.IntN(2) == 0,
	}
}

// TestVerifyFileAcceptsValidDatabases builds databases of every page
// size, freelist sync and freelist type with bbolt, by seeded random
// transactions (nested and inline buckets, empty and large keys and
// values, deletes, bucket deletes and moves, sequences, files grown and
// emptied, reopened with other options), and files of Stores under churn,
// and checks that verifyFile takes each: at commits while bbolt holds the
// file, after it is closed, and in copies made by tx.WriteTo, CopyFile
// and bolt.Compact, and with its newest meta page torn.
func TestVerifyFileAcceptsValidDatabases(t *testing.T) {
	seed := propertySeed(t)
	scale := propertyScale(t)
	c := newValidChecker(seed)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d; repeat with %s=%d go test -run 'TestVerifyFileAcceptsValidDatabases' ./boltstore/", seed, verifySeedVar, seed)
		}
		keys := slices.Sorted(func(yield func(string) bool) {
			for k := range c.shapes {
				if !yield(k) {
					return
				}
			}
		})
		t.Logf("seed %d: %d closed files and %d live ones checked (%d with pages leaked by bbolt)", seed, c.files, c.liveFiles, c.leakyFiles)
		for _, k := range keys {
			t.Logf("  %-40s %d", k, c.shapes[k])
		}
	})
	t.Run("bbolt", func(t *testing.T) {
		shapes := allBoltShapes()
		for i := range len(shapes) * scale {
			shape := shapes[i%len(shapes)]
			t.Run(fmt.Sprint(i, "/", shape), func(t *testing.T) {
				r := rand.New(rand.NewPCG(seed, uint64(i)))
				buildBoltFile(t, c, r, shape)
			})
		}
	})
	t.Run("boltstore", func(t *testing.T) {
		for i := range 3 * scale {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				r := rand.New(rand.NewPCG(seed, 1<<32+uint64(i)))
				churnStoreFile(t, c, r, i)
			})
		}
	})
}

// ignorable reports whether err is one a random operation may meet on a
// healthy database: a name taken by a bucket or a value, or not there.
func ignorable(err error) bool {
	return err == nil ||
		errors.Is(err, berrors.ErrBucketNotFound) ||
		errors.Is(err, berrors.ErrBucketExists) ||
		errors.Is(err, berrors.ErrIncompatibleValue) ||
		errors.Is(err, berrors.ErrSameBuckets)
}

// bucketName is one of the few names buckets have, so that random
// operations find each other's buckets.
func bucketName(r *rand.Rand) []byte { return fmt.Appendf(nil, "b%d", r.IntN(4)) }

// pickBucket returns a random bucket of tx, creating a top-level one if
// it picked a name no bucket has, and the names leading to it.
func pickBucket(tx *bolt.Tx, r *rand.Rand) ([][]byte, *bolt.Bucket, error) {
	name := bucketName(r)
	b := tx.Bucket(name)
	if b == nil {
		if !tx.Writable() {
			return nil, nil, nil
		}
		var err error
		if b, err = tx.CreateBucket(name); err != nil {
			return nil, nil, err
		}
	}
	path := [][]byte{name}
	for r.IntN(4) != 0 {
		name := bucketName(r)
		sub := b.Bucket(name)
		if sub == nil {
			break
		}
		b, path = sub, append(path, name)
	}
	return path, b, nil
}

// randKey is mostly short, from a small alphabet so that keys meet, and
// now and then long: as long as a page or more, up to bbolt's limit.
func randKey(r *rand.Rand, ps int) []byte {
	var n int
	switch r.IntN(20) {
	case 0:
		n = 100 + r.IntN(2000)
	case 1:
		n = 1 + r.IntN(min(bolt.MaxKeySize, 2*ps))
	default:
		n = 1 + r.IntN(12)
	}
	k := make([]byte, n)
	const alphabet = "abcdefg\x00\xff"
	for i := range k {
		k[i] = alphabet[r.IntN(len(alphabet))]
	}
	return k
}

// randValue is empty, small, about a page, or several pages.
func randValue(r *rand.Rand, ps int) []byte {
	var n int
	switch r.IntN(12) {
	case 0:
		return nil
	case 1:
		return []byte{}
	case 2:
		n = 1
	case 3, 4, 5, 6:
		n = r.IntN(64)
	case 7, 8:
		n = 64 + r.IntN(1024)
	case 9, 10:
		n = ps/2 + r.IntN(ps)
	default:
		n = 1 + r.IntN(3*ps)
	}
	v := bytes.Repeat([]byte{byte(r.Uint32())}, n)
	if n >= 8 {
		binary.LittleEndian.PutUint64(v, r.Uint64())
	}
	return v
}

// randomOp applies one random change to tx.
func randomOp(tx *bolt.Tx, r *rand.Rand, ps int) error {
	_, b, err := pickBucket(tx, r)
	if err != nil {
		return err
	}
	switch op := r.IntN(100); {
	case op < 45:
		err = b.Put(randKey(r, ps), randValue(r, ps))
	case op < 65: // delete a key, or a run of them
		c := b.Cursor()
		k, v := c.Seek(randKey(r, ps))
		for n := 1 + r.IntN(1+r.IntN(50)); k != nil && n > 0; n-- {
			if v != nil {
				err = c.Delete()
			}
			k, v = c.Next()
		}
	case op < 77:
		_, err = b.CreateBucketIfNotExists(bucketName(r))
	case op < 83:
		err = b.DeleteBucket(bucketName(r))
	case op < 85:
		err = tx.DeleteBucket(bucketName(r))
	case op < 92:
		if r.IntN(2) == 0 {
			_, err = b.NextSequence()
		} else {
			err = b.SetSequence(r.Uint64() >> r.IntN(64))
		}
	case op < 96: // grow: a run of keys in one bucket
		prefix := randKey(r, 16)
		for i := range 50 + r.IntN(400) {
			if err = b.Put(fmt.Appendf(prefix, "%06d", i), randValue(r, min(ps, 4096))); !ignorable(err) {
				return err
			}
		}
	default: // empty a bucket but for a few keys
		var keys [][]byte
		err = b.ForEach(func(k, v []byte) error {
			if v != nil && r.IntN(10) != 0 {
				keys = append(keys, k)
			}
			return nil
		})
		for _, k := range keys {
			if err = b.Delete(k); err != nil {
				break
			}
		}
	}
	if ignorable(err) {
		return nil
	}
	return err
}

// moveBucket moves a random bucket to another, never into itself.
func moveBucket(tx *bolt.Tx, r *rand.Rand) error {
	srcPath, src, err := pickBucket(tx, r)
	if err != nil {
		return err
	}
	dstPath, dst, err := pickBucket(tx, r)
	if err != nil {
		return err
	}
	child := bucketName(r)
	if len(dstPath) > len(srcPath) && slices.EqualFunc(dstPath[:len(srcPath)], srcPath, bytes.Equal) && bytes.Equal(dstPath[len(srcPath)], child) {
		return nil // into itself
	}
	if r.IntN(4) == 0 {
		dst = nil // to the top level
	}
	if err := tx.MoveBucket(child, src, dst); !ignorable(err) {
		return err
	}
	return nil
}

// nestBuckets makes a chain of depth buckets, the last holding a few
// keys (inline, if small enough).
func nestBuckets(tx *bolt.Tx, r *rand.Rand, depth, ps int) error {
	b, err := tx.CreateBucketIfNotExists([]byte("deep"))
	if err != nil {
		return err
	}
	for range depth - 1 {
		if b, err = b.CreateBucketIfNotExists([]byte("d")); err != nil {
			return err
		}
	}
	for range r.IntN(5) {
		if err := b.Put(randKey(r, 64), randValue(r, ps/8)); !ignorable(err) {
			return err
		}
	}
	return nil
}

// buildBoltFile writes a database of shape by random transactions,
// checking it as it goes.
func buildBoltFile(t *testing.T, c *validChecker, r *rand.Rand, shape boltShape) {
	dir := t.TempDir()
	path := filepath.Join(dir, "prop.db")
	ps := shape.pageSize
	db, err := bolt.Open(path, 0o600, shape.options(r))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { db.Close() }()
	for phase := range 2 + r.IntN(2) {
		for range 1 + r.IntN(4) {
			err := db.Update(func(tx *bolt.Tx) error {
				switch r.IntN(12) {
				case 0:
					return moveBucket(tx, r)
				case 1:
					if r.IntN(3) == 0 {
						// Deeper than a Store nests, and than
						// verifyFile once allowed.
						return nestBuckets(tx, r, 60+r.IntN(60), ps)
					}
					return nestBuckets(tx, r, 2+r.IntN(8), ps)
				}
				for range 1 + r.IntN(40) {
					if err := randomOp(tx, r, ps); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatalf("phase %d: %v", phase, err)
			}
			if r.IntN(3) == 0 {
				c.live(t, path, shape.String())
			}
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		want := c.closed(t, path, "bbolt "+shape.String())
		if r.IntN(3) == 0 {
			checkCopies(t, c, r, path, want)
		}
		if r.IntN(4) == 0 {
			checkTornMeta(t, c, path)
		}
		if t.Failed() {
			return
		}
		// Reopen, perhaps with the freelist kept otherwise: the page
		// size stays the file's.
		next := shape
		if r.IntN(3) == 0 {
			next.noFreelistSync = !next.noFreelistSync
		}
		if r.IntN(3) == 0 {
			next.freelist = bolt.FreelistArrayType
			if shape.freelist == next.freelist {
				next.freelist = bolt.FreelistMapType
			}
		}
		if db, err = bolt.Open(path, 0o600, next.options(r)); err != nil {
			t.Fatal(err)
		}
	}
}

// checkCopies checks copies of the closed database at path made by
// tx.WriteTo, tx.CopyFile and bolt.Compact (into a file of another page
// size), each holding what the original holds (digest want).
func checkCopies(t *testing.T, c *validChecker, r *rand.Rand, path string, want uint64) {
	t.Helper()
	src, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dir := filepath.Dir(path)
	writeTo := filepath.Join(dir, "writeto.db")
	copyFile := filepath.Join(dir, "copyfile.db")
	err = src.View(func(tx *bolt.Tx) error {
		f, err := os.Create(writeTo)
		if err != nil {
			return err
		}
		if _, err := tx.WriteTo(f); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		return tx.CopyFile(copyFile, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
	ps := propertyPageSizes[r.IntN(len(propertyPageSizes))]
	compacted := filepath.Join(dir, "compact.db")
	shape := boltShape{ps, r.IntN(2) == 0, bolt.FreelistArrayType}
	dst, err := bolt.Open(compacted, 0o600, shape.options(r))
	if err != nil {
		t.Fatal(err)
	}
	// A small txMaxSize commits the copy in many transactions.
	err = bolt.Compact(dst, src, []int64{0, 4096, 1 << 16}[r.IntN(3)])
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, cp := range []struct{ path, shape string }{
		{writeTo, "copy by tx.WriteTo"},
		{copyFile, "copy by tx.CopyFile"},
		{compacted, "copy by bolt.Compact"},
	} {
		got := c.closed(t, cp.path, cp.shape)
		if cp.path != compacted && got != want {
			t.Errorf("%s holds other contents than the original", cp.shape)
		}
		if err := os.Remove(cp.path); err != nil {
			t.Fatal(err)
		}
	}
}

// checkTornMeta checks a copy of the closed database at path whose newest
// meta page is damaged, as a write torn by a crash leaves it: bbolt opens
// such a file at the transaction before, whose pages that last
// transaction could not reuse.
func checkTornMeta(t *testing.T, c *validChecker, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m0, err := parseMeta(data[pageHeaderSize:])
	if err != nil {
		t.Fatal(err)
	}
	ps := int(m0.pageSize)
	m1, err := parseMeta(data[ps+pageHeaderSize:])
	if err != nil {
		t.Fatal(err)
	}
	if m0.txid < 2 && m1.txid < 2 {
		return // no transaction before the newest to fall back on
	}
	newest := 0
	if m1.txid > m0.txid {
		newest = ps
	}
	data[newest+pageHeaderSize+metaSumOffset] ^= 0xff
	torn := filepath.Join(filepath.Dir(path), "torn.db")
	if err := os.WriteFile(torn, data, 0o600); err != nil {
		t.Fatal(err)
	}
	c.closed(t, torn, "newest meta page torn")
	if err := os.Remove(torn); err != nil {
		t.Fatal(err)
	}
}

// churnStoreFile builds a Store's file by thousands of Begins, Completes,
// Releases, Extends, Deletes, Gets and Sweeps from several goroutines,
// reopening it several times, and checks it after each close. Round i
// starts from a file bbolt made with page size propertyPageSizes[i%4] and
// a foreign bucket or two.
func churnStoreFile(t *testing.T, c *validChecker, r *rand.Rand, round int) {
	path := filepath.Join(t.TempDir(), "store.db")
	shape := boltShape{propertyPageSizes[round%len(propertyPageSizes)], false, bolt.FreelistArrayType}
	db, err := bolt.Open(path, 0o600, shape.options(r))
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for range 50 {
			if err := randomOp(tx, r, shape.pageSize); err != nil {
				return err
			}
		}
		return nil
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	now := t0
	for reopen := range 3 {
		o := &Options{
			Bucket:        []string{"", "second"}[r.IntN(2)],
			MaxBatchSize:  []int{0, 1, 7, 64}[r.IntN(4)],
			SweepPerWrite: []int{-1, 0, 1, 16}[r.IntN(4)],
			SweepBatch:    []int{0, 10, 1000}[r.IntN(3)],
		}
		var s *Store
		workers, ops := 4, 300
		if reopen%2 == 0 {
			// Open as a service does: inspectFile, then bbolt with
			// syncs; fewer writes, each batch an fsync.
			workers, ops = 8, 20
			if s, err = Open(path, o); err != nil {
				c.fail(t, path, "Store file", fmt.Sprintf("Open = %v", err))
				return
			}
		} else {
			// The Store as Open makes it, but without fsyncs: the
			// same writes, faster.
			db, err := bolt.Open(path, 0o600, &bolt.Options{
				Timeout: time.Second, FreelistType: bolt.FreelistMapType, NoFreelistSync: true,
			})
			if err != nil {
				t.Fatal(err)
			}
			if s, err = New(db, o); err != nil {
				db.Close()
				t.Fatal(err)
			}
			// New refuses a DB with NoSync set; no commit runs yet.
			db.NoSync = true
		}
		err := churn(s, r.Uint64(), workers, ops, now)
		if cerr := s.Close(); err == nil {
			err = cerr
		}
		if db := s.DB(); !s.owned {
			if cerr := db.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Duration(workers*ops) * time.Second)
		c.closed(t, path, "Store file")
		if t.Failed() {
			return
		}
	}
}

// churn runs workers goroutines of ops random calls each on keys of a
// few thousand, the clock moving on so that leases and retention expire.
func churn(s *Store, seed uint64, workers, ops int, start time.Time) error {
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		r := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Go(func() {
			now := start
			for range ops {
				now = now.Add(time.Duration(r.IntN(3000)) * time.Millisecond)
				if err := churnOp(s, r, now); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func churnOp(s *Store, r *rand.Rand, now time.Time) error {
	key := fmt.Sprint("key-", r.IntN(3000))
	if r.IntN(50) == 0 {
		key += string(bytes.Repeat([]byte{'l'}, r.IntN(maxKeyLen-len(key))))
	}
	body := make([]byte, []int{0, 10, 300, 5000, 20000}[r.IntN(5)])
	var err error
	switch op := r.IntN(100); {
	case op < 50:
		var rec idempotency.Record
		var ok bool
		rec, ok, err = s.Begin(ctx, key, "fp", now, lease, retention)
		if err != nil || !ok {
			break
		}
		switch r.IntN(5) {
		case 0, 1, 2:
			err = s.Complete(ctx, key, rec.Token, idempotency.Response{Status: 200, Body: body}, now, retention)
		case 3:
			err = s.Release(ctx, key, rec.Token)
		default:
			err = s.Extend(ctx, key, rec.Token, now, lease)
		}
	case op < 70:
		err = s.Delete(ctx, key)
	case op < 90:
		_, err = s.Get(ctx, key, now)
	default:
		_, err = s.Sweep(ctx, now, 1+r.IntN(500))
	}
	if errors.Is(err, idempotency.ErrUnavailable) {
		return err
	}
	return nil
}

// verifyFile once refused buckets nested deeper than 64, where bbolt sets
// no limit: a valid file with such a bucket kept Open from opening it.
func TestVerifyFileAcceptsDeeplyNestedBuckets(t *testing.T) {
	for _, depth := range []int{64, 65, 200} {
		for _, inline := range []bool{true, false} {
			t.Run(fmt.Sprintf("depth=%d/inline=%t", depth, inline), func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "deep.db")
				db, err := bolt.Open(path, 0o600, nil)
				if err != nil {
					t.Fatal(err)
				}
				err = db.Update(func(tx *bolt.Tx) error {
					b, err := tx.CreateBucket([]byte("deep"))
					for i := 1; i < depth && err == nil; i++ {
						b, err = b.CreateBucket([]byte("d"))
					}
					if err != nil {
						return err
					}
					n := 1 // stays inline in its parent's value
					if !inline {
						n = 1000 // needs pages of its own
					}
					for i := range n {
						if err := b.Put(fmt.Appendf(nil, "k%06d", i), []byte("value")); err != nil {
							return err
						}
					}
					return nil
				})
				if cerr := db.Close(); err == nil {
					err = cerr
				}
				if err != nil {
					t.Fatal(err)
				}
				newValidChecker(0).closed(t, path, "deep buckets")
				s, err := Open(path, nil)
				if err != nil {
					t.Fatalf("Open of a file with buckets %d deep: %v", depth, err)
				}
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// A freelist of 0xFFFF ids or more keeps its count in its first element.
// The file is 64 MB: the hashmap freelist is tried too only when
// verifyScaleVar enlarges the run.
func TestVerifyFileAcceptsLongFreelist(t *testing.T) {
	types := []bolt.FreelistType{bolt.FreelistArrayType}
	if propertyScale(t) > 1 {
		types = append(types, bolt.FreelistMapType)
	}
	for _, ft := range types {
		t.Run(string(ft), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "free.db")
			const ps = 1024
			db, err := bolt.Open(path, 0o600, &bolt.Options{PageSize: ps, FreelistType: ft, NoSync: true})
			if err != nil {
				t.Fatal(err)
			}
			err = db.Update(func(tx *bolt.Tx) error {
				b, err := tx.CreateBucket([]byte("b"))
				if err != nil {
					return err
				}
				return b.Put([]byte("big"), make([]byte, 0x10010*ps))
			})
			if err == nil {
				err = db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("b")).Delete([]byte("big")) })
			}
			if cerr := db.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				t.Fatal(err)
			}
			c := newValidChecker(0)
			c.closed(t, path, "long freelist")
			// The test is about the long form: check it was written.
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			m0, err0 := parseMeta(data[pageHeaderSize:])
			m1, err1 := parseMeta(data[ps+pageHeaderSize:])
			if err0 != nil || err1 != nil {
				t.Fatal(err0, err1)
			}
			m := m0
			if m1.txid > m0.txid {
				m = m1
			}
			fl := data[int(m.freelist)*ps:]
			if n := binary.NativeEndian.Uint16(fl[10:]); n != 0xFFFF {
				t.Fatalf("freelist count %#x, want the long form 0xffff", n)
			}
		})
	}
}
