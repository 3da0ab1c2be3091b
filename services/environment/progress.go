package environment

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment/scrub"
)

// ProgressEnv is the environment variable that gives the one-shot
// operator the path of its invocation's progress socket (the operator's
// ProgressSocketEnv). On that socket the operator writes its progress
// events (operator.v1.ExecuteStreamResponse, never its output), each as
// a frame: a 4-byte big-endian length, then the event in binary
// protobuf. Only RunStream starts the socket.
const ProgressEnv = "NEURON_PROGRESS_SOCKET"

// ProgressLimits bound what one invocation's progress may cost the
// service. The sandbox is untrusted: a frame or a total past its limit
// stops the run with RESOURCE_EXHAUSTED, like the output limit.
type ProgressLimits struct {
	// FrameBytes is the largest frame (one event). The one-shot
	// operator keeps its events under the same 1 MiB
	// (operator.MaxProgressFrame), truncating long tool results.
	FrameBytes int
	// TotalBytes bounds the frames of one invocation together.
	TotalBytes int64
	// Frames bounds the number of frames of one invocation.
	Frames int64
	// QueueBytes bounds the events read from the sandbox but not yet
	// sent to the caller. Past it the service stops reading the socket
	// and the operator waits (its timeout still runs), so a caller that
	// reads slowly slows the run down instead of filling memory.
	QueueBytes int
}

// DefaultProgressLimits are the limits of ServerConfig.Progress when it
// is zero: 1 MiB frames, 64 MiB and a million frames in all, 2 MiB
// queued.
func DefaultProgressLimits() ProgressLimits {
	return ProgressLimits{FrameBytes: 1 << 20, TotalBytes: 64 << 20, Frames: 1 << 20, QueueBytes: 2 << 20}
}

// withDefaults fills in the zero fields.
func (l ProgressLimits) withDefaults() ProgressLimits {
	d := DefaultProgressLimits()
	if l.FrameBytes <= 0 {
		l.FrameBytes = d.FrameBytes
	}
	if l.TotalBytes <= 0 {
		l.TotalBytes = d.TotalBytes
	}
	if l.Frames <= 0 {
		l.Frames = d.Frames
	}
	if l.QueueBytes <= 0 {
		l.QueueBytes = d.QueueBytes
	}
	return l
}

// progressDrain is how long a stopping progress socket keeps reading
// what the operator wrote before it exited.
const progressDrain = 2 * time.Second

// errProgressStopped is returned by Send once the run has ended.
var errProgressStopped = errors.New("the run's progress has ended")

// Progress carries one RunStream invocation's progress events from the
// operator to the caller. Every event is checked (its size, its kind:
// never the output), counted against ProgressLimits and scrubbed of the
// invocation's credentials like the output: text deltas as one stream,
// so that a secret split over several deltas is still found, which
// means text is passed on a line at a time (see scrub.Writer), and at
// the latest before the next event of another kind. A violation stops
// the run with a clear error.
//
// A backend whose operator runs in a sandbox calls Serve for a socket
// the operator writes frames to (ProgressEnv); one that gets the events
// in process (the local backend) calls Send. Backends that can do
// neither ignore it: RunStream then sends only the result.
type Progress struct {
	lim      ProgressLimits
	scrubber *scrub.Scrubber
	log      *slog.Logger
	q        *progressQueue
	// fail stops the run with err.
	fail func(err error)
	// stopped is closed when the run has ended: nothing more is queued.
	stopped  chan struct{}
	stopOnce sync.Once

	mu      sync.Mutex // one event at a time, in order
	err     error      // the first violation
	frames  int64
	bytes   int64
	skipped int64 // events of a kind this service does not know
	text    io.WriteCloser
	delta   *deltaWriter
}

func newProgress(lim ProgressLimits, sc *scrub.Scrubber, q *progressQueue, fail func(error), log *slog.Logger) *Progress {
	return &Progress{lim: lim.withDefaults(), scrubber: sc, q: q, fail: fail, log: log, stopped: make(chan struct{})}
}

// Send passes one progress event on to the caller, in order. An error
// means the run must end: the event broke a limit or was malformed, or
// the run has already ended.
func (p *Progress) Send(ev *operatorv1.ExecuteStreamResponse) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return p.err
	}
	if err := p.count(proto.Size(ev)); err != nil {
		return p.violation(err)
	}
	if err := p.deliver(ev); err != nil {
		return p.violation(err)
	}
	return nil
}

// Err returns the violation that stopped the run, if any.
func (p *Progress) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// count charges one frame of n bytes against the limits.
func (p *Progress) count(n int) error {
	p.frames++
	p.bytes += int64(n)
	switch {
	case n > p.lim.FrameBytes:
		return fmt.Errorf("the operator sent a progress event of %d bytes, more than the limit of %d; the run was stopped: %w", n, p.lim.FrameBytes, errs.ResourceExhausted)
	case p.bytes > p.lim.TotalBytes:
		return fmt.Errorf("the operator sent more than %d bytes of progress events; the run was stopped: %w", p.lim.TotalBytes, errs.ResourceExhausted)
	case p.frames > p.lim.Frames:
		return fmt.Errorf("the operator sent more than %d progress events; the run was stopped: %w", p.lim.Frames, errs.ResourceExhausted)
	}
	return nil
}

// violation records err as the reason the run stops, and stops it.
func (p *Progress) violation(err error) error {
	if errors.Is(err, errProgressStopped) {
		return err
	}
	if p.err == nil {
		p.err = err
		p.log.Warn("progress stopped the run", "error", err.Error(), "frames", p.frames, "bytes", p.bytes)
		p.fail(err)
	}
	return p.err
}

// deliver checks, scrubs and queues one event. Called with mu held.
func (p *Progress) deliver(ev *operatorv1.ExecuteStreamResponse) error {
	switch e := ev.GetEvent().(type) {
	case *operatorv1.ExecuteStreamResponse_Output:
		return fmt.Errorf("the operator sent its output as a progress event; the output travels only as the run's result; the run was stopped: %w", errs.NonRetryable)
	case nil:
		// A kind this service does not know (a newer operator): it
		// cannot be checked, so it is not passed on.
		p.skipped++
		return nil
	case *operatorv1.ExecuteStreamResponse_TextDelta:
		turn := e.TextDelta.GetTurn()
		if p.text != nil && p.delta.turn != turn {
			if err := p.flushText(); err != nil {
				return err
			}
		}
		if p.text == nil {
			p.delta = &deltaWriter{p: p, turn: turn}
			p.text = p.scrubber.Writer(p.delta)
		}
		if _, err := io.WriteString(p.text, e.TextDelta.GetText()); err != nil {
			return err
		}
		return nil
	default:
		if err := p.flushText(); err != nil {
			return err
		}
		p.scrubber.Message(ev)
		return p.q.put(ev, p.stopped)
	}
}

// flushText passes on the text held for scrubbing. Called with mu held.
func (p *Progress) flushText() error {
	if p.text == nil {
		return nil
	}
	err := p.text.Close()
	if err == nil {
		err = p.delta.flush()
	}
	p.text, p.delta = nil, nil
	return err
}

// finish passes on the text still held and stops queueing. It is called
// once the backend has returned; later events are refused.
func (p *Progress) finish() {
	p.mu.Lock()
	if p.err == nil {
		if err := p.flushText(); err != nil && !errors.Is(err, errProgressStopped) {
			p.log.Warn("progress: the last text could not be passed on", "error", err.Error())
		}
	}
	if p.skipped > 0 {
		p.log.Warn("progress events of an unknown kind were not passed on", "skipped", p.skipped)
	}
	p.mu.Unlock()
	p.halt()
}

// halt stops queueing: a Send waiting for room returns at once.
func (p *Progress) halt() { p.stopOnce.Do(func() { close(p.stopped) }) }

// Serve listens on a Unix socket at path for the operator's progress
// frames (see ProgressEnv) and passes each event on, until stop is
// called. It accepts one connection, the first; the listener is closed
// then. stop reads what the operator wrote before it exited (briefly:
// the backend calls it once the sandbox is gone), then closes the
// socket. A frame that is not a length and an ExecuteStreamResponse
// stops the run; so does one past the limits.
func (p *Progress) Serve(path string) (stop func(), err error) {
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("progress socket: %w", err)
	}
	// The sandboxed operator may run as another uid.
	if err := os.Chmod(path, 0o666); err != nil {
		l.Close()
		return nil, fmt.Errorf("progress socket: %w", err)
	}
	var (
		mu   sync.Mutex
		conn net.Conn
		shut bool
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := l.Accept()
		l.Close()
		if err != nil {
			return
		}
		mu.Lock()
		if shut {
			mu.Unlock()
			c.Close()
			return
		}
		conn = c
		mu.Unlock()
		defer c.Close()
		p.read(c)
	}()
	return func() {
		l.Close()
		t := time.NewTimer(progressDrain)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
			// The operator's side is still open, or the caller reads
			// too slowly to take what is left: stop here.
			p.log.Warn("progress: the socket was still busy when the run ended; the rest of its events were dropped")
			p.halt()
			mu.Lock()
			shut = true
			if conn != nil {
				conn.Close()
			}
			mu.Unlock()
			<-done
		}
		_ = os.Remove(path)
	}, nil
}

// read passes on the frames of c until it ends or breaks a rule.
func (p *Progress) read(c net.Conn) {
	var hdr [4]byte
	for n := 1; ; n++ {
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			if !errors.Is(err, io.EOF) && !p.isStopped() {
				p.log.Warn("progress: the socket ended inside a frame header; the partial frame was dropped", "frame", n, "error", err.Error())
			}
			return
		}
		size := binary.BigEndian.Uint32(hdr[:])
		p.mu.Lock()
		err := p.count(int(min(size, 1<<31-1)))
		if err != nil {
			p.violation(err)
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		buf := make([]byte, size)
		if _, err := io.ReadFull(c, buf); err != nil {
			if !p.isStopped() {
				p.log.Warn("progress: the socket ended inside a frame; the partial frame was dropped", "frame", n, "error", err.Error())
			}
			return
		}
		ev := &operatorv1.ExecuteStreamResponse{}
		if err := (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(buf, ev); err != nil {
			p.mu.Lock()
			p.violation(fmt.Errorf("the operator's progress frame %d is not an ExecuteStreamResponse (%v); the run was stopped: %w", n, err, errs.NonRetryable))
			p.mu.Unlock()
			return
		}
		p.mu.Lock()
		if p.err != nil {
			p.mu.Unlock()
			return
		}
		if err := p.deliver(ev); err != nil {
			p.violation(err)
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
	}
}

func (p *Progress) isStopped() bool {
	select {
	case <-p.stopped:
		return true
	default:
		return false
	}
}

// deltaWriter turns the scrubbed text of one turn into TextDelta events.
// It holds back the bytes of a character cut in two, so that every
// delta is valid UTF-8.
type deltaWriter struct {
	p       *Progress
	turn    uint32
	partial []byte
}

func (d *deltaWriter) Write(b []byte) (int, error) {
	buf := append(d.partial, b...)
	cut := len(buf)
	// Back up over an incomplete last character (at most 3 bytes).
	for i := len(buf) - 1; i >= 0 && i >= len(buf)-utf8.UTFMax; i-- {
		if utf8.RuneStart(buf[i]) {
			if !utf8.FullRune(buf[i:]) {
				cut = i
			}
			break
		}
	}
	d.partial = append([]byte(nil), buf[cut:]...)
	if cut == 0 {
		return len(b), nil
	}
	if err := d.emit(string(buf[:cut])); err != nil {
		return 0, err
	}
	return len(b), nil
}

// flush passes on a held partial character, made valid.
func (d *deltaWriter) flush() error {
	if len(d.partial) == 0 {
		return nil
	}
	s := string(d.partial)
	d.partial = nil
	return d.emit(s)
}

func (d *deltaWriter) emit(s string) error {
	return d.p.q.put(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_TextDelta{
		TextDelta: &operatorv1.TextDelta{Turn: d.turn, Text: strings.ToValidUTF8(s, "\uFFFD")},
	}}, d.p.stopped)
}

// progressQueue holds the events on their way to the caller, at most
// max bytes of them (and always at least one).
type progressQueue struct {
	ch    chan queued
	freed chan struct{}
	mu    sync.Mutex
	held  int
	max   int
}

type queued struct {
	ev   *operatorv1.ExecuteStreamResponse
	size int
}

func newProgressQueue(maxBytes int) *progressQueue {
	return &progressQueue{ch: make(chan queued, 1024), freed: make(chan struct{}, 1), max: maxBytes}
}

// put queues ev, waiting while the queue is full, until stopped closes.
func (q *progressQueue) put(ev *operatorv1.ExecuteStreamResponse, stopped <-chan struct{}) error {
	n := proto.Size(ev)
	for {
		q.mu.Lock()
		if q.held == 0 || q.held+n <= q.max {
			q.held += n
			q.mu.Unlock()
			break
		}
		q.mu.Unlock()
		select {
		case <-q.freed:
		case <-stopped:
			return errProgressStopped
		}
	}
	select {
	case q.ch <- queued{ev, n}:
		return nil
	case <-stopped:
		q.release(n)
		return errProgressStopped
	}
}

// release gives back the room of an event that was sent.
func (q *progressQueue) release(n int) {
	q.mu.Lock()
	q.held -= n
	q.mu.Unlock()
	select {
	case q.freed <- struct{}{}:
	default:
	}
}
