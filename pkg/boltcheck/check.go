package boltcheck

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"time"
)

// ErrDamaged is wrapped by every error Check returns for a damaged file.
var ErrDamaged = errors.New("damaged bbolt file")

// Inspect is the command that shows what bbolt itself finds in a file
// (pinned to the bbolt release this module uses; needs the Go toolchain
// and the module proxy).
const Inspect = "go run go.etcd.io/bbolt/cmd/bbolt@v1.5.0 check"

// Damage is the error of a file Check refused. Its text is one line that
// names the file, says what is wrong and what to do.
type Damage struct {
	Path string
	// Problem says what is wrong, e.g. "truncated: ...".
	Problem string
	// Truncated: the file is shorter than its data, which bbolt's own
	// tools cannot read either (they fault), so none is suggested.
	Truncated bool
}

func (d *Damage) Error() string {
	inspect := "to see what bbolt finds, run on a copy: " + Inspect + " COPY"
	if d.Truncated {
		inspect = "bbolt's own tools fault on a file cut short"
	}
	return fmt.Sprintf("%s is damaged: %s; refusing to open it (restarting will not help): restore it from a backup, "+
		"or move it aside to start with an empty one (%s)", d.Path, d.Problem, inspect)
}

// Unwrap makes errors.Is(err, ErrDamaged) true.
func (d *Damage) Unwrap() error { return ErrDamaged }

// Report describes a file Check accepted.
type Report struct {
	// New: the file is missing or empty; bbolt will create it.
	New bool
	// Size is the file's length in bytes.
	Size int64
	// PageSize and Txid are those of the meta page bbolt will open at;
	// HighWater is its page count (pages 0 to HighWater-1 are in use or
	// free).
	PageSize  int
	Txid      uint64
	HighWater uint64
	// Pages is how many pages the walk read (meta, freelist and every
	// page reachable from the root bucket).
	Pages int
	// Took is how long the whole check took.
	Took time.Duration
	// Fallback is set when one meta page is invalid.
	Fallback *Fallback
	// Short is how many bytes the file lacks to hold HighWater pages:
	// it was cut, but only in pages no transaction uses (bbolt extends
	// it again). A cut into a page in use is refused.
	Short int64
}

// Fallback is one meta page invalid: bbolt opens the file at the other
// page's transaction. That is how bbolt recovers from a crash in the
// middle of a commit (the torn meta was never acknowledged, nothing is
// lost), but if the damaged page held the newer transaction (a disk
// fault after the commit), the writes acknowledged in that transaction
// are missing, and nothing in the file can tell the two apart.
type Fallback struct {
	// BadPage is the invalid meta page, 0 or 1.
	BadPage int
	// Txid is the transaction bbolt opens at; Txid+1 is the one that may
	// be missing.
	Txid uint64
	// Claimed is the transaction id the damaged page still carries,
	// unverified (0 when it was zeroed).
	Claimed uint64
	// Reason is why the page is invalid, e.g. "checksum mismatch".
	Reason string
}

// Warns says whether Log would log a warning or an error: a Fallback, or
// a file Short.
func (r Report) Warns() bool { return r.Fallback != nil || r.Short > 0 }

// Log records what the check found on log: the meta-page fallback at
// ERROR, naming the file and both transactions; a file Short at WARN;
// and one INFO line with the file's size and how long the check took.
func (r Report) Log(log *slog.Logger, path string) {
	if f := r.Fallback; f != nil {
		log.Error("DAMAGED META PAGE: opening the file at the other meta page's transaction; writes acknowledged in a later transaction, if there was one, are missing",
			"file", path, "bad_meta_page", f.BadPage, "reason", f.Reason,
			"opened_txid", f.Txid, "possibly_missing_txid", f.Txid+1, "bad_page_claims_txid", f.Claimed,
			"next", "check the writes acknowledged just before this start; the next commit rewrites the damaged page")
	}
	if r.New {
		return
	}
	if r.Short > 0 {
		log.Warn("the file was cut short, but only in free pages: nothing is lost, bbolt extends it again; look for what cut it",
			"file", path, "bytes", r.Size, "missing_bytes", r.Short, "txid", r.Txid)
	}
	log.Info("data file checked", "file", path, "bytes", r.Size, "txid", r.Txid, "pages", r.Pages, "took", r.Took.Round(time.Millisecond))
}

// Check inspects the bbolt file at path (see the package comment) under a
// shared lock, waiting up to lockTimeout for a process that holds the file
// (0: forever); when that runs out it returns bolt.ErrTimeout, as
// bolt.Open would. A damaged file gives an error wrapping ErrDamaged (a
// *Damage); a missing or empty file, a Report with New set.
func Check(path string, lockTimeout time.Duration) (Report, error) {
	start := time.Now()
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Report{New: true}, nil
	}
	if err != nil {
		return Report{}, err
	}
	defer f.Close() // releases the lock
	if err := lockShared(f, lockTimeout); err != nil {
		return Report{}, err
	}
	st, err := f.Stat()
	if err != nil {
		return Report{}, err
	}
	if st.Size() == 0 {
		// bbolt writes a new file's first pages before anything else: a
		// crash while creating it can leave it empty.
		return Report{New: true}, nil
	}
	r := Report{Size: st.Size()}
	damaged := func(format string, args ...any) (Report, error) {
		p := fmt.Sprintf(format, args...)
		return Report{}, &Damage{Path: path, Problem: p, Truncated: strings.HasPrefix(p, "truncated")}
	}
	m, fb, problem, err := readMetas(f, st.Size())
	if err != nil {
		return Report{}, err
	}
	if problem != "" {
		return damaged("%s", problem)
	}
	r.PageSize, r.Txid, r.HighWater, r.Fallback = int(m.pageSize), m.txid, m.pgid, fb
	readAhead(f, st.Size())
	// The walk refuses any page in use that the file does not hold; a
	// file cut only in free pages is served (bbolt never reads those).
	w := newWalker(f, st.Size(), m)
	if err := w.walk(); err != nil {
		var p *problemError
		if errors.As(err, &p) {
			return damaged("%s", p.msg)
		}
		return Report{}, err
	}
	if need := int64(m.pgid) * int64(m.pageSize); st.Size() < need {
		r.Short = need - st.Size()
	}
	r.Pages = w.pages
	r.Took = time.Since(start)
	return r, nil
}
