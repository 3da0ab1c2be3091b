package errmap

import "log/slog"

type options struct {
	logger *slog.Logger
}

// Option configures the interceptors.
type Option func(*options)

// WithLogger sets where the text of unclassified errors is logged.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) { o.logger = l }
}

func evaluate(opts []Option) *options {
	o := &options{logger: slog.New(slog.DiscardHandler)}
	for _, opt := range opts {
		opt(o)
	}
	return o
}
