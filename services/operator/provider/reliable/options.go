package reliable

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"time"
)

// Option configures a wrapper. Retry uses WithSleep, WithClock and
// WithRandom; Priced uses WithLogger. Options a wrapper does not use are
// ignored.
type Option func(*options)

type options struct {
	sleep  func(ctx context.Context, d time.Duration) error
	now    func() time.Time
	random func() float64
	log    *slog.Logger
}

func newOptions(opts []Option) options {
	o := options{sleep: sleepContext, now: time.Now, random: rand.Float64}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// WithSleep replaces the wait between attempts: sleep must wait d, or
// return ctx's error as soon as ctx is done. Tests use it to record waits
// without waiting.
func WithSleep(sleep func(ctx context.Context, d time.Duration) error) Option {
	return func(o *options) { o.sleep = sleep }
}

// WithClock replaces time.Now, which Retry compares with the context's
// deadline.
func WithClock(now func() time.Time) Option {
	return func(o *options) { o.now = now }
}

// WithRandom replaces the jitter's source of random numbers, which must
// return values in [0, 1). A constant 0.5 means no jitter.
func WithRandom(random func() float64) Option {
	return func(o *options) { o.random = random }
}

// WithLogger sets the logger; nil (the default) means slog.Default().
func WithLogger(log *slog.Logger) Option {
	return func(o *options) { o.log = log }
}

func (o options) logger() *slog.Logger {
	if o.log != nil {
		return o.log
	}
	return slog.Default()
}

// sleepContext waits d or until ctx is done, and returns ctx's error in
// the latter case.
func sleepContext(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
