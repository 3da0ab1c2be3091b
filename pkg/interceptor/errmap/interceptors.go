package errmap

import (
	"context"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/secbear/neuron/pkg/errs"
)

// UnaryServerInterceptor maps a unary handler's error to a status.
func UnaryServerInterceptor(opts ...Option) grpc.UnaryServerInterceptor {
	o := evaluate(opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if err != nil {
			return nil, o.convert(ctx, info.FullMethod, err)
		}
		return resp, nil
	}
}

// StreamServerInterceptor maps a streaming handler's error to a status.
func StreamServerInterceptor(opts ...Option) grpc.StreamServerInterceptor {
	o := evaluate(opts)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := handler(srv, ss); err != nil {
			return o.convert(ss.Context(), info.FullMethod, err)
		}
		return nil
	}
}

func (o *options) convert(ctx context.Context, method string, err error) error {
	st := errs.ToStatus(err)
	if st.Code() == codes.Internal {
		// The client sees "internal error"; the detail stays here.
		o.logger.LogAttrs(ctx, slog.LevelError, "internal error",
			slog.String("grpc.method", method), slog.String("error", err.Error()))
	}
	return st.Err()
}
