// Package boltdamage damages bbolt files the way failing disks, full
// disks and hasty operators do (a cut, a zeroed meta page, a page of
// garbage), for tests that start a service binary on the result; and it
// checks that such a binary refuses the file the way pkg/boltcheck
// promises: exit status 1 and one line naming the file and what to do,
// never a fault or a panic.
package boltdamage

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Layout is bbolt's own view of a file: its page size, its last
// transaction, and the type of every page below the high-water mark
// ("meta", "freelist", "branch", "leaf", "free", or a type with
// "-overflow" for the continuation of a large page).
type Layout struct {
	PageSize int
	Txid     int
	Types    []string
}

// Inspect reads path's layout through bbolt (read-only).
func Inspect(t testing.TB, path string) Layout {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, PreLoadFreelist: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	l := Layout{PageSize: db.Info().PageSize}
	err = db.View(func(tx *bolt.Tx) error {
		l.Txid = tx.ID()
		for id := 0; ; id++ {
			info, err := tx.Page(id)
			if err != nil || info == nil {
				return err
			}
			l.Types = append(l.Types, info.Type)
			if info.Type == "free" {
				continue // a stale header; its overflow pages are free too
			}
			for range info.OverflowCount {
				l.Types = append(l.Types, info.Type+"-overflow")
				id++
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// HighWater is the number of pages in use or free: bbolt needs the file
// to be at least HighWater*PageSize bytes.
func (l Layout) HighWater() int { return len(l.Types) }

// Last is the highest page of type typ; it fails the test if there is
// none.
func (l Layout) Last(t testing.TB, typ string) int {
	t.Helper()
	for id := len(l.Types) - 1; id >= 0; id-- {
		if l.Types[id] == typ {
			return id
		}
	}
	t.Fatalf("no %s page in %v", typ, l.Types)
	return 0
}

// LastInUse is the last page bbolt uses (not free): a cut anywhere
// before its end loses data; a cut after it, only free pages.
func (l Layout) LastInUse() int {
	id := len(l.Types) - 1
	for id > 0 && l.Types[id] == "free" {
		id--
	}
	return id
}

// Has says whether the file has a page of type typ.
func (l Layout) Has(typ string) bool { return slices.Contains(l.Types, typ) }

// NewerMeta is the meta page holding the last transaction: bbolt writes
// transaction n to page n%2.
func (l Layout) NewerMeta() int { return l.Txid % 2 }

// Truncate cuts path to size bytes.
func Truncate(t testing.TB, path string, size int64) {
	t.Helper()
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
}

// ZeroPage overwrites page id of path with zeroes.
func ZeroPage(t testing.TB, path string, l Layout, id int) {
	t.Helper()
	writeAt(t, path, make([]byte, l.PageSize), int64(id*l.PageSize))
}

// GarbagePage overwrites page id of path with random bytes.
func GarbagePage(t testing.TB, path string, l Layout, id int) {
	t.Helper()
	b := make([]byte, l.PageSize)
	rng := rand.New(rand.NewPCG(uint64(id), 0xbad))
	for i := range b {
		b[i] = byte(rng.UintN(256))
	}
	writeAt(t, path, b, int64(id*l.PageSize))
}

func writeAt(t testing.TB, path string, b []byte, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// CopyDir copies the regular files of directory src (not its
// subdirectories) into a new temporary directory and returns it.
func CopyDir(t testing.TB, src string) string {
	t.Helper()
	dst := t.TempDir()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// RefusalTimeout bounds how long a binary may take to refuse a file.
const RefusalTimeout = 30 * time.Second

// ExpectRefusal runs bin with args (and none of the test's environment
// variables under envPrefix) and expects it to refuse the damaged file
// at path: exit status 1 within RefusalTimeout, its last line of output
// the only one that calls path damaged, starting with prefix and saying
// what to do, and no sign of a fault or a panic anywhere. It returns
// that line.
func ExpectRefusal(t testing.TB, bin, envPrefix, path, prefix string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), RefusalTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, envPrefix+"_") })
	out, err := cmd.CombinedOutput()
	log := string(out)
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("%s still running after %v on a damaged file (it started on it); output:\n%s", filepath.Base(bin), RefusalTimeout, log)
	case !errors.As(err, &exit):
		t.Fatalf("%s: %v, want exit status 1; output:\n%s", filepath.Base(bin), err, log)
	case exit.ExitCode() != 1:
		t.Fatalf("%s: %v, want exit status 1; output:\n%s", filepath.Base(bin), err, log)
	}
	for _, crash := range []string{"panic", "fatal error", "SIGBUS", "SIGSEGV", "goroutine "} {
		if strings.Contains(log, crash) {
			t.Fatalf("output shows %q; output:\n%s", crash, log)
		}
	}
	lines := strings.Split(strings.TrimRight(log, "\n"), "\n")
	last := lines[len(lines)-1]
	damaged := 0
	for _, l := range lines {
		if strings.Contains(l, "damaged") {
			damaged++
		}
	}
	if damaged != 1 || !strings.HasPrefix(last, prefix) || !strings.Contains(last, path+" is damaged: ") ||
		!strings.Contains(last, "restore it from a backup") || !strings.Contains(last, "move it aside") {
		t.Fatalf("want the last line to be the only one naming %s as damaged, starting %q and saying what to do; output:\n%s", path, prefix, log)
	}
	return last
}
