package store

import (
	"context"
	"log/slog"

	"google.golang.org/grpc"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/interceptor/auth"
	"github.com/secbear/neuron/pkg/scope"
)

// AuditInterceptor writes the audit log to log (nil discards it): one
// record per StateService Write or Delete, successful or not. Other calls
// pass through untouched.
func AuditInterceptor(log *slog.Logger) grpc.UnaryServerInterceptor {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		switch r := req.(type) {
		case *statev1.WriteRequest:
			attrs := auditAttrs(ctx, "write", r.GetScope(), r.GetKey(), err)
			if w, ok := resp.(*statev1.WriteResponse); ok && err == nil {
				attrs = append(attrs, slog.Uint64("revision", w.GetRevision()), slog.Bool("replayed", w.GetReplayed()))
			}
			if r.ExpectedRevision != nil {
				attrs = append(attrs, slog.Uint64("expected_revision", r.GetExpectedRevision()))
			}
			log.LogAttrs(ctx, slog.LevelInfo, "audit", attrs...)
		case *statev1.DeleteRequest:
			attrs := auditAttrs(ctx, "delete", r.GetScope(), r.GetKey(), err)
			if d, ok := resp.(*statev1.DeleteResponse); ok && err == nil {
				attrs = append(attrs, slog.Bool("existed", d.GetExisted()), slog.Bool("replayed", d.GetReplayed()))
			}
			log.LogAttrs(ctx, slog.LevelInfo, "audit", attrs...)
		}
		return resp, err
	}
}

func auditAttrs(ctx context.Context, op string, sc *typesv1.Scope, key string, err error) []slog.Attr {
	who := "anonymous (dev mode)"
	if p := auth.PrincipalFrom(ctx); p != nil {
		who = p.Name
	}
	return []slog.Attr{
		slog.String("op", op),
		slog.String("principal", who),
		slog.String("scope", scope.String(sc)),
		slog.String("key", key),
		// The status code, not the error: it is mapped later in the chain
		// only when the handler wrapped a kind, so use the kind's code.
		slog.String("code", errs.Code(err).String()),
	}
}
