package lifecycle

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	"github.com/secbear/neuron/pkg/errs"
)

// Server implements layer0.lifecycle.v1.LifecycleService over a Bus.
type Server struct {
	lifecyclev1.UnimplementedLifecycleServiceServer
	bus  *Bus
	log  *slog.Logger
	stop <-chan struct{} // nil: never
	wlog WorkflowLog
	poll time.Duration
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

// WithLogger logs subscribers that missed events (one line when their
// stream ends). The default discards.
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
// for in-flight calls, and a subscription never ends by itself.
func WithShutdown(ctx context.Context) ServerOption {
	return func(s *Server) { s.stop = ctx.Done() }
}

// NewServer returns the LifecycleService handler for b.
func NewServer(b *Bus, opts ...ServerOption) *Server {
	s := &Server{bus: b, log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(s)
	}
	return s
}

// errShuttingDown ends streams when the bus closes or the server stops.
var errShuttingDown = fmt.Errorf("the lifecycle service is shutting down: %w", errs.Unavailable)

// Subscribe implements LifecycleServiceServer.
func (s *Server) Subscribe(req *lifecyclev1.SubscribeRequest, stream grpc.ServerStreamingServer[lifecyclev1.SubscribeResponse]) error {
	if s.stopped() {
		return errShuttingDown
	}
	if req.AfterWorkflowSequence != nil {
		return s.subscribeLog(req, stream)
	}
	var after *uint64
	if req.AfterSequence != nil {
		after = proto.Uint64(req.GetAfterSequence())
	}
	sub, err := s.bus.Subscribe(FilterFrom(req), after)
	if err != nil {
		return err
	}
	defer sub.Close()
	ctx := stream.Context()
	defer func() {
		if n := sub.Dropped(); n > 0 {
			s.log.WarnContext(ctx, "lifecycle subscriber missed events: it fell behind its buffer", "dropped_total", n)
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.stop:
			return errShuttingDown
		case d, ok := <-sub.C():
			if !ok {
				return errShuttingDown
			}
			if err := stream.Send(&lifecyclev1.SubscribeResponse{Event: d.Event, Dropped: d.Dropped}); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return fmt.Errorf("send event %d: %w", d.Event.GetSequence(), err)
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
	defer wake.Close()
	ctx := stream.Context()
	poll := s.poll
	if poll <= 0 {
		poll = time.Second
	}
	timer := time.NewTimer(poll)
	defer timer.Stop()
	pos := req.GetAfterWorkflowSequence()
	for {
		evs, ended, err := s.wlog.Events(ctx, id, pos)
		if err != nil {
			return err
		}
		for _, ev := range evs {
			pos = ev.GetWorkflowSequence()
			if !f.Match(ev) {
				continue
			}
			if err := stream.Send(&lifecyclev1.SubscribeResponse{Event: ev}); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return fmt.Errorf("send event %d of workflow %q: %w", pos, id, err)
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
}
