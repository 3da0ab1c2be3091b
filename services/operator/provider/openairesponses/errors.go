package openairesponses

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/packages/ssestream"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// apiFailure is a failure the API reported inside a response rather than
// as an HTTP status: a response with status "failed", or an "error" event
// of a stream.
type apiFailure struct {
	code    string
	message string
}

func (e *apiFailure) Error() string {
	if e.code == "" {
		return e.message
	}
	return e.code + ": " + e.message
}

// malformed is a response body this package cannot use.
type malformed struct{ msg string }

func (e *malformed) Error() string { return e.msg }

// retryableCodes are the API error codes (of failed responses and stream
// error events) worth retrying.
var retryableCodes = map[string]bool{
	"server_error":          true,
	"internal_error":        true,
	"rate_limit_exceeded":   true,
	"server_is_overloaded":  true,
	"overloaded":            true,
	"slow_down":             true,
	"timeout":               true,
	"vector_store_timeout":  true,
	"service_unavailable":   true,
	"insufficient_capacity": true,
}

// previousNotFound reports whether err says that the previous_response_id
// of the request is unknown to the API (expired, deleted, or stored by
// another project): HTTP 404 or a previous_response_not_found code.
func previousNotFound(err error) bool {
	var ae *openai.Error
	if errors.As(err, &ae) {
		if ae.Code == "previous_response_not_found" || ae.Param == "previous_response_id" {
			return true
		}
		if ae.StatusCode == http.StatusNotFound && ae.Code != "model_not_found" {
			return true
		}
		return mentionsPreviousNotFound(ae.Message)
	}
	af, ok := asFailure(err)
	return ok && (af.code == "previous_response_not_found" || mentionsPreviousNotFound(af.message))
}

// asFailure returns the failure reported inside a response or stream.
func asFailure(err error) (*apiFailure, bool) {
	var af *apiFailure
	if errors.As(err, &af) {
		return af, true
	}
	var se *ssestream.StreamError
	if errors.As(err, &se) {
		return eventFailure(se.Event.Data), true
	}
	return nil, false
}

func mentionsPreviousNotFound(msg string) bool {
	m := strings.ToLower(msg)
	return strings.Contains(m, "previous response") && strings.Contains(m, "not found")
}

// mapErr turns a failure of the SDK call into a *provider.Error, or
// returns the context's error when ctx ended.
func (p *Provider) mapErr(ctx context.Context, model string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var pe *provider.Error
	if errors.As(err, &pe) {
		return pe
	}
	e := &provider.Error{Provider: Name, Model: model}
	var (
		ae *openai.Error
		mf *malformed
	)
	af, isFailure := asFailure(err)
	switch {
	case errors.As(err, &ae):
		e.HTTPStatus = ae.StatusCode
		e.Kind = provider.KindForHTTP(ae.StatusCode)
		e.Message = apiMessage(ae)
		if ae.Response != nil {
			e.RetryAfter = retryAfter(ae.Response.Header, time.Now())
		}
	case isFailure:
		e.Kind = errs.NonRetryable
		if retryableCodes[af.code] {
			e.Kind = errs.Retryable
		}
		e.Message = af.Error()
	case errors.As(err, &mf):
		e.Kind = errs.NonRetryable
		e.Message = "malformed response: " + mf.msg
	case malformedBody(err):
		e.Kind = errs.NonRetryable
		e.Message = "malformed response: " + err.Error()
	default:
		// Everything else failed in the transport: connection refused or
		// reset, timeouts, a body cut short.
		e.Kind = errs.Retryable
		e.Message = err.Error()
	}
	if p.key != "" {
		// A server may echo the credential; it never leaves in an error.
		e.Message = strings.ReplaceAll(e.Message, p.key, "[redacted]")
	}
	return e
}

// malformedBody reports whether err is the SDK failing to decode a body
// it received in full.
func malformedBody(err error) bool {
	var (
		syn *json.SyntaxError
		typ *json.UnmarshalTypeError
	)
	if errors.As(err, &syn) || errors.As(err, &typ) || errors.Is(err, bufio.ErrTooLong) {
		return true
	}
	msg := err.Error()
	return strings.HasPrefix(msg, "error parsing response json") ||
		strings.HasPrefix(msg, "expected destination type")
}

// apiMessage is the API's error message, else the start of the error body
// when it is not the API's JSON error, else the status text.
func apiMessage(ae *openai.Error) string {
	if ae.Message != "" {
		return ae.Message
	}
	if ae.Response != nil && ae.Response.Body != nil {
		body, _ := io.ReadAll(io.LimitReader(ae.Response.Body, 4<<10))
		if s := strings.TrimSpace(string(body)); s != "" && utf8.ValidString(s) {
			if len(s) > 200 {
				s = s[:200]
				for !utf8.ValidString(s) {
					s = s[:len(s)-1]
				}
				s += "…"
			}
			return s
		}
	}
	if t := http.StatusText(ae.StatusCode); t != "" {
		return t
	}
	return fmt.Sprintf("HTTP status %d", ae.StatusCode)
}

// eventFailure reads an error event's data, in either of the shapes the
// API uses: {"type":"error","code":...,"message":...} or
// {"type":"error","error":{"code":...,"message":...}}.
func eventFailure(data []byte) *apiFailure {
	type body struct {
		Type    string `json:"type"`
		Code    any    `json:"code"`
		Message string `json:"message"`
	}
	var ev struct {
		body
		Error *body `json:"error"`
	}
	if err := json.Unmarshal(data, &ev); err != nil {
		return &apiFailure{message: "unreadable error event"}
	}
	b := ev.body
	if ev.Error != nil {
		b = *ev.Error
	}
	af := &apiFailure{message: b.Message}
	switch c := b.Code.(type) {
	case string:
		af.code = c
	case float64:
		af.code = strconv.FormatFloat(c, 'f', -1, 64)
	}
	if af.code == "" && b.Type != "error" {
		af.code = b.Type
	}
	if af.message == "" {
		af.message = "no error message"
	}
	return af
}

// retryAfter is the delay asked for by retry-after-ms (milliseconds) or
// retry-after (seconds, or an HTTP date), 0 when neither is usable.
func retryAfter(h http.Header, now time.Time) time.Duration {
	if v := strings.TrimSpace(h.Get("retry-after-ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms >= 0 {
			return time.Duration(ms * float64(time.Millisecond))
		}
	}
	v := strings.TrimSpace(h.Get("retry-after"))
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if s < 0 {
			return 0
		}
		return time.Duration(s * float64(time.Second))
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
