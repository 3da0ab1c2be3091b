//go:build !unix

package boltcheck

import (
	"os"
	"time"
)

// lockShared does nothing where flock is missing: there Check may read a
// file another process is writing, and then report damage that is not.
func lockShared(*os.File, time.Duration) error { return nil }
