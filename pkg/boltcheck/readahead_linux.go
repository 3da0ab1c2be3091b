package boltcheck

import (
	"os"

	"golang.org/x/sys/unix"
)

// readAhead asks the kernel to read the file into the page cache in file
// order while the walk, which visits pages in tree order, catches up: on
// a cold cache that turns random reads into one sequential one.
func readAhead(f *os.File, size int64) {
	_ = unix.Fadvise(int(f.Fd()), 0, size, unix.FADV_WILLNEED) // only advice
}
