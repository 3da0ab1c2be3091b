//go:build unix

package boltcheck

import (
	"errors"
	"os"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
)

// lockShared takes a shared flock on f, as bbolt's read-only open does,
// so that no process holding the file for writing (bbolt's exclusive
// flock) changes it while Check reads. It waits up to timeout (0:
// forever) and then returns bolt.ErrTimeout.
func lockShared(f *os.File, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, syscall.EINTR):
			continue
		case !errors.Is(err, syscall.EWOULDBLOCK):
			return err
		case timeout > 0 && time.Now().After(deadline):
			return bolt.ErrTimeout
		}
		time.Sleep(50 * time.Millisecond)
	}
}
