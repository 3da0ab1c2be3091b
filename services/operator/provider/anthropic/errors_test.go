package anthropic

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/secbear/neuron/internal/httpfake"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// checkError asserts that err is exactly want.
func checkError(t *testing.T, err error, want *provider.Error) {
	t.Helper()
	var pe *provider.Error
	if !errors.As(err, &pe) {
		t.Fatalf("error = %#v, want a *provider.Error", err)
	}
	if *pe != *want {
		t.Errorf("error =\n%+v\nwant\n%+v", *pe, *want)
	}
	if !errors.Is(err, want.Kind) {
		t.Errorf("errors.Is(err, %v) = false", want.Kind)
	}
	if strings.Contains(err.Error(), testKey) {
		t.Errorf("error %q contains the API key", err)
	}
}

func TestHTTPErrors(t *testing.T) {
	tests := []struct {
		name    string
		status  int
		body    string
		headers []string
		want    provider.Error
	}{
		{
			name:   "400 invalid request",
			status: 400,
			body:   errorBody("invalid_request_error", "messages: roles must alternate between \"user\" and \"assistant\""),
			want:   provider.Error{Kind: errs.NonRetryable, HTTPStatus: 400, Message: `messages: roles must alternate between "user" and "assistant"`},
		},
		{
			name:   "401 authentication",
			status: 401,
			body:   errorBody("authentication_error", "invalid x-api-key"),
			want:   provider.Error{Kind: errs.NonRetryable, HTTPStatus: 401, Message: "invalid x-api-key (the Anthropic API refused the configured API key)"},
		},
		{
			name:   "403 permission",
			status: 403,
			body:   errorBody("permission_error", "Your API key does not have permission to use the specified resource."),
			want:   provider.Error{Kind: errs.NonRetryable, HTTPStatus: 403, Message: "Your API key does not have permission to use the specified resource."},
		},
		{
			name:   "404 not found",
			status: 404,
			body:   errorBody("not_found_error", "model: claude-nonexistent"),
			want:   provider.Error{Kind: errs.NonRetryable, HTTPStatus: 404, Message: "model: claude-nonexistent"},
		},
		{
			name:   "413 too large",
			status: 413,
			body:   errorBody("request_too_large", "Request exceeds the maximum allowed number of bytes."),
			want:   provider.Error{Kind: errs.NonRetryable, HTTPStatus: 413, Message: "Request exceeds the maximum allowed number of bytes."},
		},
		{
			name:    "429 with retry-after seconds",
			status:  429,
			body:    errorBody("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"),
			headers: []string{"retry-after", "17", "anthropic-ratelimit-tokens-remaining", "0"},
			want:    provider.Error{Kind: errs.Retryable, HTTPStatus: 429, RetryAfter: 17 * time.Second, Message: "Number of request tokens has exceeded your per-minute rate limit"},
		},
		{
			name:    "429 with retry-after-ms",
			status:  429,
			body:    errorBody("rate_limit_error", "Rate limited"),
			headers: []string{"retry-after-ms", "1500", "retry-after", "2"},
			want:    provider.Error{Kind: errs.Retryable, HTTPStatus: 429, RetryAfter: 1500 * time.Millisecond, Message: "Rate limited"},
		},
		{
			name:   "500 api error",
			status: 500,
			body:   errorBody("api_error", "Internal server error"),
			want:   provider.Error{Kind: errs.Retryable, HTTPStatus: 500, Message: "Internal server error"},
		},
		{
			name:    "529 overloaded",
			status:  529,
			body:    errorBody("overloaded_error", "Overloaded"),
			headers: []string{"x-should-retry", "true"},
			want:    provider.Error{Kind: errs.Retryable, HTTPStatus: 529, Message: "Overloaded"},
		},
		{
			name:   "502 HTML from a proxy",
			status: 502,
			body:   "<html><body><h1>502 Bad Gateway</h1></body></html>",
			want:   provider.Error{Kind: errs.Retryable, HTTPStatus: 502, Message: "Bad Gateway"},
		},
		{
			name:   "error without a message",
			status: 503,
			body:   `{"type":"error","error":{"type":"api_error"}}`,
			want:   provider.Error{Kind: errs.Retryable, HTTPStatus: 503, Message: "api_error: Service Unavailable"},
		},
	}
	for _, tt := range tests {
		for _, streaming := range []bool{false, true} {
			name := tt.name
			if streaming {
				name += " streaming"
			}
			t.Run(name, func(t *testing.T) {
				f := newFakeAPI(t, replyJSON(tt.status, tt.body, tt.headers...))
				p := newProvider(t, f, Config{})
				req := &provider.Request{Messages: userText("hi")}
				if streaming {
					req.OnText = func(s string) { t.Errorf("OnText(%q) on an error", s) }
				}
				_, err := p.Complete(context.Background(), req)
				tt.want.Provider, tt.want.Model = Name, testModel
				checkError(t, err, &tt.want)
				// The SDK never retries, whatever the status or x-should-retry say.
				if n := len(f.Requests()); n != 1 {
					t.Errorf("the API received %d requests, want 1", n)
				}
			})
		}
	}
}

// A refused key is named by its source when the Config gives one.
func TestRefusedKeySourceMessage(t *testing.T) {
	f := newFakeAPI(t, replyJSON(401, errorBody("authentication_error", "invalid x-api-key")))
	p, err := New(Config{APIKey: testKey, KeySource: "$ANTHROPIC_API_KEY", BaseURL: f.URL(), DefaultModel: testModel})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Complete(context.Background(), &provider.Request{Messages: userText("hi")})
	checkError(t, err, &provider.Error{Provider: Name, Model: testModel, Kind: errs.NonRetryable, HTTPStatus: 401,
		Message: "invalid x-api-key (the Anthropic API refused the API key from $ANTHROPIC_API_KEY)"})
}

func TestRetryAfterDate(t *testing.T) {
	date := time.Now().Add(120 * time.Second).UTC().Format(http.TimeFormat)
	f := newFakeAPI(t, replyJSON(429, errorBody("rate_limit_error", "slow down"), "retry-after", date))
	p := newProvider(t, f, Config{})
	_, err := p.Complete(context.Background(), &provider.Request{Messages: userText("hi")})
	var pe *provider.Error
	if !errors.As(err, &pe) {
		t.Fatalf("error = %v", err)
	}
	if pe.RetryAfter < 115*time.Second || pe.RetryAfter > 120*time.Second {
		t.Errorf("RetryAfter = %v, want about 2m", pe.RetryAfter)
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name    string
		headers map[string]string
		want    time.Duration
	}{
		{"none", nil, 0},
		{"seconds", map[string]string{"retry-after": "30"}, 30 * time.Second},
		{"fractional seconds", map[string]string{"retry-after": "1.5"}, 1500 * time.Millisecond},
		{"milliseconds win", map[string]string{"retry-after-ms": "250", "retry-after": "30"}, 250 * time.Millisecond},
		{"bad milliseconds fall back", map[string]string{"retry-after-ms": "soon", "retry-after": "3"}, 3 * time.Second},
		{"negative", map[string]string{"retry-after": "-4"}, 0},
		{"zero", map[string]string{"retry-after": "0"}, 0},
		{"NaN", map[string]string{"retry-after": "NaN"}, 0},
		{"huge", map[string]string{"retry-after": "1e300"}, time.Duration(1<<63 - 1)},
		{"HTTP date", map[string]string{"retry-after": "Sat, 21 Nov 2026 12:01:30 GMT"}, 90 * time.Second},
		{"past HTTP date", map[string]string{"retry-after": "Sat, 21 Nov 2026 11:00:00 GMT"}, 0},
		{"garbage", map[string]string{"retry-after": "later"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tt.headers {
				h.Set(k, v)
			}
			if got := retryAfter(h, now); got != tt.want {
				t.Errorf("retryAfter = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestConnectionRefused(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	for _, streaming := range []bool{false, true} {
		p, err := New(Config{APIKey: testKey, BaseURL: url, DefaultModel: testModel})
		if err != nil {
			t.Fatal(err)
		}
		req := &provider.Request{Messages: userText("hi")}
		if streaming {
			req.OnText = func(string) {}
		}
		_, err = p.Complete(context.Background(), req)
		var pe *provider.Error
		if !errors.As(err, &pe) {
			t.Fatalf("streaming %v: error = %v, want a *provider.Error", streaming, err)
		}
		if pe.Kind != errs.Retryable || pe.HTTPStatus != 0 || pe.Provider != Name || pe.Model != testModel {
			t.Errorf("streaming %v: error = %+v, want retryable with no status", streaming, pe)
		}
		if !strings.HasPrefix(pe.Message, "request failed: dial tcp ") || !strings.Contains(pe.Message, "connection refused") {
			t.Errorf("streaming %v: message = %q", streaming, pe.Message)
		}
		if strings.Contains(pe.Message, "/v1/messages") {
			t.Errorf("streaming %v: message %q holds the request URL", streaming, pe.Message)
		}
	}
}

// TestMalformedResponses checks 200 responses that are not messages.
func TestMalformedResponses(t *testing.T) {
	tests := []struct {
		name        string
		contentType string
		body        string
		want        string
	}{
		{"truncated JSON", "application/json", `{"id":"msg_01","type":"message","content":[`, "malformed response: the body is not a JSON message"},
		{"HTML", "text/html", "<html>hello</html>", "malformed response: the body is not a JSON message"},
		{"not a message", "application/json", `{"ok":true}`, `malformed response: the response is not a message (want "type":"message")`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeAPI(t, httpfake.JSON(200, tt.body, "Content-Type", tt.contentType))
			p := newProvider(t, f, Config{})
			_, err := p.Complete(context.Background(), &provider.Request{Messages: userText("hi")})
			checkError(t, err, &provider.Error{Provider: Name, Model: testModel, Kind: errs.NonRetryable, Message: tt.want})
		})
	}
}
