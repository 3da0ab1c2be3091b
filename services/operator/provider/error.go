package provider

import (
	"errors"
	"fmt"
	"time"

	"github.com/secbear/neuron/pkg/errs"
)

// Error is a failed model call, as every provider reports it. It wraps an
// errs kind (errs.Retryable, errs.NonRetryable, errs.InvalidArgument,
// errs.Unauthenticated, ...) so the loop maps it to a status once, and it
// carries what a retry policy needs.
type Error struct {
	// Provider is the provider's Name.
	Provider string
	// Model is the model called.
	Model string
	// Kind classifies the failure.
	Kind *errs.Kind
	// HTTPStatus is the response status, 0 when there was no response
	// (connection refused or reset, timeout).
	HTTPStatus int
	// RetryAfter is the delay the provider asked for (Retry-After,
	// retry-after-ms), 0 when none.
	RetryAfter time.Duration
	// Message is the provider's own message, safe to show: never a
	// credential or a request body.
	Message string
}

func (e *Error) Error() string {
	if e.HTTPStatus != 0 {
		return fmt.Sprintf("%s model %s: HTTP %d: %s", e.Provider, e.Model, e.HTTPStatus, e.Message)
	}
	return fmt.Sprintf("%s model %s: %s", e.Provider, e.Model, e.Message)
}

// Unwrap returns the kind, so errors.Is(err, errs.Retryable) works.
func (e *Error) Unwrap() error { return e.Kind }

// Retryable reports whether err is worth retrying: a provider Error of
// kind errs.Retryable.
func Retryable(err error) bool {
	var pe *Error
	return errors.As(err, &pe) && pe.Kind == errs.Retryable
}

// KindForHTTP is the kind of an HTTP failure status, the one table every
// provider uses: 408, 409, 425, 429 and 5xx are retryable; 400, 404, 413,
// 422, and also 401 and 403, are non-retryable. A refused API key is the
// operator's configuration, not the caller's credential, so it is never
// UNAUTHENTICATED to the caller: the message says which key was refused.
func KindForHTTP(status int) *errs.Kind {
	switch {
	case status == 408 || status == 409 || status == 425 || status == 429 || status >= 500:
		return errs.Retryable
	default:
		return errs.NonRetryable
	}
}
