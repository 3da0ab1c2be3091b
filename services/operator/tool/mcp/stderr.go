package mcp

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
)

const (
	// maxStderrLine caps one logged line of a server's stderr.
	maxStderrLine = 4096
	// stderrTailLen is how much of the end of a server's stderr a
	// connect error quotes.
	stderrTailLen = 512
)

// stderrLog is the stderr of a stdio server: it logs each line and keeps
// the last stderrTailLen bytes for error messages. exec writes to it from
// one goroutine; tail may be read from another.
type stderrLog struct {
	log *slog.Logger

	mu      sync.Mutex
	partial []byte // the current unfinished line, capped
	dropped bool   // partial was capped
	last    []byte // the last bytes written, at most stderrTailLen
}

func newStderrLog(log *slog.Logger) *stderrLog { return &stderrLog{log: log} }

func (s *stderrLog) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = append(s.last, p...)
	if n := len(s.last); n > stderrTailLen {
		s.last = append(s.last[:0], s.last[n-stderrTailLen:]...)
	}
	rest := p
	for len(rest) > 0 {
		i := bytes.IndexByte(rest, '\n')
		chunk := rest
		if i >= 0 {
			chunk = rest[:i]
		}
		if room := maxStderrLine - len(s.partial); len(chunk) > room {
			s.partial = append(s.partial, chunk[:room]...)
			s.dropped = true
		} else {
			s.partial = append(s.partial, chunk...)
		}
		if i < 0 {
			break
		}
		s.flushLocked()
		rest = rest[i+1:]
	}
	return len(p), nil
}

func (s *stderrLog) flushLocked() {
	line := strings.TrimRight(string(s.partial), "\r")
	if s.dropped {
		line += " [line truncated]"
	}
	s.log.Info("MCP server stderr", "line", line)
	s.partial = s.partial[:0]
	s.dropped = false
}

// flush logs an unfinished last line.
func (s *stderrLog) flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.partial) > 0 || s.dropped {
		s.flushLocked()
	}
}

// tail returns the end of what the server wrote, trimmed.
func (s *stderrLog) tail() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.TrimSpace(strings.ToValidUTF8(string(s.last), "\uFFFD"))
}
