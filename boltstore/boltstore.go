// Package boltstore is an idempotency.Store kept in a bbolt file: the
// embedded default that survives restarts without running a server.
//
// Durability. Every Begin, Complete, Extend, Release and Delete that returns
// without error has been committed and fsynced: a crash right after it
// returns loses nothing (a killed process always; a power cut on a disk that
// honours fsync). Get reads a snapshot and writes nothing; like the answers
// Begin gives from a read transaction, it waits for a commit under way
// rather than answer from it before it is synced.
//
// Group commit. One write transaction, and so one fsync, runs at a time in a
// bbolt file. The Store therefore funnels writes through a single committer
// goroutine: while one transaction is syncing, the writes that arrive queue
// up, and the next transaction applies all of them (up to
// Options.MaxBatchSize) and pays one fsync for the lot. A lone writer waits
// for nobody (Options.MaxBatchDelay is 0 by default); under load the batch
// grows by itself to the number of callers waiting. Each write is decided
// inside the transaction that commits it, so batched writes see each other
// in order, exactly as if they had run one by one; a write that fails in the
// engine is taken out and the rest of its batch committed without it.
//
// Sweeping. Each record is indexed by its expiry (big-endian ExpiresAt, then
// key), so the records that left the window are the first entries of the
// index. Every Begin that writes and every Complete removes a few of them
// (Options.SweepPerWrite each), more than each adds, so as long as writes go
// on the file holds about the live window; Sweep removes a bounded backlog
// on demand, in transactions of Options.SweepBatch records so that writers
// never wait for long. Freed pages are reused by later writes; bbolt never shrinks the
// file, so its size follows the largest window it ever held.
//
// Time. Leases and expiry are judged by the now the caller passes, as the
// idempotency.Store contract says; the Store reads no clock.
//
// One process. bbolt locks its file (flock) for the DB that opened it, so a
// file serves one process at a time (and one Open within it): instances
// that must share a dedup window need redisstore or pgstore. Open waits
// Options.OpenTimeout for the lock and then fails with ErrUnavailable
// wrapping bbolt.ErrTimeout, saying that the file is locked and how long
// it waited. The kernel drops the lock of a process that
// dies, even by SIGKILL, so a restarted process opens the file at once.
//
// Crashes. A process killed at any moment (SIGKILL, a panic elsewhere)
// leaves a file that opens as of its last commit: every write acknowledged
// before the kill is there, and tokens go on from above every token handed
// out, since they come from a sequence committed with the claims.
//
// A damaged file. bbolt trusts its file and, given one cut short or
// overwritten, can kill the process inside its Open (a fault on a page
// past the end of the file). So Open first reads the file as bbolt would
// open it (its meta pages, freelist and the pages of every bucket) and
// refuses one that is not a whole bbolt database (truncated, a creation
// by an older build killed half way, zeros, random bytes, another kind of
// file) with an error naming the path and wrapping ErrUnavailable and
// ErrDamagedFile. It changes nothing in such a file: move it aside (or
// restore it from a backup) and open again. An empty file is made a new
// database, as bbolt always did. Open creates a new file whole under a
// temporary name (.NAME.creating-DIGITS) and links it into place; the
// temporary files of creations killed before their end are removed by a
// later Open of the same path.
//
// Errors. Engine failures (a closed store or DB, I/O errors, the file lock,
// a key longer than bbolt.MaxKeySize-8 bytes) wrap idempotency.ErrUnavailable
// together with bbolt's error (Get of such a key finds nothing:
// ErrNotFound). A write whose ctx ends while it waits for its commit
// returns an error wrapping ErrUnavailable and ctx.Err(): it may or may not
// have been applied.
//
// A failing disk. When a commit fails (the disk is full, a write or an
// fsync fails), every write of its batch fails with ErrUnavailable wrapping
// the native error (syscall.ENOSPC, syscall.EIO, ...); none is acknowledged.
// What happens next depends on how far bbolt got:
//
//   - It failed before writing the transaction's meta page: growing the
//     file, writing the new pages (ENOSPC on a full disk lands here), or
//     syncing them. bbolt writes a transaction to pages that no committed
//     transaction uses and makes it visible only by its meta page, so the
//     file, and bbolt's view of it, are still those of the last commit;
//     even pages a failed sync dropped are unused, and are written afresh
//     when reused. The Store stays open: reads answer as before, a failed
//     claim leaves nothing behind, and writes succeed again once the disk
//     has room.
//   - It wrote the meta page but could not sync it, or bbolt failed in a
//     way that leaves no usable view (a failed mmap, a panic). bbolt then
//     shows the failed transaction to every later one although the disk may
//     never hold it: Linux reports a failed writeback once and may drop the
//     pages while the page cache still shows them ("fsyncgate"). So the
//     Store fails closed: every later call returns an error wrapping
//     ErrUnavailable, ErrFailedClosed and the original error, and no answer
//     or write rests on that state, until the Store is closed and opened
//     again, which reads the file as it is on disk. With New, the caller
//     closes and reopens its DB too. Store.Failed reports this state, for a
//     liveness check (idemproxy's /healthz).
//
// An operator who sees ENOSPC frees space (or grows the volume); with
// ErrFailedClosed, or EIO, they also restart the process (or Close and Open
// the Store) once the disk works. Every write acknowledged before the
// failure is in the reopened file; a write that failed may or may not be,
// as ErrUnavailable always says.
package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/wire"
)

// Defaults for the zero values of Options' fields.
const (
	DefaultBucket        = "idempotency"
	DefaultOpenTimeout   = 5 * time.Second
	DefaultMaxBatchSize  = 256
	DefaultSweepPerWrite = 4
	DefaultSweepBatch    = 1000
)

// Options configure Open and New; nil means all defaults.
type Options struct {
	// Bucket is the name of the top-level bucket holding the records
	// ("": DefaultBucket). Stores with different buckets share a file
	// without seeing each other's keys (and each has its own group commit).
	// Two open Stores must not share one bucket: a Store's reads wait only
	// for its own commit under way, so they could answer from the other's
	// before it is synced. A bucket of that name holding anything else is
	// refused with ErrInvalidConfig.
	Bucket string
	// OpenTimeout is how long Open waits for the file lock held by another
	// process, or another Open in this one (0: DefaultOpenTimeout). New
	// ignores it.
	OpenTimeout time.Duration
	// MaxBatchSize bounds the writes applied by one transaction
	// (0: DefaultMaxBatchSize).
	MaxBatchSize int
	// MaxBatchDelay is how long the committer waits for more writes after
	// the first one of a batch (0: no wait; batches still form from the
	// writes that arrive while the previous commit syncs). A positive delay
	// trades the latency of every write for fewer fsyncs.
	MaxBatchDelay time.Duration
	// SweepPerWrite is how many expired records each Begin that writes and
	// each Complete removes (0: DefaultSweepPerWrite; negative: none,
	// leaving it all to Sweep).
	SweepPerWrite int
	// SweepBatch bounds the records one transaction of Sweep removes
	// (0: DefaultSweepBatch).
	SweepBatch int
}

// Store is an idempotency.Store in a bbolt file. It is safe for concurrent
// use; Close it to stop its committer.
type Store struct {
	db    *bolt.DB
	owned bool
	name  []byte

	maxBatch      int
	batchDelay    time.Duration
	sweepPerWrite int
	sweepBatch    int
	// solo makes every write its own transaction and fsync, with no group
	// commit: the baseline of the group-commit benchmark.
	solo bool
	// commits counts write transactions (each one fsync), for benchmarks.
	commits atomic.Uint64
	// pending is the committer's transaction under way, until its Update
	// returns; see read.
	pending atomic.Pointer[pendingCommit]
	// failed is set once, before the failed commit's pending is done, when
	// the Store fails closed; see failClosed.
	failed atomic.Pointer[error]

	reqs      chan *op
	quit      chan struct{}
	loopDone  chan struct{}
	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

var _ idempotency.Store = (*Store)(nil)

var (
	recordsBucket = []byte("r")
	expiryBucket  = []byte("x")
)

// errClosed is the native error of every call after Close.
var errClosed = fmt.Errorf("boltstore: store closed: %w", bolt.ErrDatabaseNotOpen)

// ErrFailedClosed is wrapped, with idempotency.ErrUnavailable and the error
// of the failed commit, by every call of a Store that stopped because a
// commit failed in a way that leaves bbolt showing what the disk may not
// hold (see "A failing disk" in the package documentation). Close the
// Store and open it again once the disk works; retrying on the same Store
// fails the same way.
var ErrFailedClosed = errors.New("boltstore: failed closed after a commit failed; close and reopen the store")

// maxKeyLen is the longest idempotency key stored: bbolt's key limit less
// the expiry index's 8-byte prefix.
const maxKeyLen = bolt.MaxKeySize - 8

// Open opens (creating if needed) the bbolt file at path and returns a
// Store that owns it: Close closes the file. The file is made durable in
// its directory (the directory is synced) before Open returns.
func Open(path string, opts *Options) (*Store, error) {
	return open(path, opts, syncDir)
}

// open is Open with the directory sync given, for tests.
func open(path string, opts *Options, syncDir func(dir string) error) (*Store, error) {
	o, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	if err := create(path); err != nil {
		return nil, fmt.Errorf("boltstore: open %s: create: %w: %w", path, idempotency.ErrUnavailable, err)
	}
	// bbolt trusts its file: a damaged one can kill the process inside
	// bolt.Open (see verifyFile), so it is checked first.
	start := time.Now()
	if err := inspectFile(path, o.OpenTimeout); err != nil {
		return nil, openError(path, o, err)
	}
	// OpenTimeout bounds the two waits for the lock together.
	lockWait := o.OpenTimeout
	if lockWait > 0 {
		lockWait = max(lockWait-time.Since(start), time.Millisecond) // 0 would wait for ever
	}
	db, err := boltOpen(path, &bolt.Options{
		Timeout: lockWait,
		// The sweep frees pages all the time; the hashmap freelist finds
		// free runs without scanning an array.
		FreelistType: bolt.FreelistMapType,
		// The freelist is not written with every commit but rebuilt from
		// the pages when the file is opened (as etcd does): commits write
		// fewer pages (about 1.3 to 1.5 times the new-key throughput at 64
		// callers), opening takes a scan of the file. Records and meta
		// pages are synced as before, so durability is unchanged.
		NoFreelistSync: true,
	})
	if err != nil {
		return nil, openError(path, o, err)
	}
	removeStaleTemps(path)
	// bbolt syncs a new file but not the directory entry that names it:
	// until the directory is synced, a power cut may take the file, and
	// every write acknowledged in it, away. The directory is synced on
	// every Open, not only when this Open created the file: a process
	// killed between bbolt's creating the file and this sync left a file
	// that looks like any other. A directory this process may search but
	// not read (a root-owned 0711 directory holding a service's file)
	// cannot be opened to be synced: its file system is synced instead.
	err = syncDir(filepath.Dir(path))
	if errors.Is(err, fs.ErrPermission) {
		err = syncFS(path)
	}
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("boltstore: open %s: sync directory: %w: %w", path, idempotency.ErrUnavailable, err)
	}
	s, err := newStore(db, o)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	s.owned = true
	return s, nil
}

// boltOpen is bolt.Open that turns a panic in it into an error: the
// checks of verifyFile leave none that we know of, but a process must not
// die of a file it was given.
func boltOpen(path string, opts *bolt.Options) (db *bolt.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("%w: bbolt panicked opening it: %v", ErrDamagedFile, r)
		}
	}()
	return bolt.Open(path, 0o600, opts)
}

// openError is the error of an Open of path that failed with err.
func openError(path string, o Options, err error) error {
	switch {
	case errors.Is(err, bolt.ErrTimeout):
		// bbolt's ErrTimeout says only "timeout"; the lock is what it
		// waited for.
		return fmt.Errorf("boltstore: open %s: %w: the file is locked by another process (or another Open in this one); gave up after %v (OpenTimeout): %w",
			path, idempotency.ErrUnavailable, o.OpenTimeout, err)
	case errors.Is(err, bolt.ErrInvalid), errors.Is(err, bolt.ErrChecksum), errors.Is(err, bolt.ErrVersionMismatch):
		// What verifyFile let through, bbolt refused: the same verdict.
		err = fmt.Errorf("%w: %w", ErrDamagedFile, err)
	}
	if errors.Is(err, ErrDamagedFile) {
		return fmt.Errorf("boltstore: open %s: %w: %w (the file was left as it is: move it aside or restore it, then open again)",
			path, idempotency.ErrUnavailable, err)
	}
	return fmt.Errorf("boltstore: open %s: %w: %w", path, idempotency.ErrUnavailable, err)
}

// create makes the bbolt file at path, if there is none, so that the name
// never shows a file bbolt has not finished: bbolt writes a new file's
// first pages in place, and a file cut short there (a full disk, a kill in
// the middle of the write, a power cut) has meta pages that name pages it
// lacks, on which every later bolt.Open faults (SIGBUS) and the process
// dies. So the file is made whole under a temporary name and then linked
// to path: a link fails if path exists, so a file another process created
// meanwhile is kept, not replaced. Where hard links are not supported,
// bbolt creates the file in place, as before. A crash before the
// temporary file is removed leaves it behind, for the next Open to remove
// (removeStaleTemps).
func create(path string) error {
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		return nil // it exists, or bolt.Open will report why not
	}
	dir, base := filepath.Split(path)
	f, err := os.CreateTemp(dir, tempPrefix(base)+"*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	// Once linked, path keeps the file; before, it is garbage.
	defer os.Remove(tmp)
	if err := f.Close(); err != nil {
		return err
	}
	db, err := bolt.Open(tmp, 0o600, nil) // writes and syncs the first pages
	if err != nil {
		return err
	}
	if err := db.Close(); err != nil {
		return err
	}
	if err := os.Link(tmp, path); err != nil && !errors.Is(err, fs.ErrExist) {
		var lerr *os.LinkError
		if errors.As(err, &lerr) && (errors.Is(lerr.Err, syscall.EPERM) || errors.Is(lerr.Err, syscall.ENOTSUP) ||
			errors.Is(lerr.Err, syscall.EOPNOTSUPP) || errors.Is(lerr.Err, syscall.EXDEV)) {
			return nil // no hard links here: bolt.Open creates path in place
		}
		if _, serr := os.Stat(path); errors.Is(err, fs.ErrNotExist) && serr == nil {
			// The Open of another process, which created path
			// meanwhile, took the temporary file for a dead one's.
			return nil
		}
		return err
	}
	return nil
}

// tempPrefix begins the names of the temporary files create makes for a
// file named base; os.CreateTemp ends them with decimal digits.
func tempPrefix(base string) string { return "." + base + ".creating-" }

// removeStaleTemps removes the temporary files that creations of path,
// in this build or an earlier one, left behind when they were killed:
// files named by tempPrefix and digits, next to path. It runs once Open
// holds path's lock, so path exists and a creation still under way
// elsewhere finds it and needs its temporary file no more (its link
// fails, and create takes path as it is). A file that another process
// holds locked (bbolt initializing it) is left alone. One that is path's
// file under a second name (a kill between the link and the removal) is
// only a name: removing it leaves path's file whole. Anything else by that
// name (a directory, a symbolic link) is left alone. It does its best and
// reports nothing: leftovers cost disk space, not correctness.
func removeStaleTemps(path string) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	d, err := os.Open(dir)
	if err != nil {
		return // a directory the process may search but not read
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	live, err := os.Lstat(path)
	if err != nil || !live.Mode().IsRegular() {
		// A path that is a symbolic link may name one of these files:
		// removing it would leave the link dangling.
		return
	}
	prefix := tempPrefix(base)
	for _, name := range names {
		digits, ok := strings.CutPrefix(name, prefix)
		if !ok || digits == "" || strings.Trim(digits, "0123456789") != "" {
			continue
		}
		tmp := filepath.Join(dir, name)
		fi, err := os.Lstat(tmp)
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		if !os.SameFile(fi, live) && lockedByOther(tmp) {
			continue
		}
		_ = os.Remove(tmp)
	}
}

// syncDir makes the entries of the directory dir durable.
func syncDir(dir string) error {
	if runtime.GOOS == "windows" {
		// NTFS journals directory entries, and Windows cannot fsync a
		// directory handle opened by os.
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// New returns a Store on the caller's open DB, which keeps owning it: Close
// stops the Store but leaves db open. db must be writable and must not have
// NoSync set, since the Store promises that acknowledged writes are on disk.
func New(db *bolt.DB, opts *Options) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: boltstore: nil DB", idempotency.ErrInvalidConfig)
	}
	o, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	if db.IsReadOnly() {
		return nil, fmt.Errorf("%w: boltstore: DB %s is read-only", idempotency.ErrInvalidConfig, db.Path())
	}
	if db.NoSync {
		return nil, fmt.Errorf("%w: boltstore: DB %s has NoSync set; acknowledged writes would not be durable",
			idempotency.ErrInvalidConfig, db.Path())
	}
	return newStore(db, o)
}

func (opts *Options) resolve() (Options, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Bucket == "" {
		o.Bucket = DefaultBucket
	}
	if o.OpenTimeout == 0 {
		o.OpenTimeout = DefaultOpenTimeout
	}
	if o.MaxBatchSize == 0 {
		o.MaxBatchSize = DefaultMaxBatchSize
	}
	if o.SweepPerWrite == 0 {
		o.SweepPerWrite = DefaultSweepPerWrite
	}
	if o.SweepBatch == 0 {
		o.SweepBatch = DefaultSweepBatch
	}
	bad := func(format string, args ...any) (Options, error) {
		return o, fmt.Errorf("%w: boltstore: "+format, append([]any{idempotency.ErrInvalidConfig}, args...)...)
	}
	switch {
	case len(o.Bucket) > bolt.MaxKeySize:
		return bad("Bucket name of %d bytes is too long", len(o.Bucket))
	case o.OpenTimeout < 0:
		return bad("OpenTimeout %v is negative", o.OpenTimeout)
	case o.MaxBatchSize < 0:
		return bad("MaxBatchSize %d is negative", o.MaxBatchSize)
	case o.MaxBatchDelay < 0:
		return bad("MaxBatchDelay %v is negative", o.MaxBatchDelay)
	case o.SweepBatch < 0:
		return bad("SweepBatch %d is negative", o.SweepBatch)
	}
	if o.SweepPerWrite < 0 {
		o.SweepPerWrite = 0
	}
	return o, nil
}

func newStore(db *bolt.DB, o Options) (*Store, error) {
	s := &Store{db: db, name: []byte(o.Bucket), maxBatch: o.MaxBatchSize, batchDelay: o.MaxBatchDelay,
		sweepPerWrite: o.SweepPerWrite, sweepBatch: o.SweepBatch,
		reqs: make(chan *op, min(o.MaxBatchSize, 1024)), quit: make(chan struct{}), loopDone: make(chan struct{})}
	// A bucket of that name that holds anything but a Store's two buckets
	// is someone else's: the Store would mix its buckets into it, and its
	// sweep would take a foreign index bucket for its own.
	var foreign error
	err := db.Update(func(tx *bolt.Tx) error {
		if top := tx.Bucket(s.name); top != nil {
			c := top.Cursor()
			for k, v := c.First(); k != nil; k, v = c.Next() {
				if v != nil || !bytes.Equal(k, recordsBucket) && !bytes.Equal(k, expiryBucket) {
					foreign = fmt.Errorf("%w: boltstore: bucket %q holds %q, which is not a Store's",
						idempotency.ErrInvalidConfig, o.Bucket, k)
					return foreign
				}
			}
		}
		top, err := tx.CreateBucketIfNotExists(s.name)
		if err != nil {
			return err
		}
		if _, err := top.CreateBucketIfNotExists(recordsBucket); err != nil {
			return err
		}
		_, err = top.CreateBucketIfNotExists(expiryBucket)
		return err
	})
	if foreign != nil {
		return nil, foreign
	}
	if err != nil {
		return nil, fmt.Errorf("boltstore: create bucket %q: %w: %w", o.Bucket, idempotency.ErrUnavailable, err)
	}
	go s.loop()
	return s, nil
}

// DB returns the bbolt database the Store writes to, for backups
// (Tx.WriteTo) and statistics. Writing to the Store's bucket behind its
// back, or closing a DB that Open opened, breaks the Store's guarantees.
func (s *Store) DB() *bolt.DB { return s.db }

// Close stops the committer, after the transaction under way, and closes the
// file if Open opened it (after the reads under way). A write that returned
// nil, before or during Close, is on disk; a write still queued either
// commits or fails with ErrUnavailable, unapplied, as do all calls after
// Close (they wrap bbolt.ErrDatabaseNotOpen too). Close is idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		close(s.quit)
		<-s.loopDone
		if s.owned {
			if err := s.db.Close(); err != nil {
				s.closeErr = fmt.Errorf("boltstore: close: %w", err)
			}
		}
	})
	return s.closeErr
}

// buckets are the two buckets of a Store inside one transaction.
type buckets struct {
	recs, exp *bolt.Bucket
}

func (s *Store) buckets(tx *bolt.Tx) (buckets, error) {
	top := tx.Bucket(s.name)
	if top == nil {
		return buckets{}, fmt.Errorf("boltstore: bucket %q is missing", s.name)
	}
	b := buckets{recs: top.Bucket(recordsBucket), exp: top.Bucket(expiryBucket)}
	if b.recs == nil || b.exp == nil {
		return buckets{}, fmt.Errorf("boltstore: bucket %q is damaged", s.name)
	}
	return b, nil
}

// recordKey is the key of a record: a 'k' before the idempotency key, since
// bbolt takes no empty key and the contract does.
func recordKey(key string) []byte {
	k := make([]byte, 0, 1+len(key))
	return append(append(k, 'k'), key...)
}

// expiryKey is the index entry of a record: ExpiresAt as a big-endian
// integer with its sign bit flipped, so that byte order is time order, and
// the idempotency key.
func expiryKey(at int64, key string) []byte {
	k := make([]byte, 8, 8+len(key))
	binary.BigEndian.PutUint64(k, uint64(at)^(1<<63))
	return append(k, key...)
}

func expiryAt(k []byte) int64 { return int64(binary.BigEndian.Uint64(k) ^ (1 << 63)) }

// put writes r under key; old is the index time of the record it replaces
// (hadOld false: none).
func (b buckets) put(key string, r *rec, old int64, hadOld bool) error {
	if hadOld && old != r.expiresAt {
		if err := b.exp.Delete(expiryKey(old, key)); err != nil {
			return err
		}
	}
	if err := b.recs.Put(recordKey(key), encode(nil, r)); err != nil {
		return err
	}
	ek := expiryKey(r.expiresAt, key)
	// An unchanged expiry keeps its entry, unless the entry is missing (a
	// file damaged, or written by a build with a bug): without it the
	// sweep would never remove the record. Checking costs a lookup, not a
	// write.
	if hadOld && old == r.expiresAt {
		// Not Get: it answers nil for an entry's nil value.
		if k, _ := b.exp.Cursor().Seek(ek); bytes.Equal(k, ek) {
			return nil
		}
	}
	return b.exp.Put(ek, nil)
}

func (b buckets) remove(key string, expiresAt int64) error {
	if err := b.exp.Delete(expiryKey(expiresAt, key)); err != nil {
		return err
	}
	return b.recs.Delete(recordKey(key))
}

// get returns key's record, if any.
func (b buckets) get(key string) (rec, bool, error) {
	v := b.recs.Get(recordKey(key))
	if v == nil {
		return rec{}, false, nil
	}
	r, err := decode(v)
	if err != nil {
		return rec{}, false, fmt.Errorf("key %q: %w", key, err)
	}
	return r, true, nil
}

// sweep removes up to limit records expired at now, oldest first, and
// reports how many it removed and whether due entries remain.
func (b buckets) sweep(now int64, limit int) (int, bool, error) {
	if limit <= 0 {
		return 0, false, nil
	}
	// Collect first, delete after: deleting under a cursor can skip entries.
	var due [][]byte
	c := b.exp.Cursor()
	k, _ := c.First()
	for ; k != nil && len(due) < limit; k, _ = c.Next() {
		if len(k) >= 8 && expiryAt(k) > now {
			break
		}
		due = append(due, bytes.Clone(k))
	}
	more := k != nil && (len(k) < 8 || expiryAt(k) <= now)
	removed := 0
	for _, ik := range due {
		if len(ik) >= 8 {
			at, key := expiryAt(ik), string(ik[8:])
			rk := recordKey(key)
			// A record is only removed by its own index entry: an entry
			// left by an older expiry (never written, but cheap to check)
			// must not remove a record that was given a later one.
			if v := b.recs.Get(rk); v != nil {
				if exp, err := expiryOf(v); err != nil || exp == at {
					if err := b.recs.Delete(rk); err != nil {
						return removed, more, err
					}
					removed++
				}
			}
		}
		if err := b.exp.Delete(ik); err != nil {
			return removed, more, err
		}
	}
	return removed, more, nil
}

// Begin implements idempotency.Store.
func (s *Store) Begin(ctx context.Context, key, fingerprint string, now time.Time, lease, retention time.Duration) (idempotency.Record, bool, error) {
	if err := s.checkKey("begin", key); err != nil {
		return idempotency.Record{}, false, err
	}
	n := unixNano(now)
	// Most Begins of a live key are answers, not claims (replays, in
	// flight, conflicts): a read transaction gives them without waiting for
	// a write and its fsync. The write below decides again under its lock.
	if a, ok, err := s.peek(ctx, key, fingerprint, n); err != nil || ok {
		return a, false, err
	}
	var (
		out     idempotency.Record
		claimed bool
	)
	err := s.write(ctx, "begin", func(b buckets) error {
		out, claimed = idempotency.Record{}, false
		if _, _, err := b.sweep(n, s.sweepPerWrite); err != nil {
			return err
		}
		cur, found, err := b.get(key)
		if err != nil {
			return err
		}
		if !found || n >= cur.expiresAt {
			tok, err := b.recs.NextSequence()
			if err != nil {
				return err
			}
			r := rec{state: stateProcessing, token: tok, leaseUntil: wire.After(n, lease),
				expiresAt: wire.After(n, retention), fp: fingerprint}
			if err := b.put(key, &r, cur.expiresAt, found); err != nil {
				return err
			}
			out, claimed = r.record(false), true
			return nil
		}
		if a, ok := answer(cur, n, fingerprint); ok {
			out = a
			return nil
		}
		// The holder's lease ran out: take over with a larger token.
		old := cur.expiresAt
		tok, err := b.recs.NextSequence()
		if err != nil {
			return err
		}
		cur.token = tok
		cur.leaseUntil = wire.After(n, lease)
		cur.expiresAt = max(cur.expiresAt, cur.leaseUntil)
		if err := b.put(key, &cur, old, true); err != nil {
			return err
		}
		out, claimed = cur.record(false), true
		return nil
	})
	if err != nil {
		return idempotency.Record{}, false, err
	}
	return out, claimed, nil
}

// pendingCommit is a write transaction of the committer: done is closed
// once its Update has returned, and so once it is on disk (or failed).
type pendingCommit struct {
	txid int
	done chan struct{}
}

// read returns key's record from a read transaction. bbolt shows a commit
// to new read transactions as soon as it has written its meta page, before
// syncing it: a snapshot of the commit under way is not used, read waits
// for that commit and reads again, so that no answer rests on a write a
// power cut could still undo. Unless useUnsynced, given the snapshot's
// answer, says it is fine as it is: peek, about to leave the decision to a
// write (which the committer orders after the commit under way), need not
// wait.
func (s *Store) read(ctx context.Context, key string, useUnsynced func(cur rec, found bool) bool) (cur rec, found bool, err error) {
	for {
		var txid int
		err = s.db.View(func(tx *bolt.Tx) error {
			txid = tx.ID()
			b, err := s.buckets(tx)
			if err != nil {
				return err
			}
			cur, found, err = b.get(key)
			return err
		})
		// The meta page is written under the lock that View takes to read
		// it, after pending was set: a snapshot of the commit under way
		// finds it here.
		p := s.pending.Load()
		// A commit that failed the Store closed did so before its pending
		// was cleared or done: this snapshot may show it.
		if ferr := s.failure(); ferr != nil {
			return rec{}, false, ferr
		}
		if err != nil || p == nil || p.txid != txid || useUnsynced != nil && useUnsynced(cur, found) {
			return cur, found, err
		}
		select {
		case <-p.done:
		case <-ctx.Done():
			return rec{}, false, ctx.Err()
		}
	}
}

// answer is Begin's answer for a live record cur when it does not claim
// the key: a conflict, a replay or in flight. ok is false when the key is
// to be claimed (the record expired, or its holder's lease ran out).
func answer(cur rec, n int64, fingerprint string) (idempotency.Record, bool) {
	switch {
	case n >= cur.expiresAt:
		return idempotency.Record{}, false
	case cur.fp != fingerprint:
		return idempotency.Record{State: idempotency.Conflict, Fingerprint: cur.fp,
			ExpiresAt: unixTime(cur.expiresAt)}, true
	case cur.state == stateDone:
		return cur.record(true), true
	case n < cur.leaseUntil:
		return cur.record(false), true
	}
	return idempotency.Record{}, false
}

// peek answers Begin from a read transaction when the key is live and not
// to be claimed.
func (s *Store) peek(ctx context.Context, key, fingerprint string, n int64) (idempotency.Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return idempotency.Record{}, false, fmt.Errorf("boltstore: begin: %w", err)
	}
	if s.closed.Load() {
		return idempotency.Record{}, false, fmt.Errorf("boltstore: begin: %w: %w", idempotency.ErrUnavailable, errClosed)
	}
	// A snapshot that says "claim" is not an answer: the claim's write
	// decides again after the commit under way, so it need not be synced,
	// and the write queues at once instead of a commit later.
	cur, found, err := s.read(ctx, key, func(cur rec, found bool) bool {
		if !found {
			return true
		}
		_, ok := answer(cur, n, fingerprint)
		return !ok
	})
	if err != nil {
		return idempotency.Record{}, false, fmt.Errorf("boltstore: begin: %w: %w", idempotency.ErrUnavailable, err)
	}
	if !found {
		return idempotency.Record{}, false, nil
	}
	a, ok := answer(cur, n, fingerprint)
	return a, ok, nil
}

// Complete implements idempotency.Store.
func (s *Store) Complete(ctx context.Context, key string, token uint64, resp idempotency.Response, now time.Time, retention time.Duration) error {
	n := unixNano(now)
	// Encoding copies resp, so the store keeps no memory of the caller's.
	return s.writeClaim(ctx, "complete", key, token, func(b buckets, cur rec) error {
		old := cur.expiresAt
		cur.state = stateDone
		cur.resp = resp
		cur.leaseUntil = 0
		cur.expiresAt = wire.After(n, retention)
		if err := b.put(key, &cur, old, true); err != nil {
			return err
		}
		_, _, err := b.sweep(n, s.sweepPerWrite)
		return err
	})
}

// Extend implements idempotency.Store.
func (s *Store) Extend(ctx context.Context, key string, token uint64, now time.Time, lease time.Duration) error {
	n := unixNano(now)
	return s.writeClaim(ctx, "extend", key, token, func(b buckets, cur rec) error {
		old := cur.expiresAt
		cur.leaseUntil = wire.After(n, lease)
		cur.expiresAt = max(cur.expiresAt, cur.leaseUntil)
		return b.put(key, &cur, old, true)
	})
}

// Release implements idempotency.Store.
func (s *Store) Release(ctx context.Context, key string, token uint64) error {
	return s.writeClaim(ctx, "release", key, token, func(b buckets, cur rec) error {
		return b.remove(key, cur.expiresAt)
	})
}

// writeClaim applies change, in one write, to the key's Processing claim
// named by token; any other record, or none, gives ErrLeaseLost and changes
// nothing. Like every write function it may run more than once, so the
// verdict is reset at the top.
func (s *Store) writeClaim(ctx context.Context, op, key string, token uint64, change func(b buckets, cur rec) error) error {
	if err := s.checkKey(op, key); err != nil {
		return err
	}
	var lost bool
	err := s.write(ctx, op, func(b buckets) error {
		lost = false
		cur, found, err := b.get(key)
		if err != nil {
			return err
		}
		if !found || cur.token != token || cur.state != stateProcessing {
			lost = true
			return nil
		}
		return change(b, cur)
	})
	if err != nil {
		return err
	}
	if lost {
		return fmt.Errorf("boltstore: %s %q: %w", op, key, idempotency.ErrLeaseLost)
	}
	return nil
}

// Delete implements idempotency.Store. It removes a record even if it cannot
// be decoded; the index entry it leaves is dropped by the sweep.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := s.checkKey("delete", key); err != nil {
		return err
	}
	return s.write(ctx, "delete", func(b buckets) error {
		v := b.recs.Get(recordKey(key))
		if v == nil {
			return nil
		}
		if at, err := expiryOf(v); err == nil {
			return b.remove(key, at)
		}
		return b.recs.Delete(recordKey(key))
	})
}

// Get implements idempotency.Store. It reads a snapshot (db.View) without
// queueing behind the writes, though, like Begin's answers, it waits for a
// commit under way to be synced rather than answer from it.
func (s *Store) Get(ctx context.Context, key string, now time.Time) (idempotency.Record, error) {
	if err := ctx.Err(); err != nil {
		return idempotency.Record{}, fmt.Errorf("boltstore: get: %w", err)
	}
	if s.closed.Load() {
		return idempotency.Record{}, fmt.Errorf("boltstore: get: %w: %w", idempotency.ErrUnavailable, errClosed)
	}
	if ferr := s.failure(); ferr != nil {
		return idempotency.Record{}, fmt.Errorf("boltstore: get: %w: %w", idempotency.ErrUnavailable, ferr)
	}
	if len(key) > maxKeyLen {
		return idempotency.Record{}, fmt.Errorf("boltstore: get: key of %d bytes: %w", len(key), idempotency.ErrNotFound)
	}
	cur, found, err := s.read(ctx, key, nil)
	if err != nil {
		return idempotency.Record{}, fmt.Errorf("boltstore: get: %w: %w", idempotency.ErrUnavailable, err)
	}
	if !found || unixNano(now) >= cur.expiresAt {
		return idempotency.Record{}, fmt.Errorf("boltstore: get %q: %w", key, idempotency.ErrNotFound)
	}
	return cur.record(cur.state == stateDone), nil
}

// Sweep removes up to limit records that expired at now (limit <= 0: all of
// them), in transactions of at most Options.SweepBatch records that queue
// with other writes, so writers wait for one short transaction at most. It
// returns how many records it removed. Call it from a timer when writes are
// too rare to keep the file small through their own sweeping.
func (s *Store) Sweep(ctx context.Context, now time.Time, limit int) (int, error) {
	n := unixNano(now)
	total := 0
	for limit <= 0 || total < limit {
		chunk := s.sweepBatch
		if limit > 0 {
			chunk = min(chunk, limit-total)
		}
		var (
			removed int
			more    bool
		)
		err := s.write(ctx, "sweep", func(b buckets) error {
			var err error
			removed, more, err = b.sweep(n, chunk)
			return err
		})
		if err != nil {
			return total, err
		}
		total += removed
		if !more {
			break
		}
	}
	return total, nil
}

// checkKey refuses a key longer than the limit, after what every call
// says first: that the Store is closed, or failed closed.
func (s *Store) checkKey(op, key string) error {
	if s.closed.Load() {
		return fmt.Errorf("boltstore: %s: %w: %w", op, idempotency.ErrUnavailable, errClosed)
	}
	if ferr := s.failure(); ferr != nil {
		return fmt.Errorf("boltstore: %s: %w: %w", op, idempotency.ErrUnavailable, ferr)
	}
	if len(key) > maxKeyLen {
		return fmt.Errorf("boltstore: %s: %w: %w (key of %d bytes, limit %d)",
			op, idempotency.ErrUnavailable, bolt.ErrKeyTooLarge, len(key), maxKeyLen)
	}
	return nil
}

// op is one write waiting for its commit.
type op struct {
	ctx context.Context
	// fn decides and applies the write inside a transaction. It may run
	// more than once (when another write of its batch fails, the batch is
	// rolled back and re-run), so it resets its results first. It returns
	// an error only for an engine failure, which fails this write alone.
	fn  func(buckets) error
	err error // set by the committer before done is closed
	// skipped is set by apply when the caller's ctx had ended, so fn did
	// not run: the caller must not take done for an acknowledgement.
	skipped bool
	done    chan struct{}
}

// apply runs o in tx unless its caller has gone. A panic in o is o's error
// alone: like an engine failure it rolls the batch back and takes o out, so
// that a bug in one write does not fail every write batched with it.
func (s *Store) apply(tx *bolt.Tx, o *op) (err error) {
	o.skipped = o.ctx.Err() != nil // reset on every run of the batch
	if o.skipped {
		return nil // the caller returned already; change nothing
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("boltstore: panic in a write: %v", r)
		}
	}()
	b, err := s.buckets(tx)
	if err != nil {
		return err
	}
	return o.fn(b)
}

// write runs fn in a committed, fsynced transaction, shared with the other
// writes waiting at that moment.
func (s *Store) write(ctx context.Context, name string, fn func(buckets) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("boltstore: %s: %w", name, err)
	}
	if s.closed.Load() {
		return fmt.Errorf("boltstore: %s: %w: %w", name, idempotency.ErrUnavailable, errClosed)
	}
	if ferr := s.failure(); ferr != nil {
		return fmt.Errorf("boltstore: %s: %w: %w", name, idempotency.ErrUnavailable, ferr)
	}
	if s.solo {
		s.commits.Add(1)
		err := s.update(func(tx *bolt.Tx) error {
			b, err := s.buckets(tx)
			if err != nil {
				return err
			}
			return fn(b)
		})
		if err != nil {
			return fmt.Errorf("boltstore: %s: %w: %w", name, idempotency.ErrUnavailable, err)
		}
		return nil
	}
	o := &op{ctx: ctx, fn: fn, done: make(chan struct{})}
	select {
	case s.reqs <- o:
	case <-s.quit:
		return fmt.Errorf("boltstore: %s: %w: %w", name, idempotency.ErrUnavailable, errClosed)
	case <-ctx.Done():
		return fmt.Errorf("boltstore: %s: %w", name, ctx.Err())
	}
	select {
	case <-o.done:
	case <-ctx.Done():
		// The write may be in the transaction being committed.
		return fmt.Errorf("boltstore: %s: %w: %w", name, idempotency.ErrUnavailable, ctxErr(ctx))
	case <-s.loopDone:
		// The committer stopped: it closes done for every write it took
		// (and for those left queued), so one not done was never applied.
		select {
		case <-o.done:
		default:
			return fmt.Errorf("boltstore: %s: %w: %w", name, idempotency.ErrUnavailable, errClosed)
		}
	}
	if o.err != nil {
		return fmt.Errorf("boltstore: %s: %w: %w", name, idempotency.ErrUnavailable, o.err)
	}
	if o.skipped {
		// done and ctx.Done were both ready and select took done: the
		// write was skipped, not applied.
		return fmt.Errorf("boltstore: %s: %w: %w", name, idempotency.ErrUnavailable, ctxErr(ctx))
	}
	return nil
}

// ctxErr is ctx.Err(), which the package doc promises a write whose ctx
// ended wraps, and the ctx's cause when it has one of its own.
func ctxErr(ctx context.Context) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return fmt.Errorf("%w: %w", err, cause)
	}
	return err
}

// loop is the committer: it takes the writes that are waiting, applies them
// in one transaction and wakes their callers once it is on disk.
func (s *Store) loop() {
	defer close(s.loopDone)
	batch := make([]*op, 0, min(s.maxBatch, 1024))
	var timer *time.Timer
	for {
		select {
		case o := <-s.reqs:
			batch = append(batch[:0], o)
		case <-s.quit:
			s.failQueued()
			return
		}
		if s.batchDelay > 0 {
			if timer == nil {
				timer = time.NewTimer(s.batchDelay)
			} else {
				timer.Reset(s.batchDelay)
			}
		gather:
			for len(batch) < s.maxBatch {
				select {
				case o := <-s.reqs:
					batch = append(batch, o)
				case <-timer.C:
					break gather
				case <-s.quit:
					break gather // commit what was taken, then stop
				}
			}
			timer.Stop()
		} else {
		drain:
			for len(batch) < s.maxBatch {
				select {
				case o := <-s.reqs:
					batch = append(batch, o)
				default:
					break drain
				}
			}
		}
		s.commit(batch)
		clear(batch)
	}
}

// failQueued fails the writes left in the queue when the committer stops.
// A write queued after this finds the committer gone (see write).
func (s *Store) failQueued() {
	for {
		select {
		case o := <-s.reqs:
			o.err = errClosed
			close(o.done)
		default:
			return
		}
	}
}

// update is db.Update that turns a panic into an error: the committer must
// outlive a bug in one write, or every later caller would wait forever. It
// marks its transaction pending until Update has returned (see read). A
// transaction that failed is checked by failClosed before it is done, so
// that no reader waiting for it answers from it.
func (s *Store) update(fn func(*bolt.Tx) error) (err error) {
	var (
		p      *pendingCommit
		fnDone bool // fn returned: a panic after it is bbolt's
	)
	defer func() {
		bboltPanic := false
		if r := recover(); r != nil {
			err = fmt.Errorf("boltstore: panic in a write transaction: %v", r)
			bboltPanic = fnDone
		}
		if p != nil {
			if err != nil {
				s.failClosed(p.txid, err, bboltPanic)
			}
			s.pending.CompareAndSwap(p, nil)
			close(p.done)
		}
	}()
	return s.db.Update(func(tx *bolt.Tx) error {
		p = &pendingCommit{txid: tx.ID(), done: make(chan struct{})}
		s.pending.Store(p)
		err := fn(tx)
		fnDone = true
		return err
	})
}

// failClosed decides, after the write transaction txid failed with err,
// whether the Store can go on, and fails it closed if not.
//
// bbolt (v1.5, Tx.Commit) writes a transaction in order: new pages, which
// no committed transaction uses, then fdatasync, then the meta page that
// makes the transaction current, then fdatasync again. A failure before the
// meta page is written (spill, grow, a page write or its sync) is rolled
// back and leaves the last commit current on disk and in memory: safe to
// go on (and a write's own error, which rolls back before Commit, is too).
// Once the meta page has reached the page cache, bbolt reads it back from
// its mmap: later transactions, read and write, start from the failed one,
// whose meta page the disk may not have (the sync failed) and never get
// unless a later commit happens to supersede it. A read transaction tells
// the two apart: it starts at the current meta page's transaction. One
// that cannot start (bbolt lost its mmap) or a panic inside bbolt leaves
// nothing to trust either.
func (s *Store) failClosed(txid int, err error, bboltPanic bool) {
	if !bboltPanic {
		shown := -1
		verr := s.db.View(func(tx *bolt.Tx) error {
			shown = tx.ID()
			return nil
		})
		if verr == nil && shown < txid {
			return
		}
		if verr != nil {
			err = fmt.Errorf("%w (then a read failed: %w)", err, verr)
		}
	}
	ferr := fmt.Errorf("%w: transaction %d: %w", ErrFailedClosed, txid, err)
	s.failed.CompareAndSwap(nil, &ferr)
}

// Failed returns the error with which the Store failed closed (it wraps
// ErrFailedClosed and the failed commit's error), or nil while the Store
// works. Unlike a store that cannot be reached, a Store that failed closed
// stays so until it is reopened: a process that finds it set should
// restart (idemproxy's /healthz then fails, so that its supervisor
// restarts it).
func (s *Store) Failed() error { return s.failure() }

// failure is the error every call returns once the Store failed closed,
// or nil.
func (s *Store) failure() error {
	if p := s.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// commit applies ops in one transaction. A write that fails is taken out
// and the rest re-run, so that one bad write does not fail its neighbours.
func (s *Store) commit(ops []*op) {
	for len(ops) > 0 {
		if ferr := s.failure(); ferr != nil {
			// Nothing more is written on a state the disk may not hold.
			for _, o := range ops {
				o.err = ferr
				close(o.done)
			}
			return
		}
		failed := -1
		var ferr error
		s.commits.Add(1)
		err := s.update(func(tx *bolt.Tx) error {
			for i, o := range ops {
				if err := s.apply(tx, o); err != nil {
					failed, ferr = i, err
					return err
				}
			}
			return nil
		})
		if failed >= 0 {
			o := ops[failed]
			o.err = ferr
			close(o.done)
			ops = append(ops[:failed], ops[failed+1:]...)
			continue
		}
		if ferr := s.failure(); err != nil && ferr != nil {
			err = ferr // it wraps err, and says the Store must be reopened
		}
		for _, o := range ops {
			o.err = err
			close(o.done)
		}
		return
	}
}
