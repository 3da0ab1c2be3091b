package lifecycle

import (
	"context"
	"fmt"
	"log/slog"

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
