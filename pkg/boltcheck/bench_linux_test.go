package boltcheck

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkCheckCold is BenchmarkCheck's check with the file dropped from
// the page cache before each run: a first start after boot.
func BenchmarkCheckCold(b *testing.B) {
	path := bigDB(b)
	benchCheck(b, path, func() {
		f, err := os.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			b.Fatal(err)
		}
	})
}
