package testenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// SmallFS mounts a tmpfs of size bytes on a new directory for the test
// and unmounts it when the test ends: a filesystem the test can fill to
// make a service's disk full. It skips the test, saying why, where it
// cannot mount (not root, no mount namespace rights).
func SmallFS(t testing.TB, size int64) string {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, fmt.Sprintf("size=%d,mode=0700", size)); err != nil {
		t.Skipf("a small filesystem to fill cannot be made here (mount tmpfs: %v); the full-disk test needs root", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// Fill writes a file in dir until the filesystem is full and returns a
// function that removes it, freeing the space.
func Fill(t testing.TB, dir string) (free func()) {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatalf("fill %s: %v", dir, err)
	}
	buf := make([]byte, 64<<10)
	for size := len(buf); size > 0; {
		if _, err := f.Write(buf[:size]); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				f.Close()
				t.Fatalf("fill %s: %v", dir, err)
			}
			size /= 2 // fill the last partial block too
		}
	}
	if err := f.Close(); err != nil && !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("fill %s: %v", dir, err)
	}
	return func() {
		if err := os.Remove(path); err != nil {
			t.Errorf("free %s: %v", dir, err)
		}
	}
}
