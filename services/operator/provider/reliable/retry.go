package reliable

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	"github.com/secbear/neuron/services/operator/provider"
)

// Policy bounds Retry. Zero fields take the defaults of DefaultPolicy.
type Policy struct {
	// MaxAttempts is the number of calls in all, the first included; 1
	// means no retry. Default 4.
	MaxAttempts int
	// BaseDelay is the wait after the first failure. Default 500ms.
	BaseDelay time.Duration
	// MaxDelay caps every wait, Retry-After included: a provider that
	// asks for a longer wait is not retried at all. Default 30s.
	MaxDelay time.Duration
	// Multiplier grows the wait after each failure. Default 2; values
	// below 1 count as 1.
	Multiplier float64
	// Jitter spreads each wait uniformly over ±Jitter of itself, so that
	// clients failing together do not retry together. Default 0.2; a
	// negative value means none; values above 1 count as 1.
	Jitter float64
}

// DefaultPolicy is the policy of a zero Policy.
func DefaultPolicy() Policy {
	return Policy{MaxAttempts: 4, BaseDelay: 500 * time.Millisecond, MaxDelay: 30 * time.Second, Multiplier: 2, Jitter: 0.2}
}

func (p Policy) withDefaults() Policy {
	d := DefaultPolicy()
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = d.MaxAttempts
	}
	if p.BaseDelay <= 0 {
		p.BaseDelay = d.BaseDelay
	}
	if p.MaxDelay <= 0 {
		p.MaxDelay = d.MaxDelay
	}
	if p.Multiplier == 0 {
		p.Multiplier = d.Multiplier
	}
	p.Multiplier = max(p.Multiplier, 1)
	switch {
	case p.Jitter == 0:
		p.Jitter = d.Jitter
	case p.Jitter < 0:
		p.Jitter = 0
	case p.Jitter > 1:
		p.Jitter = 1
	}
	return p
}

// Backoff is the wait after the failed attempt number attempt (1 for the
// first call), before any Retry-After: BaseDelay × Multiplier^(attempt-1),
// capped at MaxDelay, then spread by Jitter with random in [0, 1) (0.5
// gives the unjittered wait) and capped at MaxDelay again.
func (p Policy) Backoff(attempt int, random float64) time.Duration {
	return p.withDefaults().backoff(attempt, random)
}

// backoff is Backoff for a policy withDefaults has filled.
func (p Policy) backoff(attempt int, random float64) time.Duration {
	maxD := float64(p.MaxDelay)
	d := min(float64(p.BaseDelay)*math.Pow(p.Multiplier, float64(max(attempt-1, 0))), maxD)
	d *= 1 + p.Jitter*(2*random-1)
	return time.Duration(min(max(d, 0), maxD))
}

// Retry returns p with failed calls repeated under policy. A call is
// repeated only when it failed with provider.Retryable(err), and:
//
//   - at most policy.MaxAttempts calls are made; then the last error is
//     returned, annotated "(gave up after N attempts)", with its kind;
//   - the wait before the next call is the policy's Backoff, or the
//     error's RetryAfter when that is longer. A RetryAfter longer than
//     MaxDelay ends the retries at once: the error is returned (still
//     retryable, so a Fallback moves on, and the caller may come back
//     later);
//   - the wait never runs past the context's deadline: when the next call
//     could not start before it, the last error is returned without
//     waiting. When the context is cancelled or expires during a wait,
//     its error (context.Canceled, context.DeadlineExceeded) is returned
//     at once;
//   - a streamed call whose Request.OnText already received text is
//     never repeated: the client has seen part of the answer. Its error is
//     returned as is.
//
// Non-retryable errors and context errors are returned unchanged after
// one call. Each retry is logged at WARN on log (nil: slog.Default()).
// Name is p's name. opts may replace the sleep, the clock and the jitter's
// random source (WithSleep, WithClock, WithRandom), for tests.
func Retry(p provider.Provider, policy Policy, log *slog.Logger, opts ...Option) provider.Provider {
	o := newOptions(opts)
	if log == nil {
		log = o.logger()
	}
	return &retrying{p: p, policy: policy.withDefaults(), log: log, o: o}
}

type retrying struct {
	p      provider.Provider
	policy Policy
	log    *slog.Logger
	o      options
}

func (r *retrying) Name() string { return r.p.Name() }

func (r *retrying) Complete(ctx context.Context, req *provider.Request) (*provider.Response, error) {
	if req == nil {
		return r.p.Complete(ctx, req)
	}
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		call, streamed := guardStream(req)
		resp, err := r.p.Complete(ctx, call)
		if err == nil {
			return resp, nil
		}
		if !provider.Retryable(err) {
			return nil, err
		}
		if cerr := ctx.Err(); cerr != nil {
			return nil, cerr
		}
		if streamed.Load() {
			r.log.WarnContext(ctx, "model call failed after streaming text; not retrying",
				"provider", r.p.Name(), "model", req.Model, "attempt", attempt, "error", err)
			return nil, err
		}
		if attempt >= r.policy.MaxAttempts {
			return nil, fmt.Errorf("%w (gave up after %d attempts)", err, attempt)
		}
		wait := r.policy.backoff(attempt, r.o.random())
		var pe *provider.Error
		if errors.As(err, &pe) && pe.RetryAfter > 0 {
			if pe.RetryAfter > r.policy.MaxDelay {
				return nil, fmt.Errorf("%w (not retried: the provider asked to wait %s, more than the %s allowed)",
					err, pe.RetryAfter, r.policy.MaxDelay)
			}
			wait = max(wait, pe.RetryAfter)
		}
		if deadline, ok := ctx.Deadline(); ok && r.o.now().Add(wait).After(deadline) {
			return nil, fmt.Errorf("%w (not retried: waiting %s would pass the deadline)", err, wait.Round(time.Millisecond))
		}
		r.log.WarnContext(ctx, "model call failed; retrying",
			"provider", r.p.Name(), "model", req.Model, "attempt", attempt,
			"max_attempts", r.policy.MaxAttempts, "wait", wait, "error", err)
		if err := r.o.sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
}

// guardStream returns the request to send for one call and a flag that
// becomes true once that call has passed non-empty text to req.OnText.
// The caller's request is never modified.
func guardStream(req *provider.Request) (*provider.Request, *atomic.Bool) {
	streamed := new(atomic.Bool)
	if req.OnText == nil {
		return req, streamed
	}
	call := *req
	onText := req.OnText
	call.OnText = func(text string) {
		if text != "" {
			streamed.Store(true)
		}
		onText(text)
	}
	return &call, streamed
}
