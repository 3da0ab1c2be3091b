package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	oa "github.com/openai/openai-go/v3"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// maxMessage bounds a message taken from a response body.
const maxMessage = 1000

func (p *Provider) errorf(model string, kind *errs.Kind, format string, args ...any) *provider.Error {
	return &provider.Error{Provider: p.name, Model: model, Kind: kind, Message: fmt.Sprintf(format, args...)}
}

// callError maps a failed call. A done ctx wins and is returned as is.
// Then, in order: an HTTP error status (the SDK's *openai.Error or a body
// it could not parse) → KindForHTTP; a failure reading a successful
// response's body → Retryable; a successful response that does not
// decode → NonRetryable; no response at all (refused, reset, timeout) →
// Retryable with HTTPStatus 0.
func (p *Provider) callError(ctx context.Context, model string, err error, call *callRecorder) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var apiErr *oa.Error
	res := call.res
	if errors.As(err, &apiErr) && apiErr.Response != nil {
		res = apiErr.Response
	}
	switch {
	case res != nil && res.StatusCode >= 400:
		msg := ""
		if apiErr != nil {
			msg = apiErr.Message
		}
		return p.httpError(model, res, msg)
	case call.readErr != nil:
		return p.errorf(model, errs.Retryable, "reading the response: %s", p.scrub(call.readErr.Error()))
	case res != nil:
		return p.errorf(model, errs.NonRetryable, "malformed response (HTTP %d): %s", res.StatusCode, p.scrub(err.Error()))
	case isNetwork(err):
		return p.errorf(model, errs.Retryable, "request failed: %s", p.scrub(netMessage(err)))
	default:
		return p.errorf(model, errs.NonRetryable, "request failed: %s", p.scrub(err.Error()))
	}
}

// httpError maps an HTTP error status. msg is the API's error.message;
// when empty (a server that does not use OpenAI's error body), the body's
// top-level "message", "detail" or "error" string, a short plain-text
// body, or the status text stands in.
func (p *Provider) httpError(model string, res *http.Response, msg string) *provider.Error {
	if msg == "" {
		msg = bodyMessage(res)
	}
	if msg == "" {
		msg = http.StatusText(res.StatusCode)
	}
	msg = p.scrub(msg)
	if res.StatusCode == http.StatusUnauthorized || res.StatusCode == http.StatusForbidden {
		msg = p.authHint + ": " + msg
	}
	return &provider.Error{
		Provider:   p.name,
		Model:      model,
		Kind:       provider.KindForHTTP(res.StatusCode),
		HTTPStatus: res.StatusCode,
		RetryAfter: retryAfter(res.Header, time.Now()),
		Message:    msg,
	}
}

func bodyMessage(res *http.Response) string {
	if res.Body == nil {
		return ""
	}
	b, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	var v struct {
		Message string          `json:"message"`
		Detail  json.RawMessage `json:"detail"`
		Error   json.RawMessage `json:"error"`
	}
	if json.Unmarshal(b, &v) == nil {
		var s string
		var nested struct {
			Message string `json:"message"`
		}
		switch {
		case v.Message != "":
			return truncate(v.Message)
		case json.Unmarshal(v.Error, &nested) == nil && nested.Message != "":
			return truncate(nested.Message)
		case json.Unmarshal(v.Error, &s) == nil && s != "":
			return truncate(s)
		case json.Unmarshal(v.Detail, &s) == nil && s != "":
			return truncate(s)
		}
		return ""
	}
	if mt, _, _ := mime.ParseMediaType(res.Header.Get("Content-Type")); mt == "text/plain" {
		return truncate(strings.TrimSpace(string(b)))
	}
	return ""
}

func truncate(s string) string {
	if len(s) <= maxMessage {
		return s
	}
	cut := maxMessage
	for cut > 0 && !utf8Start(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }

// keyPattern matches OpenAI-style secret keys, also partly masked ones
// as OpenAI quotes them in 401 messages ("sk-proj-****...abcd").
var keyPattern = regexp.MustCompile(`\bsk-[A-Za-z0-9_*\-]{3,}`)

// scrub removes the configured key, and anything shaped like a key, from
// a message.
func (p *Provider) scrub(msg string) string {
	if p.key != "" {
		msg = strings.ReplaceAll(msg, p.key, "[redacted]")
	}
	return keyPattern.ReplaceAllString(msg, "sk-[redacted]")
}

// retryAfter is the delay a response's headers ask for: retry-after-ms
// (milliseconds), else retry-after (seconds, or an HTTP date relative to
// now). It is 0 when neither is present, valid and positive.
func retryAfter(h http.Header, now time.Time) time.Duration {
	if v := strings.TrimSpace(h.Get("Retry-After-Ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms > 0 && ms < float64(1<<62)/float64(time.Millisecond) {
			return time.Duration(ms * float64(time.Millisecond))
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if s > 0 && s < float64(1<<62)/float64(time.Second) {
			return time.Duration(s * float64(time.Second))
		}
		return 0
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// isNetwork reports a transport failure: no response, or a connection
// that broke.
func isNetwork(err error) bool {
	var ue *url.Error
	var ne net.Error
	return errors.As(err, &ue) || errors.As(err, &ne) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE)
}

// netMessage is err without the request URL that *url.Error carries.
func netMessage(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) && ue.Err != nil {
		return ue.Err.Error()
	}
	return err.Error()
}
