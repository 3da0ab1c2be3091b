package boltcheck

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
)

// bbolt's on-disk format (go.etcd.io/bbolt v1.5.0, internal/common),
// written in the machine's byte order.
const (
	pageHeaderSize = 16 // id u64, flags u16, count u16, overflow u32
	elementSize    = 16 // branch: pos u32, ksize u32, pgid u64; leaf: flags, pos, ksize, vsize u32
	bucketHeader   = 16 // root pgid u64, sequence u64; an inline page follows when root is 0
	metaSize       = 64 // see meta
	metaSummed     = 56 // the checksum covers the meta up to itself

	branchPage   = 0x01
	leafPage     = 0x02
	metaPage     = 0x04
	freelistPage = 0x10

	bucketLeafFlag = 0x01

	magic      = 0xED0CDAED
	version    = 2
	noFreelist = ^uint64(0)
)

var order = binary.NativeEndian

// meta is a meta page's contents: magic u32, version u32, pageSize u32,
// flags u32, root bucket (root pgid u64, sequence u64), freelist pgid
// u64, pgid (high-water mark) u64, txid u64, checksum u64.
type meta struct {
	magic, version, pageSize uint32
	root, freelist, pgid     uint64
	txid, checksum           uint64
}

func parseMeta(b []byte) (meta, bool) {
	if len(b) < pageHeaderSize+metaSize {
		return meta{}, false
	}
	b = b[pageHeaderSize:]
	return meta{
		magic:    order.Uint32(b[0:]),
		version:  order.Uint32(b[4:]),
		pageSize: order.Uint32(b[8:]),
		root:     order.Uint64(b[16:]),
		freelist: order.Uint64(b[32:]),
		pgid:     order.Uint64(b[40:]),
		txid:     order.Uint64(b[48:]),
		checksum: order.Uint64(b[56:]),
	}, true
}

// validate is bbolt's Meta.Validate plus the invariants bbolt asserts
// when it writes a meta (a meta that passed its checksum but breaks them
// would crash bbolt later). It says what is wrong, or "".
func (m meta) validate(raw []byte) string {
	switch {
	case m.magic != magic:
		if m.magic == 0 && m.checksum == 0 {
			return "zeroed"
		}
		return "not a bbolt meta page (bad magic)"
	case m.version != version:
		return fmt.Sprintf("format version %d, not %d", m.version, version)
	}
	h := fnv.New64a()
	_, _ = h.Write(raw[pageHeaderSize : pageHeaderSize+metaSummed])
	switch {
	case h.Sum64() != m.checksum:
		return "checksum mismatch"
	case m.pageSize < 1024 || m.pageSize&(m.pageSize-1) != 0:
		return fmt.Sprintf("page size %d", m.pageSize)
	case m.root < 2 || m.root >= m.pgid:
		return fmt.Sprintf("root page %d outside its %d pages", m.root, m.pgid)
	case m.freelist != noFreelist && (m.freelist < 2 || m.freelist >= m.pgid):
		return fmt.Sprintf("freelist page %d outside its %d pages", m.freelist, m.pgid)
	}
	return ""
}

// readMetas finds the page size and picks the meta page bbolt would
// open at (the valid one with the higher txid). It reports a Fallback
// when the other is invalid, and a problem when the file cannot be
// opened safely.
func readMetas(f *os.File, size int64) (m meta, fb *Fallback, problem string, err error) {
	first := make([]byte, 4096)
	n, err := f.ReadAt(first, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return meta{}, nil, "", err
	}
	first = first[:n]
	pageSize := 0
	m0, ok := parseMeta(first)
	why0 := "truncated"
	if ok {
		if why0 = m0.validate(first); why0 == "" {
			pageSize = int(m0.pageSize)
		}
	}
	if pageSize == 0 {
		// As bbolt does: look for meta page 1 at each possible page size.
		for ps := 1024; ps <= 1<<24 && int64(ps) < size; ps <<= 1 {
			buf := make([]byte, pageHeaderSize+metaSize)
			if _, err := f.ReadAt(buf, int64(ps)); err != nil && !errors.Is(err, io.EOF) {
				return meta{}, nil, "", err
			}
			if m1, ok := parseMeta(buf); ok && m1.validate(buf) == "" && int(m1.pageSize) == ps {
				pageSize = ps
				break
			}
		}
	}
	if pageSize == 0 {
		return meta{}, nil, fmt.Sprintf("both meta pages are invalid (page 0: %s; no valid page 1 at any page size): it may not be a bbolt file at all", why0), nil
	}
	if size < int64(2*pageSize) {
		return meta{}, nil, fmt.Sprintf("truncated: the file is %d bytes, shorter than its two meta pages of %d bytes", size, pageSize), nil
	}
	var (
		metas [2]meta
		whys  [2]string
	)
	for i := range 2 {
		raw := make([]byte, pageHeaderSize+metaSize)
		if _, err := f.ReadAt(raw, int64(i*pageSize)); err != nil {
			return meta{}, nil, "", err
		}
		metas[i], _ = parseMeta(raw)
		if whys[i] = metas[i].validate(raw); whys[i] == "" && int(metas[i].pageSize) != pageSize {
			whys[i] = fmt.Sprintf("page size %d, not %d", metas[i].pageSize, pageSize)
		}
	}
	switch {
	case whys[0] == "" && whys[1] == "":
		if metas[1].txid > metas[0].txid {
			return metas[1], nil, "", nil
		}
		return metas[0], nil, "", nil
	case whys[0] != "" && whys[1] != "":
		return meta{}, nil, fmt.Sprintf("both meta pages are invalid (page 0: %s; page 1: %s)", whys[0], whys[1]), nil
	}
	good, bad := 0, 1
	if whys[0] != "" {
		good, bad = 1, 0
	}
	return metas[good], &Fallback{BadPage: bad, Txid: metas[good].txid, Claimed: metas[bad].txid, Reason: whys[bad]}, "", nil
}
