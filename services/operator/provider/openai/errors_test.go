package openai

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/secbear/neuron/internal/httpfake"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

func openAIError(message, typ, code string) string {
	c := "null"
	if code != "" {
		c = `"` + code + `"`
	}
	return `{"error": {"message": "` + message + `", "type": "` + typ + `", "param": null, "code": ` + c + `}}`
}

func TestHTTPErrors(t *testing.T) {
	for _, tc := range []struct {
		name       string
		status     int
		body       string
		headers    []string
		kind       *errs.Kind
		retryAfter time.Duration
		message    map[string]string // by flavour; "" key for both
	}{
		{"400", 400, openAIError("Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.", "invalid_request_error", ""),
			nil, errs.NonRetryable, 0,
			map[string]string{"": "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'."}},
		{"401 with a masked key", 401, openAIError("Incorrect API key provided: sk-test-********cdef. You can find your API key at https://platform.openai.com/account/api-keys.", "invalid_request_error", "invalid_api_key"),
			nil, errs.NonRetryable, 0,
			map[string]string{
				Name:           "the API key from Config.APIKey was refused: Incorrect API key provided: sk-[redacted]. You can find your API key at https://platform.openai.com/account/api-keys.",
				CompatibleName: "the server wants an API key and Config.APIKey is empty: Incorrect API key provided: sk-[redacted]. You can find your API key at https://platform.openai.com/account/api-keys.",
			}},
		{"403", 403, openAIError("Project proj_abc does not have access to model gpt-5", "invalid_request_error", "model_not_found"),
			nil, errs.NonRetryable, 0,
			map[string]string{
				Name:           "the API key from Config.APIKey was refused: Project proj_abc does not have access to model gpt-5",
				CompatibleName: "the server wants an API key and Config.APIKey is empty: Project proj_abc does not have access to model gpt-5",
			}},
		{"404", 404, openAIError("The model `gpt-9` does not exist or you do not have access to it.", "invalid_request_error", "model_not_found"),
			nil, errs.NonRetryable, 0, map[string]string{"": "The model `gpt-9` does not exist or you do not have access to it."}},
		{"429 with retry-after seconds", 429, openAIError("Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Used 29000, Requested 2000. Please try again in 2s.", "tokens", "rate_limit_exceeded"),
			[]string{"Retry-After", "2"}, errs.Retryable, 2 * time.Second,
			map[string]string{"": "Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Used 29000, Requested 2000. Please try again in 2s."}},
		{"429 with retry-after-ms", 429, openAIError("Rate limit reached.", "requests", "rate_limit_exceeded"),
			[]string{"Retry-After", "2", "Retry-After-Ms", "1500"}, errs.Retryable, 1500 * time.Millisecond,
			map[string]string{"": "Rate limit reached."}},
		{"429 quota", 429, openAIError("You exceeded your current quota, please check your plan and billing details.", "insufficient_quota", "insufficient_quota"),
			nil, errs.Retryable, 0, map[string]string{"": "You exceeded your current quota, please check your plan and billing details."}},
		{"500", 500, openAIError("The server had an error while processing your request. Sorry about that!", "server_error", ""),
			nil, errs.Retryable, 0, map[string]string{"": "The server had an error while processing your request. Sorry about that!"}},
		{"503 with an HTTP-date retry-after", 503, openAIError("The engine is currently overloaded, please try again later.", "server_error", ""),
			[]string{"Retry-After", "Wed, 21 Oct 2099 07:28:00 GMT"}, errs.Retryable, -1,
			map[string]string{"": "The engine is currently overloaded, please try again later."}},
		{"529", 529, openAIError("Overloaded", "overloaded_error", ""),
			nil, errs.Retryable, 0, map[string]string{"": "Overloaded"}},
		{"502 HTML from a proxy", 502, "<html><body>Bad Gateway</body></html>",
			[]string{"Content-Type", "text/html"}, errs.Retryable, 0, map[string]string{"": "Bad Gateway"}},
		{"500 empty body", 500, "", nil, errs.Retryable, 0, map[string]string{"": "Internal Server Error"}},
		{"400 vLLM top-level error", 400, `{"object":"error","message":"max_tokens must be at least 1, got 0.","type":"BadRequestError","param":null,"code":400}`,
			nil, errs.NonRetryable, 0, map[string]string{"": "max_tokens must be at least 1, got 0."}},
		{"404 Ollama string error", 404, `{"error":"model \"llama9\" not found, try pulling it first"}`,
			nil, errs.NonRetryable, 0, map[string]string{"": `model "llama9" not found, try pulling it first`}},
		{"422 detail", 422, `{"detail":"Field required"}`, nil, errs.NonRetryable, 0, map[string]string{"": "Field required"}},
		{"503 plain text", 503, "Loading model\n", []string{"Content-Type", "text/plain; charset=utf-8"}, errs.Retryable, 0,
			map[string]string{"": "Loading model"}},
	} {
		for _, fl := range flavours {
			for _, stream := range []bool{false, true} {
				name := tc.name + "/" + fl.name
				if stream {
					name += "/stream"
				}
				t.Run(name, func(t *testing.T) {
					f := httpfake.New(t, httpfake.JSON(tc.status, tc.body, tc.headers...))
					p := fl.make(t, f.URL()+"/v1")
					req := &provider.Request{Messages: []provider.Message{userText("hi")}}
					var chunks []string
					if stream {
						req.OnText = func(s string) { chunks = append(chunks, s) }
					}
					_, err := p.Complete(context.Background(), req)
					pe := asProviderError(t, err)
					if pe.Kind != tc.kind || !errors.Is(err, tc.kind) || pe.HTTPStatus != tc.status ||
						pe.Provider != fl.name || pe.Model != "gpt-4o" {
						t.Fatalf("error %+v, want kind %v status %d", pe, tc.kind, tc.status)
					}
					if provider.Retryable(err) != (tc.kind == errs.Retryable) {
						t.Fatalf("Retryable(err) = %v", provider.Retryable(err))
					}
					want, ok := tc.message[fl.name]
					if !ok {
						want = tc.message[""]
					}
					if pe.Message != want {
						t.Fatalf("message %q, want %q", pe.Message, want)
					}
					switch {
					case tc.retryAfter == -1: // an HTTP date in the future
						if pe.RetryAfter < 24*time.Hour {
							t.Fatalf("RetryAfter %v, want the time until 2099", pe.RetryAfter)
						}
					case pe.RetryAfter != tc.retryAfter:
						t.Fatalf("RetryAfter %v, want %v", pe.RetryAfter, tc.retryAfter)
					}
					assertNoKey(t, err.Error())
					if len(chunks) != 0 {
						t.Fatalf("OnText called with %q", chunks)
					}
					if n := f.Count(); n != 1 {
						t.Fatalf("%d requests: the SDK retried", n)
					}
				})
			}
		}
	}
}

func TestErrorNeverHoldsTheKey(t *testing.T) {
	const key = "local-secret-key-42"
	f := httpfake.New(t, httpfake.JSON(401, openAIError("key local-secret-key-42 is not valid; neither is sk-proj-abcDEF123_xyz", "auth", "")))
	p, err := NewCompatible(Config{APIKey: key, BaseURL: f.URL() + "/v1", DefaultModel: "m"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Complete(context.Background(), &provider.Request{Messages: []provider.Message{userText("hi")}})
	pe := asProviderError(t, err)
	const want = "the API key from Config.APIKey was refused: key [redacted] is not valid; neither is sk-[redacted]"
	if pe.Message != want {
		t.Fatalf("message %q, want %q", pe.Message, want)
	}
	assertNoKey(t, err.Error(), key, "abcDEF123")
	if got := f.Only(t).Header.Get("Authorization"); got != "Bearer "+key {
		t.Fatalf("Authorization %q", got)
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		headers []string
		want    time.Duration
	}{
		{nil, 0},
		{[]string{"Retry-After", "7"}, 7 * time.Second},
		{[]string{"Retry-After", "0.5"}, 500 * time.Millisecond},
		{[]string{"Retry-After", "0"}, 0},
		{[]string{"Retry-After", "-3"}, 0},
		{[]string{"Retry-After", "soon"}, 0},
		{[]string{"Retry-After", "Sat, 21 Nov 2026 12:00:30 GMT"}, 30 * time.Second},
		{[]string{"Retry-After", "Sat, 21 Nov 2026 11:59:00 GMT"}, 0},
		{[]string{"Retry-After-Ms", "250"}, 250 * time.Millisecond},
		{[]string{"Retry-After-Ms", "12.5"}, 12500 * time.Microsecond},
		{[]string{"Retry-After-Ms", "250", "Retry-After", "9"}, 250 * time.Millisecond},
		{[]string{"Retry-After-Ms", "x", "Retry-After", "9"}, 9 * time.Second},
		{[]string{"Retry-After", "1e300"}, 0},
	} {
		h := http.Header{}
		for i := 0; i+1 < len(tc.headers); i += 2 {
			h.Set(tc.headers[i], tc.headers[i+1])
		}
		if got := retryAfter(h, now); got != tc.want {
			t.Errorf("retryAfter(%v) = %v, want %v", tc.headers, got, tc.want)
		}
	}
}

func TestScrub(t *testing.T) {
	p := &Provider{key: "my-key"}
	for in, want := range map[string]string{
		"plain":                               "plain",
		"key my-key here":                     "key [redacted] here",
		"Incorrect API key provided: sk-abc1": "Incorrect API key provided: sk-[redacted]",
		"sk-proj-****************************************************abcd.": "sk-[redacted].",
		"task-list is fine": "task-list is fine",
	} {
		if got := p.scrub(in); got != want {
			t.Errorf("scrub(%q) = %q, want %q", in, got, want)
		}
	}
	if !strings.Contains((&Provider{}).scrub("no key set"), "no key set") {
		t.Fatal("scrub without a key changed the message")
	}
}
