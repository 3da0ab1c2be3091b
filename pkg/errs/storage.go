package errs

import (
	"errors"
	"fmt"
	"syscall"
)

// FromStorage classifies an error of a service's own storage (a bbolt
// commit, an index write): a full disk or quota (ENOSPC, EDQUOT) becomes
// StorageFull, with the cause and what to do in its message, so that a
// caller sees RESOURCE_EXHAUSTED it can retry instead of an INTERNAL it
// cannot tell from a bug. Other errors, and errors that already carry a
// kind, are returned unchanged; nil stays nil.
func FromStorage(err error) error {
	if err == nil {
		return nil
	}
	var k *Kind
	if errors.As(err, &k) {
		return err
	}
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("the service's disk is full, nothing was written (%v); retry once space is freed: %w", err, StorageFull)
	}
	return err
}
