package lifecycle

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	"github.com/secbear/neuron/pkg/errs"
)

// errEnded is what send returns once the handler has ended the stream.
var errEnded = errors.New("the stream has ended")

// sender sends one Subscribe stream's responses, from one goroutine, and
// keeps what the handler needs to end the stream while a Send is blocked:
// the position of the last event sent, and of the one being sent. A
// position is what the client resubscribes with: the sequence on a live
// stream, the workflow sequence on a log stream.
type sender struct {
	stream  grpc.ServerStreamingServer[lifecyclev1.SubscribeResponse]
	field   string // the request field a client resumes with
	timeout time.Duration
	// timer runs while a Send is in flight; it fires when the client has
	// not taken an event for timeout.
	timer *time.Timer

	mu       sync.Mutex
	ended    bool
	last     uint64    // position of the last event sent, or where the stream started
	inflight uint64    // position of the event being sent; 0: none
	since    time.Time // when that Send started
}

func newSender(stream grpc.ServerStreamingServer[lifecyclev1.SubscribeResponse], timeout time.Duration, field string, start uint64) *sender {
	t := time.NewTimer(timeout)
	t.Stop()
	return &sender{stream: stream, field: field, timeout: timeout, timer: t, last: start}
}

// send sends resp, the event at position pos, unless the stream was
// ended.
//
// The message is encoded first into a buffer of its own size
// (grpc.PreparedMsg), not into one of gRPC's pooled buffers, which round
// a message over 1 KiB up to 4 KiB, 16 KiB, 32 KiB or 1 MiB. What a stream
// whose client does not read pins in gRPC's send queue (its write quota:
// 64 KiB of messages, and the one that goes over it) is then the size of
// the events, not up to 32 times it.
func (s *sender) send(resp *lifecyclev1.SubscribeResponse, pos uint64) error {
	var msg grpc.PreparedMsg
	if err := msg.Encode(s.stream, resp); err != nil {
		return err
	}
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return errEnded
	}
	s.inflight, s.since = pos, time.Now()
	s.mu.Unlock()
	s.timer.Reset(s.timeout)
	err := s.stream.SendMsg(&msg)
	s.timer.Stop()
	s.mu.Lock()
	s.inflight = 0
	if err == nil {
		s.last = pos
	}
	s.mu.Unlock()
	return err
}

// end stops further sends and says where the client resumes: after the
// last event sent, or, when a Send was in flight, possibly after that
// one (it reaches the client if the client reads before gRPC cancels the
// stream; events reach it in order, so it knows which).
func (s *sender) end() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended = true
	return s.resume()
}

// resume is end's sentence; callers hold s.mu.
func (s *sender) resume() string {
	if s.inflight == 0 {
		return fmt.Sprintf("resubscribe with %s=%d to resume", s.field, s.last)
	}
	return fmt.Sprintf("resubscribe with %s=%d to resume (%d if event %d reached you before this status)",
		s.field, s.last, s.inflight, s.inflight)
}

// stalled ends the stream when a Send has been in flight for the
// timeout, and returns the error it ends with; nil when the Send the
// timer was started for has finished since.
func (s *sender) stalled() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inflight == 0 {
		return nil
	}
	if waited := time.Since(s.since); waited < s.timeout {
		s.timer.Reset(s.timeout - waited)
		return nil
	}
	s.ended = true
	return fmt.Errorf("the client has not read the stream for %v (--%s): event %d is still waiting to be sent; %s: %w",
		s.timeout, FlagSendTimeout, s.inflight, s.resume(), errs.ResourceExhausted)
}
