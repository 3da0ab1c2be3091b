package calllog

import (
	"context"
	"log/slog"
)

type options struct {
	fields func(context.Context) []slog.Attr
}

// Option configures the interceptors.
type Option func(*options)

// WithFields adds attributes computed from the call's context at the end
// of the call (e.g. the authenticated principal).
func WithFields(f func(context.Context) []slog.Attr) Option {
	return func(o *options) { o.fields = f }
}

func evaluate(opts []Option) *options {
	o := &options{}
	for _, opt := range opts {
		opt(o)
	}
	return o
}
