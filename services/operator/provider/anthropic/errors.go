package anthropic

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// StatusOverloaded is the status of Anthropic's overloaded_error.
const StatusOverloaded = 529

// errorTypeStatus is the HTTP status the API documents for each error
// type. An error event inside a stream arrives on a 200 response; its
// type gives it the status it would have had before the stream began.
var errorTypeStatus = map[string]int{
	"invalid_request_error": http.StatusBadRequest,
	"authentication_error":  http.StatusUnauthorized,
	"billing_error":         http.StatusPaymentRequired,
	"permission_error":      http.StatusForbidden,
	"not_found_error":       http.StatusNotFound,
	"request_too_large":     http.StatusRequestEntityTooLarge,
	"rate_limit_error":      http.StatusTooManyRequests,
	"api_error":             http.StatusInternalServerError,
	"timeout_error":         http.StatusGatewayTimeout,
	"overloaded_error":      StatusOverloaded,
}

// callError classifies a failed call:
//
//   - ctx done: ctx's error, wrapped;
//   - an API error: its status (or, for an error event in a stream, the
//     status of its type) through provider.KindForHTTP, so 429, 5xx and 529
//     overloaded are retryable and other statuses are not, with the
//     API's message and the delay the retry-after-ms or retry-after header
//     asks for;
//   - a response body that is not JSON: errs.NonRetryable;
//   - anything else (connection refused or reset, a body cut short, a
//     timeout of the HTTP client): errs.Retryable with HTTPStatus 0.
func (p *Provider) callError(ctx context.Context, model string, err error) error {
	if cerr := ctxError(ctx, model); cerr != nil {
		return cerr
	}
	var apiErr *sdk.Error
	if errors.As(err, &apiErr) {
		return p.apiError(model, apiErr)
	}
	var syntaxErr *json.SyntaxError
	var typeErr *json.UnmarshalTypeError
	// The SDK reports an undecodable body (read in full) with untyped
	// errors of these texts.
	if errors.As(err, &syntaxErr) || errors.As(err, &typeErr) ||
		strings.Contains(err.Error(), "error parsing response json") ||
		strings.Contains(err.Error(), "expected destination type") {
		return p.malformed(model, "the body is not a JSON message")
	}
	return &provider.Error{Provider: Name, Model: model, Kind: errs.Retryable,
		Message: "request failed: " + transportMessage(err)}
}

// transportMessage describes a transport failure without the request URL.
func transportMessage(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return err.Error()
}

// apiError maps an error the API returned.
func (p *Provider) apiError(model string, e *sdk.Error) error {
	var body struct {
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	_ = json.Unmarshal([]byte(e.RawJSON()), &body)
	status := e.StatusCode
	if status < 400 {
		// An error event in a 200 stream.
		status = errorTypeStatus[body.Error.Type]
		if status == 0 {
			status = http.StatusInternalServerError
		}
	}
	msg := body.Error.Message
	if msg == "" {
		msg = http.StatusText(status)
		if msg == "" {
			msg = "error " + strconv.Itoa(status)
		}
		if body.Error.Type != "" {
			msg = body.Error.Type + ": " + msg
		}
	}
	if status == http.StatusUnauthorized {
		msg += " (the Anthropic API refused " + p.keySource + ")"
	}
	pe := &provider.Error{
		Provider:   Name,
		Model:      model,
		Kind:       provider.KindForHTTP(status),
		HTTPStatus: status,
		Message:    msg,
	}
	if e.Response != nil {
		pe.RetryAfter = retryAfter(e.Response.Header, time.Now())
	}
	return pe
}

// retryAfter is the delay the headers ask for: retry-after-ms
// (milliseconds), else retry-after (seconds, or an HTTP date); 0 when
// neither holds a usable value.
func retryAfter(h http.Header, now time.Time) time.Duration {
	if v := strings.TrimSpace(h.Get("retry-after-ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil {
			return duration(ms, time.Millisecond)
		}
	}
	v := strings.TrimSpace(h.Get("retry-after"))
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		return duration(s, time.Second)
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// duration is n units, 0 when n is not positive (or NaN), at most the
// largest Duration.
func duration(n float64, unit time.Duration) time.Duration {
	if !(n > 0) {
		return 0
	}
	d := n * float64(unit)
	if d >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(d)
}
