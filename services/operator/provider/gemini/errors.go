package gemini

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/genai"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// captureKey is the context key of a call's *capture.
type captureKey struct{}

// capture keeps the status and headers of a call's HTTP response: the
// SDK's APIError has neither the real status nor Retry-After.
type capture struct {
	mu     sync.Mutex
	status int
	header http.Header
}

func (c *capture) get() (int, http.Header) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status, c.header
}

// captureTransport records each response's status and headers in the
// request context's capture.
type captureTransport struct{ base http.RoundTripper }

func (t *captureTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	base := t.base
	if base == nil {
		base = http.DefaultTransport
	}
	resp, err := base.RoundTrip(r)
	if err == nil {
		if c, ok := r.Context().Value(captureKey{}).(*capture); ok {
			c.mu.Lock()
			c.status, c.header = resp.StatusCode, resp.Header.Clone()
			c.mu.Unlock()
		}
	}
	return resp, err
}

// mapError turns an SDK failure into a *provider.Error, or ctx's error
// when the call was cancelled or timed out.
func (p *Provider) mapError(ctx context.Context, model string, err error, c *capture) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("%s model %s: %w", Name, model, ctxErr)
	}
	pe := &provider.Error{Provider: Name, Model: model}
	status, header := c.get()
	if apiErr, ok := asAPIError(err); ok {
		if status < 400 { // an error event inside a 200 stream
			status = apiErr.Code
		}
		pe.HTTPStatus = status
		pe.Kind = provider.KindForHTTP(status)
		if status == 0 {
			pe.Kind = errs.Retryable
		}
		pe.RetryAfter = retryAfter(header, apiErr.Details)
		pe.Message = p.apiMessage(status, apiErr)
		return pe
	}
	switch {
	case isNetwork(err):
		pe.Kind = errs.Retryable
		pe.Message = "connection failed: " + redact(err.Error(), p.apiKey)
	case isMalformed(err):
		pe.Kind = errs.NonRetryable
		pe.Message = "malformed response: " + redact(malformedDetail(err), p.apiKey)
	default:
		pe.Kind = errs.NonRetryable
		pe.Message = redact(firstLine(err.Error()), p.apiKey)
	}
	return pe
}

func asAPIError(err error) (genai.APIError, bool) {
	var v genai.APIError
	if errors.As(err, &v) {
		return v, true
	}
	var ptr *genai.APIError
	if errors.As(err, &ptr) && ptr != nil {
		return *ptr, true
	}
	return genai.APIError{}, false
}

// apiMessage is the API's message, naming the key's source when the key
// was refused.
func (p *Provider) apiMessage(status int, e genai.APIError) string {
	msg := e.Message
	if msg == "" {
		msg = e.Status
	}
	if msg == "" {
		msg = http.StatusText(status)
	}
	msg = redact(msg, p.apiKey)
	if status == http.StatusUnauthorized || status == http.StatusForbidden || hasReason(e.Details, "API_KEY_INVALID") {
		msg = fmt.Sprintf("the Gemini API refused the API key from %s: %s", p.keySource, msg)
	}
	return msg
}

// Types of the google.rpc details this package reads.
const (
	typeRetryInfo = "type.googleapis.com/google.rpc.RetryInfo"
	typeErrorInfo = "type.googleapis.com/google.rpc.ErrorInfo"
)

func hasReason(details []map[string]any, reason string) bool {
	for _, d := range details {
		if d["@type"] == typeErrorInfo && d["reason"] == reason {
			return true
		}
	}
	return false
}

// retryAfter is the delay asked for by retry-after-ms, Retry-After
// (seconds or an HTTP date), or else a google.rpc.RetryInfo detail.
func retryAfter(h http.Header, details []map[string]any) time.Duration {
	if v := strings.TrimSpace(h.Get("Retry-After-Ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms > 0 {
			return time.Duration(ms * float64(time.Millisecond))
		}
	}
	if v := strings.TrimSpace(h.Get("Retry-After")); v != "" {
		if s, err := strconv.ParseFloat(v, 64); err == nil {
			if s > 0 {
				return time.Duration(s * float64(time.Second))
			}
			return 0
		}
		if t, err := http.ParseTime(v); err == nil {
			return max(time.Until(t), 0)
		}
	}
	for _, d := range details {
		if d["@type"] != typeRetryInfo {
			continue
		}
		if s, ok := d["retryDelay"].(string); ok {
			if dur, err := time.ParseDuration(s); err == nil && dur > 0 {
				return dur
			}
		}
	}
	return 0
}

// isNetwork reports a transport failure: no response, or a response cut
// short.
func isNetwork(err error) bool {
	var urlErr *url.Error
	var netErr net.Error
	return errors.As(err, &urlErr) || errors.As(err, &netErr) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EPIPE)
}

// isMalformed reports a response body the SDK could not decode.
func isMalformed(err error) bool {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	return errors.As(err, &syn) || errors.As(err, &typ) ||
		strings.Contains(err.Error(), "invalid stream chunk")
}

// malformedDetail is the decoder's complaint, without the SDK's dump of
// the body.
func malformedDetail(err error) string {
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		return syn.Error()
	}
	var typ *json.UnmarshalTypeError
	if errors.As(err, &typ) {
		return typ.Error()
	}
	return "invalid stream chunk"
}

// firstLine is s up to its first newline, at most 300 bytes.
func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}
