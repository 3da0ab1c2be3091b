package audit

import "log/slog"

type options struct {
	logger *slog.Logger
}

// Option configures the interceptor.
type Option func(*options)

// WithLogger sets where audit records go (default: discarded).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

func evaluate(opts []Option) *options {
	o := &options{logger: slog.New(slog.DiscardHandler)}
	for _, opt := range opts {
		opt(o)
	}
	return o
}
