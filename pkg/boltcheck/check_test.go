package boltcheck

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// newDB writes a bbolt file with branch pages, overflow pages, nested and
// inline buckets, and free pages, as bbolt itself lays them out. It
// returns the path and the page size.
func newDB(t *testing.T, noFreelistSync bool) (string, int) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "data.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, NoFreelistSync: noFreelistSync})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 8 {
		err := db.Update(func(tx *bolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists([]byte("kv"))
			if err != nil {
				return err
			}
			for i := range 300 {
				v := make([]byte, 10+rng.IntN(200))
				if i%97 == 0 {
					v = make([]byte, 9000) // overflow pages
				}
				if err := b.Put(fmt.Appendf(nil, "key-%04d-%d", i, round), v); err != nil {
					return err
				}
			}
			wf, err := tx.CreateBucketIfNotExists([]byte("workflows"))
			if err != nil {
				return err
			}
			for i := range 20 {
				sub, err := wf.CreateBucketIfNotExists(fmt.Appendf(nil, "wf-%02d", i))
				if err != nil {
					return err
				}
				n := 1 // small: inline
				if i%4 == 0 {
					n = 80 // a page of its own
				}
				for j := range n {
					if err := sub.Put(fmt.Appendf(nil, "s%03d", j), fmt.Appendf(nil, "step %d of round %d", j, round)); err != nil {
						return err
					}
				}
			}
			// Deletes leave free pages behind.
			c := b.Cursor()
			k, _ := c.First()
			for i := 0; k != nil && i < 150; i++ {
				if err := c.Delete(); err != nil {
					return err
				}
				k, _ = c.Next()
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// A large value written last and deleted leaves free pages at the
	// end of the file (a cut there loses nothing).
	for _, fn := range []func(b *bolt.Bucket) error{
		func(b *bolt.Bucket) error { return b.Put([]byte("zz-large"), make([]byte, 40000)) },
		func(b *bolt.Bucket) error { return b.Delete([]byte("zz-large")) },
		func(b *bolt.Bucket) error { return b.Put([]byte("zz-small"), []byte("x")) },
		func(b *bolt.Bucket) error { return b.Put([]byte("zz-small"), []byte("y")) },
	} {
		if err := db.Update(func(tx *bolt.Tx) error { return fn(tx.Bucket([]byte("kv"))) }); err != nil {
			t.Fatal(err)
		}
	}
	ps := db.Info().PageSize
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	return path, ps
}

// pageTypes is bbolt's own view of each page below the high-water mark.
func pageTypes(t *testing.T, path string) (types []string, txid int) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, PreLoadFreelist: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		txid = tx.ID()
		for id := 0; ; id++ {
			info, err := tx.Page(id)
			if err != nil {
				return err
			}
			if info == nil {
				return nil
			}
			for len(types) <= id {
				types = append(types, "")
			}
			types[id] = info.Type
			if info.Type == "free" {
				continue // its header is stale; its overflow pages are free too
			}
			for o := 1; o <= info.OverflowCount; o++ {
				types = append(types, info.Type+"-overflow")
			}
			id += info.OverflowCount
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return types, txid
}

func mustDamage(t *testing.T, path, want string) *Damage {
	t.Helper()
	_, err := Check(path, time.Second)
	var d *Damage
	if !errors.As(err, &d) || !errors.Is(err, ErrDamaged) {
		t.Fatalf("Check = %v, want a *Damage", err)
	}
	if !strings.Contains(d.Problem, want) {
		t.Errorf("problem %q, want it to say %q", d.Problem, want)
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") || !strings.Contains(msg, path) || !strings.Contains(msg, "restore it from a backup") {
		t.Errorf("message is not one line naming the file and what to do: %q", msg)
	}
	return d
}

func copyFile(t *testing.T, src string) string {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), filepath.Base(src))
	if err := os.WriteFile(dst, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return dst
}

func writeAt(t *testing.T, path string, b []byte, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func forBothFreelists(t *testing.T, fn func(t *testing.T, path string, pageSize int)) {
	for _, nfs := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoFreelistSync=%v", nfs), func(t *testing.T) {
			path, ps := newDB(t, nfs)
			fn(t, path, ps)
		})
	}
}

func TestHealthy(t *testing.T) {
	forBothFreelists(t, func(t *testing.T, path string, ps int) {
		types, txid := pageTypes(t, path)
		r, err := Check(path, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if r.New || r.Fallback != nil || r.PageSize != ps || r.Txid != uint64(txid) || r.HighWater != uint64(len(types)) {
			t.Errorf("report %+v; want page size %d, txid %d, %d pages", r, ps, txid, len(types))
		}
		used := 0
		for _, typ := range types {
			if typ != "free" {
				used++
			}
		}
		if r.Pages != used {
			t.Errorf("walked %d pages; bbolt counts %d not free: %v", r.Pages, used, types)
		}
	})
}

func TestNewFile(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.db")
	empty := filepath.Join(dir, "empty.db")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{missing, empty} {
		r, err := Check(p, time.Second)
		if err != nil || !r.New {
			t.Errorf("Check(%s) = %+v, %v; want a new file", filepath.Base(p), r, err)
		}
	}
}

// TestTruncated cuts the file at several depths, from inside the first
// meta page to the last byte of the last page in use. A cut past the
// pages in use (bbolt leaves free pages, and grows files ahead of use)
// loses nothing: bbolt opens the file, and it is reported as Short.
func TestTruncated(t *testing.T) {
	forBothFreelists(t, func(t *testing.T, path string, ps int) {
		types, _ := pageTypes(t, path)
		hwm := int64(len(types)) * int64(ps)
		last := int64(len(types) - 1) // the last page in use
		for types[last] == "free" {
			last--
		}
		if last == int64(len(types)-1) {
			t.Fatalf("no free pages at the end of the file: %v", types)
		}
		cases := []struct {
			name string
			size int64
			want string
		}{
			{"inside meta 0", 50, "both meta pages are invalid"},
			{"after meta 0's fields", 100, "shorter than its two meta pages"},
			{"after meta 0", int64(ps), "shorter than its two meta pages"},
			{"after the metas", 2 * int64(ps), "truncated: "},
			{"half", hwm / 2, "truncated: "},
			{"two pages into the pages in use", (last - 1) * int64(ps), "truncated: "},
			{"inside the last page in use", last*int64(ps) + int64(ps)/2, "truncated: "},
			{"one byte of the last page in use", (last+1)*int64(ps) - 1, "truncated: "},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				p := copyFile(t, path)
				if err := os.Truncate(p, c.size); err != nil {
					t.Fatal(err)
				}
				d := mustDamage(t, p, c.want)
				if cut := strings.HasPrefix(d.Problem, "truncated"); d.Truncated != cut || strings.Contains(d.Error(), Inspect) == cut {
					t.Errorf("a cut file should not suggest bbolt's tools (they fault on it), other damage should: %q", d.Error())
				}
			})
		}
		for _, c := range []struct {
			name string
			size int64
		}{
			{"only free pages", (last + 1) * int64(ps)},
			{"at the high-water mark", hwm},
		} {
			t.Run(c.name, func(t *testing.T) {
				p := copyFile(t, path)
				if err := os.Truncate(p, c.size); err != nil {
					t.Fatal(err)
				}
				r, err := Check(p, time.Second)
				if err != nil || r.Short != hwm-c.size {
					t.Fatalf("Check = %+v, %v; want no damage, %d bytes short", r, err, hwm-c.size)
				}
				// bbolt agrees: it reads every key and commits more.
				db, err := bolt.Open(p, 0o600, &bolt.Options{Timeout: time.Second})
				if err != nil {
					t.Fatal(err)
				}
				defer db.Close()
				if err := db.View(func(tx *bolt.Tx) error { return <-tx.Check() }); err != nil {
					t.Fatalf("bbolt's check of the cut file: %v", err)
				}
				for i := range 50 {
					if err := db.Update(func(tx *bolt.Tx) error {
						return tx.Bucket([]byte("kv")).Put(fmt.Appendf(nil, "after-%d", i), make([]byte, 3000))
					}); err != nil {
						t.Fatal(err)
					}
				}
				if err := db.View(func(tx *bolt.Tx) error { return <-tx.Check() }); err != nil {
					t.Fatalf("bbolt's check after writes: %v", err)
				}
			})
		}
	})
}

// TestMetaFallback zeroes (or flips a bit in) one meta page: the file
// opens at the other meta's transaction, and Check says so. The newer
// page lost means the last transaction's writes are gone, as bbolt then
// shows.
func TestMetaFallback(t *testing.T) {
	forBothFreelists(t, func(t *testing.T, path string, ps int) {
		_, txid := pageTypes(t, path)
		newer, older := txid%2, 1-txid%2
		for _, c := range []struct {
			name     string
			page     int
			zero     bool
			wantTxid int
			reason   string
		}{
			{"newer zeroed", newer, true, txid - 1, "zeroed"},
			{"older zeroed", older, true, txid, "zeroed"},
			{"newer bit flip", newer, false, txid - 1, "checksum mismatch"},
		} {
			t.Run(c.name, func(t *testing.T) {
				p := copyFile(t, path)
				if c.zero {
					writeAt(t, p, make([]byte, ps), int64(c.page*ps))
				} else {
					writeAt(t, p, []byte{0xff}, int64(c.page*ps+pageHeaderSize+20)) // in the root's sequence
				}
				r, err := Check(p, time.Second)
				if err != nil {
					t.Fatal(err)
				}
				f := r.Fallback
				if f == nil || f.BadPage != c.page || f.Txid != uint64(c.wantTxid) || r.Txid != uint64(c.wantTxid) || f.Reason != c.reason {
					t.Fatalf("fallback %+v, report txid %d; want bad page %d, txid %d, reason %q", f, r.Txid, c.page, c.wantTxid, c.reason)
				}
				if c.zero && f.Claimed != 0 || !c.zero && f.Claimed != uint64(txid) {
					t.Errorf("claimed txid %d", f.Claimed)
				}
				if _, got := pageTypes(t, p); got != c.wantTxid {
					t.Errorf("bbolt opened at txid %d, the check said %d", got, c.wantTxid)
				}
			})
		}
		t.Run("both zeroed", func(t *testing.T) {
			p := copyFile(t, path)
			writeAt(t, p, make([]byte, 2*ps), 0)
			mustDamage(t, p, "both meta pages are invalid")
		})
		t.Run("both bad checksums", func(t *testing.T) {
			p := copyFile(t, path)
			writeAt(t, p, []byte{0xff}, pageHeaderSize+20)
			writeAt(t, p, []byte{0xff}, int64(ps+pageHeaderSize+20))
			mustDamage(t, p, "both meta pages are invalid")
		})
	})
}

// TestGarbagePage overwrites each page below the high-water mark in
// turn, with random bytes and with zeroes: every page bbolt uses must be
// refused; a free page is harmless (bbolt never reads it).
func TestGarbagePage(t *testing.T) {
	forBothFreelists(t, func(t *testing.T, path string, ps int) {
		types, _ := pageTypes(t, path)
		orig, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		p := copyFile(t, path)
		rng := rand.New(rand.NewPCG(3, 4))
		refused := 0
		for id := 2; id < len(types); id++ {
			for _, fill := range []string{"random", "zero"} {
				page := make([]byte, ps)
				if fill == "random" {
					for i := range page {
						page[i] = byte(rng.UintN(256))
					}
				}
				writeAt(t, p, page, int64(id*ps))
				_, err := Check(p, time.Second)
				switch typ := types[id]; {
				case typ == "free":
					if err != nil {
						t.Errorf("%s free page %d: %v", fill, id, err)
					}
				case strings.HasSuffix(typ, "-overflow"):
					// Value bytes: undetectable without checksums.
				default:
					if !errors.Is(err, ErrDamaged) {
						t.Errorf("%s %s page %d: Check = %v, want damage", fill, typ, id, err)
					}
					refused++
				}
				writeAt(t, p, orig[id*ps:(id+1)*ps], int64(id*ps))
			}
		}
		if refused == 0 {
			t.Fatalf("no page tested: %v", types)
		}
	})
}

// TestKeysOutOfOrder changes a byte of a key on a leaf page so that it
// sorts before the key ahead of it: the page still parses, but lookups
// would miss.
func TestKeysOutOfOrder(t *testing.T) {
	path, ps := newDB(t, false)
	types, _ := pageTypes(t, path)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for id, typ := range types {
		if typ != "leaf" {
			continue
		}
		page := b[id*ps:]
		if order.Uint16(page[10:]) < 2 || order.Uint32(page[pageHeaderSize:])&bucketLeafFlag != 0 {
			continue
		}
		key := func(i int) []byte {
			e := page[pageHeaderSize+i*elementSize:]
			pos, ksize := int(order.Uint32(e[4:])), int(order.Uint32(e[8:]))
			return e[pos : pos+ksize]
		}
		key(1)[0] = 0x00 // below key 0
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		mustDamage(t, path, "is not above key")
		return
	}
	t.Fatal("no leaf page with two keys")
}

func TestLocked(t *testing.T) {
	path, _ := newDB(t, false)
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	start := time.Now()
	if _, err := Check(path, 200*time.Millisecond); !errors.Is(err, bolt.ErrTimeout) {
		t.Fatalf("Check of a file held open = %v, want bolt.ErrTimeout", err)
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("gave up after %v", d)
	}
}
