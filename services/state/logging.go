package state

import (
	"context"
	"log/slog"
)

// callLogError is the attribute of a call-log line that holds the
// status message (pkg/interceptor/calllog).
const callLogError = "grpc.error"

// CallLogHandler wraps h, the handler of the logger a state server's
// interceptor chain (grpcserver.New) writes with, so that the call log's
// lines below WARN, one per call that failed by the caller's doing
// (NOT_FOUND, FAILED_PRECONDITION, INVALID_ARGUMENT), go without the
// status message, at every log level.
//
// Those messages quote the caller's keys (`key "k" in session/s: not
// found`), and a key is the caller's data like a value: a sandbox that
// reads through the environment's state bridge chooses the keys it
// reads, and may choose a credential injected into it. The caller still
// receives the message; the line keeps the method, the code, the
// duration and the principal. Keys are logged by the audit log only,
// for writes and deletes that an authenticated principal made.
// Other lines pass unchanged.
func CallLogHandler(h slog.Handler) slog.Handler { return callLogHandler{h} }

type callLogHandler struct{ next slog.Handler }

func (c callLogHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return c.next.Enabled(ctx, l)
}

func (c callLogHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		return c.next.Handle(ctx, r)
	}
	found := false
	r.Attrs(func(a slog.Attr) bool {
		found = a.Key == callLogError
		return !found
	})
	if !found {
		return c.next.Handle(ctx, r)
	}
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		if a.Key != callLogError {
			out.AddAttrs(a)
		}
		return true
	})
	return c.next.Handle(ctx, out)
}

func (c callLogHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return callLogHandler{c.next.WithAttrs(as)}
}

func (c callLogHandler) WithGroup(name string) slog.Handler {
	return callLogHandler{c.next.WithGroup(name)}
}
