package state

import (
	"log/slog"
	"time"
)

// Defaults of the knobs set by options.
const (
	// DefaultIdempotencyRetention is how long an idempotency key is
	// remembered. A retry after this may be applied again.
	DefaultIdempotencyRetention = 24 * time.Hour
	// DefaultLockTimeout is how long OpenBolt waits for the file lock.
	DefaultLockTimeout = time.Second
)

// Option configures OpenBolt or NewMemory.
type Option func(*options)

type options struct {
	limits      Limits
	retention   time.Duration
	lockTimeout time.Duration
	logger      *slog.Logger
	now         func() time.Time
}

func defaultOptions() options {
	return options{
		limits:      DefaultLimits(),
		retention:   DefaultIdempotencyRetention,
		lockTimeout: DefaultLockTimeout,
		logger:      slog.New(slog.DiscardHandler),
		now:         time.Now,
	}
}

func applyOptions(opts []Option) options {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// WithLimits sets the key and value size limits; zero fields keep their
// defaults and MaxKeyBytes is capped at MaxKeyBytesCeiling.
func WithLimits(l Limits) Option {
	return func(o *options) {
		if l.MaxKeyBytes > 0 {
			o.limits.MaxKeyBytes = min(l.MaxKeyBytes, MaxKeyBytesCeiling)
		}
		if l.MaxValueBytes > 0 {
			o.limits.MaxValueBytes = l.MaxValueBytes
		}
	}
}

// WithIdempotencyRetention sets how long idempotency records are kept
// (default 24h). A record is honoured for exactly this long after the
// first attempt and pruned, a little at a time, by later writes.
func WithIdempotencyRetention(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.retention = d
		}
	}
}

// WithLockTimeout sets how long OpenBolt waits for another process to
// release the database file (default 1s). NewMemory ignores it.
func WithLockTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.lockTimeout = d
		}
	}
}

// WithLogger sets the logger for index rebuilds and background errors
// (default: discard).
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.logger = l
		}
	}
}

// WithClock sets the clock used to age idempotency records (for tests).
func WithClock(now func() time.Time) Option {
	return func(o *options) {
		if now != nil {
			o.now = now
		}
	}
}
