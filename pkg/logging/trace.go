package logging

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/trace"
)

// WithTrace wraps h so that a record logged with a context holding a
// valid OpenTelemetry span (logger.InfoContext(ctx, ...)) carries its
// trace_id and span_id, for joining logs with traces. New installs it.
func WithTrace(h slog.Handler) slog.Handler { return traceHandler{h} }

type traceHandler struct{ next slog.Handler }

func (t traceHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return t.next.Enabled(ctx, l)
}

func (t traceHandler) Handle(ctx context.Context, rec slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		rec = rec.Clone()
		rec.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return t.next.Handle(ctx, rec)
}

func (t traceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return traceHandler{t.next.WithAttrs(as)}
}

func (t traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{t.next.WithGroup(name)}
}
