package docker

import (
	"bytes"
	"errors"
	"fmt"
)

// errOutputLimit is returned by a cappedBuffer's Write past its limit.
var errOutputLimit = errors.New("output limit exceeded")

// cappedBuffer holds the operator's stdout, up to max bytes (0: no
// limit). A write that would go past max is refused whole with
// errOutputLimit.
type cappedBuffer struct {
	buf bytes.Buffer
	max uint64
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	if c.max > 0 && uint64(c.buf.Len())+uint64(len(p)) > c.max {
		return 0, errOutputLimit
	}
	return c.buf.Write(p)
}

// Bytes returns what was written.
func (c *cappedBuffer) Bytes() []byte { return c.buf.Bytes() }

// tailBuffer keeps the last max bytes written to it (the end of a log is
// what explains a failure) and counts the rest. Writes never fail.
type tailBuffer struct {
	buf     []byte
	max     int
	dropped int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	// Compact only when twice the limit is reached, so a chatty writer
	// costs amortised linear time.
	if len(t.buf) > 2*t.max {
		t.trim()
	}
	return len(p), nil
}

func (t *tailBuffer) trim() {
	if n := len(t.buf) - t.max; n > 0 {
		t.dropped += n
		t.buf = append(t.buf[:0], t.buf[n:]...)
	}
}

// Bytes returns the kept tail, after a line saying how much was dropped
// before it, if anything was.
func (t *tailBuffer) Bytes() []byte {
	t.trim()
	if t.dropped == 0 {
		return t.buf
	}
	return append([]byte(fmt.Sprintf("[%d earlier bytes of stderr dropped]\n", t.dropped)), t.buf...)
}
