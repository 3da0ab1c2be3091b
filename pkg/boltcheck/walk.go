package boltcheck

import (
	"bytes"
	"fmt"
	"os"
)

// problemError is damage found by the walk.
type problemError struct{ msg string }

func (p *problemError) Error() string { return p.msg }

func problemf(format string, args ...any) error {
	return &problemError{msg: fmt.Sprintf(format, args...)}
}

// origin is the page that points to another, for messages; 0 is the
// meta page.
type origin uint64

func (o origin) String() string {
	if o == 0 {
		return "the meta page"
	}
	return fmt.Sprint("page ", uint64(o))
}

// maxDepth bounds the walk's recursion: bbolt's trees are a few levels
// deep per bucket, and buckets nest a few levels.
const maxDepth = 256

// walker reads every page reachable from the root bucket, as bbolt's
// tx.Check does, but with ReadAt into bounds-checked buffers: garbage is
// reported, never followed into a fault.
type walker struct {
	f     *os.File
	size  int64 // the file's length
	m     meta
	ps    uint64
	seen  []uint64 // bitmap: pages reached
	free  []uint64 // bitmap: pages the freelist lists
	bufs  [][]byte // one page buffer per depth
	pages int
}

func newWalker(f *os.File, size int64, m meta) *walker {
	// The bitmaps cover the pages the file holds (at most the high-water
	// mark): a page in use past the end is refused before it is marked.
	words := (min(m.pgid, uint64(size)/uint64(m.pageSize)+1) + 63) / 64
	return &walker{f: f, size: size, m: m, ps: uint64(m.pageSize), seen: make([]uint64, words), free: make([]uint64, words)}
}

func has(b []uint64, i uint64) bool { return b[i/64]&(1<<(i%64)) != 0 }
func set(b []uint64, i uint64)      { b[i/64] |= 1 << (i % 64) }

func (w *walker) walk() error {
	set(w.seen, 0)
	set(w.seen, 1)
	w.pages = 2
	if w.m.freelist != noFreelist {
		if err := w.freelist(); err != nil {
			return err
		}
	}
	return w.page(w.m.root, 0, 0)
}

// buf is the buffer of depth, at least n bytes long.
func (w *walker) buf(depth int, n uint64) []byte {
	for len(w.bufs) <= depth {
		w.bufs = append(w.bufs, nil)
	}
	if uint64(cap(w.bufs[depth])) < n {
		w.bufs[depth] = make([]byte, n)
	}
	return w.bufs[depth][:n]
}

// read reads page id with its overflow pages into depth's buffer after
// checking that the header is id's own, and marks the pages reached.
func (w *walker) read(id uint64, depth int, from origin) (p []byte, flags uint16, err error) {
	if id < 2 || id >= w.m.pgid {
		return nil, 0, problemf("%s points to page %d, outside the file's %d pages", from, id, w.m.pgid)
	}
	if err := w.inFile(id, 0, from); err != nil {
		return nil, 0, err
	}
	p = w.buf(depth, w.ps)
	if _, err := w.f.ReadAt(p, int64(id*w.ps)); err != nil {
		return nil, 0, fmt.Errorf("read page %d: %w", id, err)
	}
	gotID, flags, overflow := order.Uint64(p[0:]), order.Uint16(p[8:]), uint64(order.Uint32(p[12:]))
	if gotID != id {
		return nil, 0, problemf("page %d, reached from %s, does not hold that page (its header says page %d, type %#x): it was overwritten", id, from, gotID, flags)
	}
	if id+overflow >= w.m.pgid {
		return nil, 0, problemf("page %d, reached from %s, claims %d overflow pages, past the file's %d pages: it was overwritten", id, from, overflow, w.m.pgid)
	}
	if err := w.inFile(id, overflow, from); err != nil {
		return nil, 0, err
	}
	for i := id; i <= id+overflow; i++ {
		if has(w.seen, i) {
			return nil, 0, problemf("page %d, reached from %s, is reached twice", i, from)
		}
		if has(w.free, i) {
			return nil, 0, problemf("page %d, reached from %s, is in use but listed as free", i, from)
		}
		set(w.seen, i)
	}
	w.pages += int(overflow) + 1
	if overflow > 0 {
		n := (overflow + 1) * w.ps
		if uint64(cap(p)) < n {
			q := make([]byte, n)
			copy(q, p)
			w.bufs[depth], p = q, q
		}
		p = p[:n]
		if _, err := w.f.ReadAt(p[w.ps:], int64((id+1)*w.ps)); err != nil {
			return nil, 0, fmt.Errorf("read page %d: %w", id, err)
		}
	}
	return p, flags, nil
}

// inFile refuses page id with its overflow pages unless the file holds
// them all.
func (w *walker) inFile(id, overflow uint64, from origin) error {
	if end := (id + overflow + 1) * w.ps; end > uint64(w.size) {
		return problemf("truncated: the file is %d bytes but page %d, in use (reached from %s), ends at byte %d; its last transaction, txid %d, uses %d bytes",
			w.size, id+overflow, from, end, w.m.txid, w.m.pgid*w.ps)
	}
	return nil
}

// freelist reads the freelist page and marks the pages it lists.
func (w *walker) freelist() error {
	id := w.m.freelist
	p, flags, err := w.read(id, 0, 0)
	if err != nil {
		return err
	}
	if flags != freelistPage {
		return problemf("page %d should be the freelist but has type %#x: it was overwritten", id, flags)
	}
	count, first := uint64(order.Uint16(p[10:])), uint64(0)
	if count == 0xFFFF { // the count is the first element
		if len(p) < pageHeaderSize+8 {
			return problemf("freelist page %d is cut short", id)
		}
		count, first = order.Uint64(p[pageHeaderSize:]), 1
	}
	if count > uint64(len(p)-pageHeaderSize)/8-first {
		return problemf("freelist page %d lists %d pages, more than it holds", id, count)
	}
	for i := range count {
		free := order.Uint64(p[pageHeaderSize+(first+i)*8:])
		if free < 2 || free >= w.m.pgid {
			return problemf("freelist page %d lists page %d, outside the file's %d pages", id, free, w.m.pgid)
		}
		if free/64 >= uint64(len(w.free)) {
			continue // a free page past the end of a cut file
		}
		if has(w.free, free) {
			return problemf("freelist page %d lists page %d twice", id, free)
		}
		set(w.free, free)
	}
	return nil
}

// page checks the branch or leaf page id and everything below it.
func (w *walker) page(id uint64, depth int, from origin) error {
	if depth > maxDepth {
		return problemf("page %d, reached from %s, is more than %d levels deep: the tree has a cycle", id, from, maxDepth)
	}
	p, flags, err := w.read(id, depth, from)
	if err != nil {
		return err
	}
	if flags != branchPage && flags != leafPage {
		return problemf("page %d, reached from %s, is not a branch or leaf page (type %#x): it was overwritten", id, from, flags)
	}
	return w.elements(p, flags, id, depth)
}

// elements checks the elements of page p (page id, or an inline bucket
// held in page id) and walks the pages and buckets they point to.
func (w *walker) elements(p []byte, flags uint16, id uint64, depth int) error {
	count := uint64(order.Uint16(p[10:]))
	if pageHeaderSize+count*elementSize > uint64(len(p)) {
		return problemf("page %d claims %d elements, more than fit in it", id, count)
	}
	var prev []byte
	for i := range count {
		off := pageHeaderSize + i*elementSize
		e := p[off : off+elementSize]
		var (
			pos, ksize, vsize uint64
			eflags            uint32
			child             uint64
		)
		if flags == branchPage {
			pos, ksize, child = uint64(order.Uint32(e[0:])), uint64(order.Uint32(e[4:])), order.Uint64(e[8:])
		} else {
			eflags = order.Uint32(e[0:])
			pos, ksize, vsize = uint64(order.Uint32(e[4:])), uint64(order.Uint32(e[8:])), uint64(order.Uint32(e[12:]))
		}
		start := off + pos
		if end := start + ksize + vsize; end > uint64(len(p)) {
			return problemf("page %d: element %d lies outside the page", id, i)
		}
		key := p[start : start+ksize]
		if i > 0 && bytes.Compare(prev, key) >= 0 {
			return problemf("page %d: key %d is not above key %d", id, i, i-1)
		}
		prev = key
		switch {
		case flags == branchPage:
			if err := w.page(child, depth+1, origin(id)); err != nil {
				return err
			}
		case eflags&^bucketLeafFlag != 0:
			return problemf("page %d: element %d has unknown flags %#x", id, i, eflags)
		case eflags&bucketLeafFlag != 0:
			if err := w.bucket(p[start+ksize:start+ksize+vsize], id, depth); err != nil {
				return err
			}
		}
	}
	return nil
}

// bucket checks the bucket whose header v is stored in page id.
func (w *walker) bucket(v []byte, id uint64, depth int) error {
	if len(v) < bucketHeader {
		return problemf("page %d: a bucket's header is cut short", id)
	}
	if root := order.Uint64(v); root != 0 {
		return w.page(root, depth+1, origin(id))
	}
	inline := v[bucketHeader:]
	if len(inline) < pageHeaderSize || order.Uint16(inline[8:]) != leafPage {
		return problemf("page %d: an inline bucket is not a leaf page", id)
	}
	return w.elements(inline, leafPage, id, depth)
}
