package boltstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"runtime/debug"
	"slices"
	"time"
)

// ErrDamagedFile is wrapped, with idempotency.ErrUnavailable, by the error
// of an Open that found at its path a file that is not a whole bbolt
// database: cut short (a truncated copy, or a creation by an older build
// killed half way), zeroed, overwritten, or another kind of file. Open
// leaves such a file exactly as it found it and opens nothing: retrying
// fails the same way. Move the file aside (or restore it from a backup) and
// Open again; a new, empty file is then created in its place.
var ErrDamagedFile = errors.New("boltstore: not a whole bbolt database")

// The bbolt file format (version 2), as far as verifyFile reads it. bbolt
// writes its structures in the machine's byte order.
const (
	boltMagic        = 0xED0CDAED
	boltVersion      = 2
	pageHeaderSize   = 16 // id u64, flags u16, count u16, overflow u32
	elementSize      = 16 // branch: pos, ksize u32, pgid u64; leaf: flags, pos, ksize, vsize u32
	metaSize         = 64 // magic, version, pageSize, flags u32, root u64, sequence u64, freelist, pgid, txid, checksum u64
	metaSumOffset    = 56
	branchPageFlag   = 0x01
	leafPageFlag     = 0x02
	freelistPageFlag = 0x10
	bucketLeafFlag   = 0x01
	noFreelist       = ^uint64(0)
)

var nativeEndian = binary.NativeEndian

// boltMeta is the part of a meta page verifyFile needs.
type boltMeta struct {
	pageSize uint32
	root     uint64
	freelist uint64
	pgid     uint64 // the high water mark: pages at and above it are unused
	txid     uint64
}

// parseMeta reads a meta page's body (after its page header) and reports
// why bbolt would not take it, if it would not.
func parseMeta(b []byte) (boltMeta, error) {
	if len(b) < metaSize {
		return boltMeta{}, errors.New("meta page cut short")
	}
	if nativeEndian.Uint32(b[0:]) != boltMagic {
		return boltMeta{}, errors.New("no bbolt magic number")
	}
	if v := nativeEndian.Uint32(b[4:]); v != boltVersion {
		return boltMeta{}, fmt.Errorf("bbolt format version %d, want %d", v, boltVersion)
	}
	h := fnv.New64a()
	h.Write(b[:metaSumOffset])
	if h.Sum64() != nativeEndian.Uint64(b[metaSumOffset:]) {
		return boltMeta{}, errors.New("meta page checksum mismatch")
	}
	return boltMeta{
		pageSize: nativeEndian.Uint32(b[8:]),
		root:     nativeEndian.Uint64(b[16:]),
		freelist: nativeEndian.Uint64(b[32:]),
		pgid:     nativeEndian.Uint64(b[40:]),
		txid:     nativeEndian.Uint64(b[48:]),
	}, nil
}

// verifyFile checks, by plain reads, that the non-empty file f of size
// bytes is a whole bbolt database: that bbolt can open it without reading
// past its end or off its pages. bbolt trusts its file: it maps it into
// memory and, opening it (without a synced freelist, as Open does), walks
// every page of every bucket in a goroutine of its own, where a page cut
// off by a truncation faults (SIGBUS) and a page that is not what it
// should be fails an assertion; either kills the process, and no recover
// can catch it. So Open checks first what bbolt's open reads: the meta
// pages (the one bbolt will use, as it chooses), the freelist page if the
// file has one, and the tree of pages of every bucket, each page inside
// the file, below the high water mark, of its kind, named once, its
// elements inside it and its keys in order.
func verifyFile(f io.ReaderAt, size int64) error {
	// bbolt finds the page size in the first meta page, or failing that
	// in the second, trying each power of two from 1 KiB.
	var m0buf [pageHeaderSize + metaSize]byte
	if err := readAt(f, m0buf[:], 0); err != nil {
		return fmt.Errorf("%w: cannot read its first meta page (%d bytes): %w", ErrDamagedFile, size, err)
	}
	m0, err0 := parseMeta(m0buf[pageHeaderSize:])
	ps := int64(m0.pageSize)
	if err0 != nil {
		for i := 0; i <= 14; i++ {
			pos := int64(1024) << i
			var buf [pageHeaderSize + metaSize]byte
			if pos+int64(len(buf)) > size {
				break
			}
			if err := readAt(f, buf[:], pos); err != nil {
				return fmt.Errorf("%w: %w", ErrDamagedFile, err)
			}
			if m, err := parseMeta(buf[pageHeaderSize:]); err == nil && int64(m.pageSize) == pos {
				ps = pos
				break
			}
		}
		if ps == 0 {
			return fmt.Errorf("%w: no valid meta page (first: %w)", ErrDamagedFile, err0)
		}
	}
	if ps < pageHeaderSize+metaSize || ps > 1<<30 {
		return fmt.Errorf("%w: page size %d", ErrDamagedFile, ps)
	}
	if size < 2*ps {
		return fmt.Errorf("%w: %d bytes, less than its two meta pages of %d", ErrDamagedFile, size, ps)
	}
	var m1buf [pageHeaderSize + metaSize]byte
	if err := readAt(f, m1buf[:], ps); err != nil {
		return fmt.Errorf("%w: %w", ErrDamagedFile, err)
	}
	m1, err1 := parseMeta(m1buf[pageHeaderSize:])
	// bbolt uses the meta page of the later transaction if it is valid,
	// else the other one.
	meta, errM := m0, err0
	other, errO := m1, err1
	if m1.txid > m0.txid {
		meta, errM, other, errO = m1, err1, m0, err0
	}
	if errM != nil {
		meta, errM = other, errO
	}
	if errM != nil {
		return fmt.Errorf("%w: no valid meta page (first: %w; second: %w)", ErrDamagedFile, err0, err1)
	}
	if meta.pgid < 3 || uint64(size)/uint64(ps) < meta.pgid {
		return fmt.Errorf("%w: %d bytes, cut short: its meta page (transaction %d) names %d pages of %d bytes",
			ErrDamagedFile, size, meta.txid, meta.pgid, ps)
	}
	v := verifier{f: f, size: size, ps: ps, hwm: meta.pgid, seen: make([]uint64, (meta.pgid+63)/64)}
	if meta.freelist != noFreelist {
		if err := v.freelist(meta.freelist); err != nil {
			return fmt.Errorf("%w: transaction %d: %w", ErrDamagedFile, meta.txid, err)
		}
	}
	if err := v.tree(meta.root); err != nil {
		return fmt.Errorf("%w: transaction %d: %w", ErrDamagedFile, meta.txid, err)
	}
	return nil
}

// verifier walks the pages of one meta page's transaction.
type verifier struct {
	f    io.ReaderAt
	size int64
	ps   int64
	hwm  uint64
	seen []uint64 // a bit per page below hwm: named by a page already read
}

// page reads page id with its overflow pages, checking that it lies in the
// file below the high water mark, names itself, is of one of the kinds
// kinds (bbolt sets exactly one flag) and is named by no other page.
func (v *verifier) page(id uint64, kinds ...uint16) ([]byte, error) {
	if id < 2 || id >= v.hwm {
		return nil, fmt.Errorf("page %d outside pages 2 to %d", id, v.hwm-1)
	}
	// One read for the page, and one more for its overflow pages if it
	// has any: the file holds at least hwm pages (verifyFile checked).
	mem, mapped := v.f.(memFile)
	var buf []byte
	if mapped {
		buf = mem[int64(id)*v.ps:][:v.ps:v.ps]
	} else {
		buf = make([]byte, v.ps)
		if err := readAt(v.f, buf, int64(id)*v.ps); err != nil {
			return nil, fmt.Errorf("page %d: %w", id, err)
		}
	}
	hdr := buf[:pageHeaderSize]
	if got := nativeEndian.Uint64(hdr[0:]); got != id {
		return nil, fmt.Errorf("page %d says it is page %d", id, got)
	}
	if got := nativeEndian.Uint16(hdr[8:]); !slices.Contains(kinds, got) {
		return nil, fmt.Errorf("page %d has flags %#x, want one of %#x", id, got, kinds)
	}
	n := uint64(nativeEndian.Uint32(hdr[12:])) + 1
	if n > v.hwm-id {
		return nil, fmt.Errorf("page %d and its %d overflow pages pass the high water mark %d", id, n-1, v.hwm)
	}
	for i := id; i < id+n; i++ {
		if v.seen[i/64]&(1<<(i%64)) != 0 {
			return nil, fmt.Errorf("page %d named twice", i)
		}
		v.seen[i/64] |= 1 << (i % 64)
	}
	switch {
	case n > 1 && mapped:
		buf = mem[int64(id)*v.ps:][:int64(n)*v.ps]
	case n > 1:
		buf = append(buf, make([]byte, int64(n-1)*v.ps)...)
		if err := readAt(v.f, buf[v.ps:], int64(id+1)*v.ps); err != nil {
			return nil, fmt.Errorf("page %d: %w", id, err)
		}
	}
	return buf, nil
}

func (v *verifier) freelist(id uint64) error {
	p, err := v.page(id, freelistPageFlag)
	if err != nil {
		return fmt.Errorf("freelist: %w", err)
	}
	n, ids := uint64(nativeEndian.Uint16(p[10:])), p[pageHeaderSize:]
	if n == 0xFFFF { // the count is the first element
		if len(ids) < 8 {
			return fmt.Errorf("freelist page %d cut short", id)
		}
		n, ids = nativeEndian.Uint64(ids), ids[8:]
	}
	if n > uint64(len(ids))/8 {
		return fmt.Errorf("freelist page %d: %d ids do not fit in it", id, n)
	}
	for i := range n {
		if free := nativeEndian.Uint64(ids[8*i:]); free < 2 || free >= v.hwm {
			return fmt.Errorf("freelist page %d: free page %d outside pages 2 to %d", id, free, v.hwm-1)
		}
	}
	return nil
}

// tree checks the bucket whose root page is root.
//
// Buckets may nest as deep as their owner likes: bbolt sets no limit, so
// neither may this walk (it once refused buckets nested over 64 deep, and
// so a valid file). The walk ends all the same: verifier.page reads each page at
// most once, and a bucket inline in its parent's value is shorter than
// that value, so what a walk follows is bounded by the file's pages.
func (v *verifier) tree(root uint64) error {
	p, err := v.page(root, branchPageFlag, leafPageFlag)
	if err != nil {
		return err
	}
	return v.node(p, root)
}

// node checks page p (id, or 0 for a bucket inline in its parent's value)
// and what it leads to.
func (v *verifier) node(p []byte, id uint64) error {
	if len(p) < pageHeaderSize {
		return fmt.Errorf("page %d cut short", id)
	}
	flags, count := nativeEndian.Uint16(p[8:]), int(nativeEndian.Uint16(p[10:]))
	if id == 0 && flags != leafPageFlag {
		return fmt.Errorf("inline page has flags %#x, want %#x", flags, leafPageFlag)
	}
	if pageHeaderSize+count*elementSize > len(p) {
		return fmt.Errorf("page %d: %d elements do not fit in it", id, count)
	}
	var prev []byte
	for i := range count {
		e := pageHeaderSize + i*elementSize
		el := p[e : e+elementSize]
		var pos, ksize, vsize uint64
		if flags == branchPageFlag {
			pos, ksize = uint64(nativeEndian.Uint32(el[0:])), uint64(nativeEndian.Uint32(el[4:]))
		} else {
			pos, ksize, vsize = uint64(nativeEndian.Uint32(el[4:])), uint64(nativeEndian.Uint32(el[8:])), uint64(nativeEndian.Uint32(el[12:]))
		}
		start := uint64(e) + pos
		if start+ksize+vsize > uint64(len(p)) {
			return fmt.Errorf("page %d: element %d lies past the page", id, i)
		}
		key, val := p[start:start+ksize], p[start+ksize:start+ksize+vsize]
		if i > 0 && bytes.Compare(prev, key) > 0 {
			return fmt.Errorf("page %d: keys out of order at element %d", id, i)
		}
		prev = key
		switch {
		case flags == branchPageFlag:
			if err := v.tree(nativeEndian.Uint64(el[8:])); err != nil {
				return err
			}
		case nativeEndian.Uint32(el[0:])&bucketLeafFlag != 0:
			if len(val) < 16 {
				return fmt.Errorf("page %d: bucket %q has a value of %d bytes", id, key, len(val))
			}
			if r := nativeEndian.Uint64(val); r != 0 {
				if err := v.tree(r); err != nil {
					return err
				}
			} else if err := v.node(val[16:], 0); err != nil {
				return fmt.Errorf("inline bucket %q: %w", key, err)
			}
		}
	}
	return nil
}

// inspectFile verifies the file at path, if it exists and is not empty
// (bbolt makes an empty file a database), under a shared lock so that no
// process writes it meanwhile. It waits timeout for the lock and returns
// bbolt.ErrTimeout after it.
func inspectFile(path string, timeout time.Duration) (err error) {
	if fi, err := os.Stat(path); err == nil && !fi.Mode().IsRegular() {
		// Opening a FIFO to read would wait for a writer for ever: what
		// is not a file is left to bolt.Open to refuse.
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil // bolt.Open will create it or say why not
		}
		return err
	}
	defer f.Close()
	if err := lockShared(f, timeout); err != nil {
		return err
	}
	defer unlock(f)
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Size() == 0 {
		return nil // bolt.Open says what it makes of it
	}
	// Read through a mapping where there is one: a read per page costs a
	// system call, which made Open of a 50 MB file take twice as long.
	var r io.ReaderAt = f
	if data, err := mapFile(f, fi.Size()); err == nil {
		defer unmapFile(data)
		// A page of the mapping cut off by a truncation meanwhile (by a
		// process that ignores the lock) faults: SetPanicOnFault makes
		// the fault a panic, which checkData reports.
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		r = memFile(data)
	}
	return checkData(r, fi.Size())
}

// checkData is verifyFile on r, whose reads may fault (a mapping), with
// the verdict told from the failures to read: ErrDamagedFile only for
// what the file holds. verifyFile indexes only what it checked; were it
// wrong (a panic), the file is still not one to hand to bbolt. A fault
// reading the mapping or a failed read is the disk's or a truncation's,
// not a verdict on the file's contents.
func checkData(r io.ReaderAt, size int64) (err error) {
	defer func() {
		if p := recover(); p != nil {
			if fault, ok := p.(interface{ Addr() uintptr }); ok {
				err = fmt.Errorf("reading it through its mapping faulted (an I/O error, or the file was cut meanwhile): %v", fault)
				return
			}
			err = fmt.Errorf("%w: checking it panicked: %v", ErrDamagedFile, p)
		}
	}()
	err = verifyFile(r, size)
	if re := (*readError)(nil); errors.As(err, &re) {
		return fmt.Errorf("reading it: %w", re.err)
	}
	return err
}

// readError is a read of the file that failed for another reason than its
// end (an I/O error): it says nothing of what the file holds, so
// inspectFile reports it as it is, not as ErrDamagedFile.
type readError struct{ err error }

func (e *readError) Error() string { return e.err.Error() }
func (e *readError) Unwrap() error { return e.err }

// readAt is f.ReadAt that marks a failure other than the file's end as a
// readError.
func readAt(f io.ReaderAt, p []byte, off int64) error {
	_, err := f.ReadAt(p, off)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return &readError{err}
	}
	return err
}

// memFile is a file mapped into memory, whose pages verifier reads in
// place instead of copying them.
type memFile []byte

func (m memFile) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off > int64(len(m)) {
		return 0, io.EOF
	}
	n := copy(p, m[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}
