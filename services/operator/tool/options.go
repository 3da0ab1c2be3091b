package tool

import (
	"log/slog"
	"time"
)

// Defaults of the knobs set by options.
const (
	// DefaultTimeout bounds a call of a tool whose Spec.Timeout is zero.
	DefaultTimeout = 2 * time.Minute
	// DefaultMaxOutputBytes is the most output of one call the model sees;
	// longer output is truncated with a notice.
	DefaultMaxOutputBytes = 64 << 10
)

// Option configures NewRegistry.
type Option func(*options)

type options struct {
	defaultTimeout time.Duration
	maxOutputBytes int
	logger         *slog.Logger
}

func defaultOptions() options {
	return options{
		defaultTimeout: DefaultTimeout,
		maxOutputBytes: DefaultMaxOutputBytes,
		logger:         slog.New(slog.DiscardHandler),
	}
}

// WithDefaultTimeout sets the timeout of tools whose Spec.Timeout is zero
// (default DefaultTimeout). A non-positive d keeps the default.
func WithDefaultTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.defaultTimeout = d
		}
	}
}

// WithMaxOutputBytes sets the most output bytes of one call passed to the
// model (default DefaultMaxOutputBytes); the truncation notice comes on
// top. A non-positive n keeps the default.
func WithMaxOutputBytes(n int) Option {
	return func(o *options) {
		if n > 0 {
			o.maxOutputBytes = n
		}
	}
}

// WithLogger sets the logger that records tool panics with their stack
// (default: discard). The model never sees a panic's details.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.logger = l
		}
	}
}
