package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	"github.com/secbear/neuron/pkg/errs"
)

// Server implements layer0.lifecycle.v1.LifecycleService over a Bus.
type Server struct {
	lifecyclev1.UnimplementedLifecycleServiceServer
	bus         *Bus
	log         *slog.Logger
	stop        <-chan struct{} // nil: never
	wlog        WorkflowLog
	poll        time.Duration
	limits      streamLimits
	sendTimeout time.Duration
}

// WorkflowLog is a durable log of each workflow's events, shared by every
// replica of the orchestrator (its engine keeps it).
type WorkflowLog interface {
	// Events returns the events recorded for workflow id after position
	// after, in order, each with its WorkflowSequence; ended is true when
	// the workflow has ended and no event follows those returned.
	// Unknown workflow: errs.NotFound.
	Events(ctx context.Context, id string, after uint64) (events []*lifecyclev1.LifecycleEvent, ended bool, err error)
}

// WithWorkflowLog serves subscriptions with after_workflow_sequence from
// l. Events recorded by this process are streamed as soon as its bus
// publishes them; those recorded by another replica within poll.
func WithWorkflowLog(l WorkflowLog, poll time.Duration) ServerOption {
	return func(s *Server) { s.wlog, s.poll = l, poll }
}

// ServerOption configures a Server.
type ServerOption func(*Server)

// WithLogger logs, one line each at warning level, the Subscribe streams
// refused by a cap and those ended because their subscriber did not keep
// up or did not read. The default discards.
func WithLogger(log *slog.Logger) ServerOption {
	return func(s *Server) {
		if log != nil {
			s.log = log
		}
	}
}

// WithShutdown ends every Subscribe stream with UNAVAILABLE once ctx is
// done, and refuses new ones, while the bus stays open for publishers.
// Pass the context given to grpcserver.Server.Serve: a graceful stop waits
// for in-flight calls, and a subscription that keeps up never ends by
// itself.
func WithShutdown(ctx context.Context) ServerOption {
	return func(s *Server) { s.stop = ctx.Done() }
}

// WithSendTimeout ends a Subscribe stream whose client has not taken an
// event for d: its Send has been blocked that long by HTTP/2 flow
// control, so the client is not reading. The stream ends with
// RESOURCE_EXHAUSTED naming the sequence to resume after, and frees its
// slot under WithStreamLimits. d <= 0 takes DefaultSendTimeout.
func WithSendTimeout(d time.Duration) ServerOption {
	return func(s *Server) {
		if d > 0 {
			s.sendTimeout = d
		}
	}
}

// NewServer returns the LifecycleService handler for b.
func NewServer(b *Bus, opts ...ServerOption) *Server {
	s := &Server{
		bus:         b,
		log:         slog.New(slog.DiscardHandler),
		limits:      streamLimits{total: DefaultMaxStreams, perClient: DefaultMaxStreamsPerClient},
		sendTimeout: DefaultSendTimeout,
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// errShuttingDown ends streams when the bus closes or the server stops.
var errShuttingDown = fmt.Errorf("the lifecycle service is shutting down: %w", errs.Unavailable)

// Subscribe implements LifecycleServiceServer. A stream is admitted under
// the caps of WithStreamLimits and subscribed before its response headers
// are sent, so a client that sees the headers is subscribed. Its events
// are sent from a goroutine of their own, so that the handler can end the
// stream while a Send is blocked on a client that does not read: when the
// subscriber's buffer overflows (the bus ends an UntilFull subscription)
// or a Send has waited WithSendTimeout. Either ends the stream with
// RESOURCE_EXHAUSTED naming the after_sequence to resubscribe with; the
// events sent before it are contiguous, so the resubscription replays
// what the ring still holds with no gap and no duplicate.
func (s *Server) Subscribe(req *lifecyclev1.SubscribeRequest, stream grpc.ServerStreamingServer[lifecyclev1.SubscribeResponse]) error {
	if s.stopped() {
		return errShuttingDown
	}
	ctx := stream.Context()
	release, err := s.limits.admit(ctx)
	if err != nil {
		s.log.WarnContext(ctx, "lifecycle subscription refused", "error", err)
		return err
	}
	defer release()
	if req.AfterWorkflowSequence != nil {
		return s.subscribeLog(req, stream)
	}
	var after *uint64
	if req.AfterSequence != nil {
		after = proto.Uint64(req.GetAfterSequence())
	}
	sub, err := s.bus.Subscribe(FilterFrom(req), after, UntilFull())
	if err != nil {
		return err
	}
	defer sub.Close()
	if err := stream.SendHeader(metadata.MD{}); err != nil {
		return s.sendFailed(ctx, err, "send headers")
	}
	snd := newSender(stream, s.sendTimeout, "after_sequence", sub.After())
	// overflowed is the stream's end once the subscription has overflowed;
	// nil while it has not (or the bus closed instead).
	overflowed := sync.OnceValue(func() error {
		var full *OverflowError
		if !errors.As(sub.Err(), &full) {
			return nil
		}
		err := fmt.Errorf("%v (--%s, --%s); %s: %w", full, FlagSubscriberBuffer, FlagSubscriberBufferBytes, snd.end(), errs.ResourceExhausted)
		s.log.WarnContext(ctx, "lifecycle subscriber ended: it did not keep up", "error", err)
		return err
	})
	return s.pump(ctx, snd, sub.Done(), overflowed, func() error {
		for d := range sub.C() {
			resp := &lifecyclev1.SubscribeResponse{Event: d.Event, Dropped: d.Dropped}
			if err := snd.send(resp, d.Event.GetSequence()); err != nil {
				return s.sendFailed(ctx, err, fmt.Sprintf("send event %d", d.Event.GetSequence()))
			}
		}
		if err := overflowed(); err != nil {
			return err
		}
		return errShuttingDown // the bus closed; what it held was sent
	})
}

// sendFailed is the stream's end after a failed Send.
func (s *Server) sendFailed(ctx context.Context, err error, what string) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%s: %w", what, err)
}

// pump runs body, which sends the stream's events through snd, in a
// goroutine of its own, and returns its result unless the stream has to
// end first: end is closed and ended() says the stream ends (nil: let
// body finish), the client leaves, the server stops, or a Send has waited
// longer than the send timeout. Ending first makes gRPC cancel the
// stream, which unblocks body's Send; body then returns (into a buffered
// channel nobody reads) and exits.
func (s *Server) pump(ctx context.Context, snd *sender, end <-chan struct{}, ended func() error, body func() error) error {
	result := make(chan error, 1)
	go func() { result <- body() }()
	for {
		select {
		case err := <-result:
			return err
		case <-end:
			if err := ended(); err != nil {
				return err
			}
			end = nil
		case <-ctx.Done():
			snd.end()
			return ctx.Err()
		case <-s.stop:
			snd.end()
			return errShuttingDown
		case <-snd.timer.C:
			if err := snd.stalled(); err != nil {
				s.log.WarnContext(ctx, "lifecycle subscriber ended: it does not read", "error", err)
				return err
			}
		}
	}
}

func (s *Server) stopped() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

// Publish implements LifecycleServiceServer. The server always assigns
// the sequence; a time set by the publisher is kept.
func (s *Server) Publish(_ context.Context, req *lifecyclev1.PublishRequest) (*lifecyclev1.PublishResponse, error) {
	ev := req.GetEvent()
	if ev == nil {
		return nil, fmt.Errorf("event is required: %w", errs.InvalidArgument)
	}
	if Kind(ev) == lifecyclev1.EventKind_EVENT_KIND_UNSPECIFIED {
		return nil, fmt.Errorf("event: one of budget, compaction or observable is required: %w", errs.InvalidArgument)
	}
	// The request is ours: the bus may keep it without a clone.
	seq := s.bus.publish(ev)
	if seq == 0 {
		return nil, errShuttingDown
	}
	return &lifecyclev1.PublishResponse{Sequence: seq}, nil
}

// subscribeLog streams a workflow's durable event log from after
// req.after_workflow_sequence, then follows it until the workflow ends.
func (s *Server) subscribeLog(req *lifecyclev1.SubscribeRequest, stream grpc.ServerStreamingServer[lifecyclev1.SubscribeResponse]) error {
	id := req.GetWorkflowId()
	switch {
	case id == "":
		return fmt.Errorf("after_workflow_sequence needs workflow_id: the log is per workflow: %w", errs.InvalidArgument)
	case req.AfterSequence != nil:
		return fmt.Errorf("after_sequence and after_workflow_sequence are exclusive: pass one: %w", errs.InvalidArgument)
	case s.wlog == nil:
		return fmt.Errorf("this LifecycleService keeps no workflow event log (after_workflow_sequence is served by the orchestrator): %w", errs.FailedPrecondition)
	}
	f := FilterFrom(req)
	if err := f.Validate(); err != nil {
		return err
	}
	// Events this process records for the workflow wake the loop at once;
	// the poll finds those of other replicas.
	wake, err := s.bus.Subscribe(Filter{WorkflowID: id}, nil)
	if err != nil {
		return err
	}
	ctx := stream.Context()
	pos := req.GetAfterWorkflowSequence()
	snd := newSender(stream, s.sendTimeout, "after_workflow_sequence", pos)
	return s.pump(ctx, snd, nil, nil, func() error {
		defer wake.Close()
		poll := s.poll
		if poll <= 0 {
			poll = time.Second
		}
		timer := time.NewTimer(poll)
		defer timer.Stop()
		for headers := true; ; headers = false {
			evs, ended, err := s.wlog.Events(ctx, id, pos)
			if err != nil {
				return err
			}
			if headers { // the workflow exists: the stream is subscribed
				if err := stream.SendHeader(metadata.MD{}); err != nil {
					return s.sendFailed(ctx, err, "send headers")
				}
			}
			for _, ev := range evs {
				pos = ev.GetWorkflowSequence()
				if !f.Match(ev) {
					continue
				}
				if err := snd.send(&lifecyclev1.SubscribeResponse{Event: ev}, pos); err != nil {
					return s.sendFailed(ctx, err, fmt.Sprintf("send event %d of workflow %q", pos, id))
				}
			}
			if len(evs) > 0 {
				continue // there may be more than one page
			}
			if ended {
				return nil
			}
			timer.Reset(poll)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-s.stop:
				return errShuttingDown
			case _, ok := <-wake.C():
				if !ok {
					return errShuttingDown
				}
				// A burst of events is one wake-up; the log returns them all.
				for len(wake.C()) > 0 {
					<-wake.C()
				}
			case <-timer.C:
			}
		}
	})
}
