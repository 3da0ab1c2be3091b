package calllog

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Level is the level of a finished call's line.
func Level(code codes.Code) slog.Level {
	switch code {
	case codes.OK:
		return slog.LevelDebug
	case codes.Canceled, codes.InvalidArgument, codes.NotFound, codes.AlreadyExists,
		codes.Unauthenticated, codes.FailedPrecondition, codes.OutOfRange, codes.Aborted:
		return slog.LevelInfo
	case codes.PermissionDenied, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Unavailable:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}

// UnaryServerInterceptor logs each finished unary call.
func UnaryServerInterceptor(log *slog.Logger, opts ...Option) grpc.UnaryServerInterceptor {
	o := evaluate(opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		o.log(ctx, log, info.FullMethod, "unary", start, err)
		return resp, err
	}
}

// StreamServerInterceptor logs each finished streaming call.
func StreamServerInterceptor(log *slog.Logger, opts ...Option) grpc.StreamServerInterceptor {
	o := evaluate(opts)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		start := time.Now()
		err := handler(srv, ss)
		o.log(ss.Context(), log, info.FullMethod, "stream", start, err)
		return err
	}
}

func (o *options) log(ctx context.Context, log *slog.Logger, method, kind string, start time.Time, err error) {
	st := status.Convert(err)
	lvl := Level(st.Code())
	if !log.Enabled(ctx, lvl) {
		return
	}
	attrs := []slog.Attr{
		slog.String("grpc.method", method),
		slog.String("grpc.kind", kind),
		slog.String("grpc.code", st.Code().String()),
		slog.Float64("grpc.time_ms", float64(time.Since(start).Microseconds())/1000),
	}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		attrs = append(attrs, slog.String("peer.address", p.Addr.String()))
	}
	if err != nil {
		attrs = append(attrs, slog.String("grpc.error", st.Message()))
	}
	if o.fields != nil {
		attrs = append(attrs, o.fields(ctx)...)
	}
	log.LogAttrs(ctx, lvl, "finished call", attrs...)
}
