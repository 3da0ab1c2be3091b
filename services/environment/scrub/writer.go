package scrub

import (
	"bytes"
	"errors"
	"io"
	"sync"
)

// ErrClosed is returned by Write after Close.
var ErrClosed = errors.New("scrub: write after close")

// maxLine is how much of a line without a newline a Writer holds before
// it scrubs and writes part of it anyway.
const maxLine = 1 << 20

// Writer phases.
const (
	phaseText    = iota // ordinary lines
	phasePEM            // holding the lines of an open PEM private key block
	phaseSkipPEM        // dropping the rest of an oversized PEM block
)

// Writer returns a writer that scrubs what is written to it and writes
// the result to w. The secrets' forms are found in the stream as a
// whole, whatever the Write calls and lines they are split over: input
// is held back while it could be the beginning of one (at most about the
// longest form, with the separators inside it), and the rest is written
// one complete line at a time, for the patterns, which match within a
// line. So a line may wait for the next Write, or Close, when its end
// could begin a form that continues on the next line.
// Close scrubs and writes what is held; it does not close w. Write
// returns ErrClosed after Close, and once a write to w has failed every
// later Write and Close returns that error.
//
// With the default patterns on, a PEM private key block is held from its
// BEGIN line to its END line and scrubbed as a whole, as String would. A
// line longer than 1 MiB is cut at its last space or tab (or anywhere, if
// it has none) and the part before the cut written, so a secret may
// escape only if a cut falls inside it. A PEM block longer than 1 MiB is
// replaced by Redacted and the rest of it, up to its END line, dropped.
// Patterns given with WithPatterns are matched within one line.
//
// The returned writer is safe for concurrent use; lines are written in
// the order their newlines arrive.
func (s *Scrubber) Writer(w io.Writer) io.WriteCloser {
	lw := &lineWriter{s: s, w: w, max: maxLine}
	if s.exact != nil || s.norm != nil {
		lw.sc = newScanner(s.exact, s.norm)
	}
	return lw
}

type lineWriter struct {
	s   *Scrubber
	w   io.Writer
	max int

	mu sync.Mutex
	// sc finds the secrets' forms in the stream; held is the input it
	// has not released yet, from offset base on.
	sc     *scanner
	held   []byte
	base   int
	buf    []byte // the current partial line
	pem    []byte // the held lines of an open PEM block
	out    []byte // scrubbed output of the current call
	phase  int
	err    error
	closed bool
}

// Write implements io.Writer.
func (lw *lineWriter) Write(p []byte) (int, error) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if lw.err != nil {
		return 0, lw.err
	}
	if lw.closed {
		return 0, ErrClosed
	}
	lw.exact(p, false)
	lw.lines()
	if err := lw.flush(); err != nil {
		return 0, err
	}
	return len(p), nil
}

// exact feeds p to the scanner and appends what it releases, with the
// secrets' forms replaced, to the current partial line.
func (lw *lineWriter) exact(p []byte, final bool) {
	if lw.sc == nil {
		lw.buf = append(lw.buf, p...)
		return
	}
	lw.held = append(lw.held, p...)
	feed(lw.sc, lw.held, lw.base, final)
	upto := lw.base + len(lw.held)
	if !final {
		upto = lw.sc.safe()
	}
	lw.buf = take(lw.sc, lw.buf, lw.held, lw.base, upto)
	lw.held = append(lw.held[:0], lw.held[upto-lw.base:]...)
	lw.base = upto
}

// lines handles the complete lines of buf, and cuts an overlong partial
// one.
func (lw *lineWriter) lines() {
	done := 0
	for {
		i := bytes.IndexByte(lw.buf[done:], '\n')
		if i < 0 {
			break
		}
		lw.line(lw.buf[done:done+i], "\n")
		done += i + 1
	}
	for len(lw.buf)-done > lw.max {
		rest := lw.buf[done:]
		cut := bytes.LastIndexAny(rest, " \t") + 1
		if cut == 0 || len(rest)-cut > lw.max {
			cut = len(rest)
		}
		lw.line(rest[:cut], "")
		done += cut
	}
	lw.buf = append(lw.buf[:0], lw.buf[done:]...)
}

// Close writes the scrubbed rest: a last line without a newline and a
// PEM block that never ended. It does not close the underlying writer.
func (lw *lineWriter) Close() error {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if lw.err != nil {
		return lw.err
	}
	if lw.closed {
		return nil
	}
	lw.closed = true
	lw.exact(nil, true)
	lw.lines()
	if len(lw.buf) > 0 {
		lw.line(lw.buf, "")
		lw.buf = nil
	}
	if lw.phase == phasePEM {
		lw.emitPEM()
	}
	return lw.flush()
}

// line handles one line; end is its terminator ("\n", or "" for a cut or
// final piece).
func (lw *lineWriter) line(text []byte, end string) {
	switch lw.phase {
	case phaseText:
		if lw.s.defaults && opensPEM(text) {
			lw.phase = phasePEM
			lw.pem = append(append(lw.pem[:0], text...), end...)
			return
		}
		lw.emit(text, end)
	case phasePEM:
		lw.pem = append(append(lw.pem, text...), end...)
		if pemEnd().Match(text) {
			lw.emitPEM()
		} else if len(lw.pem) > lw.max {
			// Scrubbed as an unterminated block: redacted from BEGIN on.
			lw.emitPEM()
			lw.phase = phaseSkipPEM
		}
	case phaseSkipPEM:
		if loc := pemEnd().FindIndex(text); loc != nil {
			lw.phase = phaseText
			lw.emit(text[loc[1]:], end)
		}
	}
}

// emitPEM scrubs and emits the held PEM block and returns to text.
func (lw *lineWriter) emitPEM() {
	block := lw.pem
	end := ""
	if n := len(block); n > 0 && block[n-1] == '\n' {
		block, end = block[:n-1], "\n"
	}
	lw.emit(block, end)
	lw.pem = lw.pem[:0]
	lw.phase = phaseText
}

func (lw *lineWriter) emit(text []byte, end string) {
	out := string(text)
	if lw.sc == nil {
		out, _ = lw.s.exactPass(out)
	}
	out, _ = lw.s.patternPass(out)
	lw.out = append(lw.out, out...)
	lw.out = append(lw.out, end...)
}

// flush writes the output collected by the current call to w.
func (lw *lineWriter) flush() error {
	if len(lw.out) == 0 {
		return nil
	}
	_, err := lw.w.Write(lw.out)
	lw.out = lw.out[:0]
	if err != nil {
		lw.err = err
	}
	return err
}

// opensPEM reports whether text has a PEM private key BEGIN line with no
// END line after it.
func opensPEM(text []byte) bool {
	begins := pemBegin().FindAllIndex(text, -1)
	if begins == nil {
		return false
	}
	last := begins[len(begins)-1]
	return !pemEnd().Match(text[last[1]:])
}
