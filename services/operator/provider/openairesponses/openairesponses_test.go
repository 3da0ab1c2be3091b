package openairesponses

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/secbear/neuron/internal/httpfake"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

func TestNewAPIKey(t *testing.T) {
	t.Run("missing", func(t *testing.T) {
		// The environment is never read: a key there does not count.
		t.Setenv("OPENAI_API_KEY", "sk-env-key")
		p, err := New(Config{DefaultModel: "gpt-4.1"})
		if p != nil || !errors.Is(err, errs.InvalidArgument) {
			t.Fatalf("New = %v, %v; want an InvalidArgument error", p, err)
		}
		if want := "openai-responses: no API key: set Config.APIKey: invalid argument"; err.Error() != want {
			t.Errorf("error = %q, want %q", err, want)
		}
	})
	t.Run("config", func(t *testing.T) {
		f := newFakeAPI(t, httpfake.JSON(200, textResponse("resp_1", "hi")))
		p, err := New(Config{APIKey: testKey, BaseURL: f.URL() + "/v1", DefaultModel: "gpt-4.1"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Complete(context.Background(), &provider.Request{Messages: []provider.Message{userText("hi")}}); err != nil {
			t.Fatal(err)
		}
		if c := f.Nth(t, 0); c.Header.Get("Authorization") != "Bearer "+testKey || c.Path != "/v1/responses" {
			t.Errorf("auth %q path %q, want the configured key and /v1/responses", c.Header.Get("Authorization"), c.Path)
		}
	})
}

// New reads no environment: OPENAI_API_KEY, OPENAI_BASE_URL (which the
// operator's wiring reads) and the ambient settings the SDK's NewClient
// would pick up are all ignored, and without a base URL the request goes
// to the public API.
func TestEnvironmentIgnored(t *testing.T) {
	other := newFakeAPI(t, httpfake.JSON(500, `{"error":{"message":"wrong server"}}`))
	t.Setenv("OPENAI_API_KEY", "sk-env-key")
	t.Setenv("OPENAI_BASE_URL", other.URL()+"/v1")
	t.Setenv("OPENAI_ORG_ID", "org-ambient")
	t.Setenv("OPENAI_PROJECT_ID", "proj-ambient")
	t.Setenv("OPENAI_CUSTOM_HEADERS", "X-Leak: yes")

	f := newFakeAPI(t, httpfake.JSON(200, textResponse("resp_1", "hi")))
	p := newTestProvider(t, f)
	if _, err := p.Complete(context.Background(), &provider.Request{Messages: []provider.Message{userText("hi")}}); err != nil {
		t.Fatal(err)
	}
	c := f.Nth(t, 0)
	if got := c.Header.Get("Authorization"); got != "Bearer "+testKey {
		t.Errorf("Authorization %q, want the configured key", got)
	}
	for _, h := range []string{"OpenAI-Organization", "OpenAI-Project", "X-Leak"} {
		if v := c.Header.Get(h); v != "" {
			t.Errorf("ambient header %s: %q sent", h, v)
		}
	}

	var url string
	hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		url = r.URL.String()
		return nil, errors.New("not sent")
	})}
	p, err := New(Config{APIKey: testKey, HTTPClient: hc, DefaultModel: "gpt-4.1", DisableChain: true})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = p.Complete(context.Background(), &provider.Request{Messages: []provider.Message{userText("hi")}})
	if url != "https://api.openai.com/v1/responses" {
		t.Errorf("URL %q, want https://api.openai.com/v1/responses", url)
	}
	if n := len(other.Requests()); n != 0 {
		t.Errorf("the OPENAI_BASE_URL server got %d requests, want 0", n)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestName(t *testing.T) {
	p, err := New(Config{APIKey: testKey})
	if err != nil {
		t.Fatal(err)
	}
	if p.Name() != "openai-responses" {
		t.Errorf("Name = %q", p.Name())
	}
}

func TestPlainText(t *testing.T) {
	f := newFakeAPI(t, httpfake.JSON(200, responseBody("resp_1", "completed", "", "["+messageItem("msg_1", "Hello there.")+"]",
		`{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},"output_tokens":87,"output_tokens_details":{"reasoning_tokens":64},"total_tokens":123}`)))
	p := newTestProvider(t, f, func(c *Config) { c.MaxTokens = 1024 })
	resp, err := p.Complete(context.Background(), &provider.Request{
		Model:    "gpt-4.1-mini",
		System:   "You are terse.",
		Messages: []provider.Message{userText("Say hello.")},
		Metadata: map[string]any{"trace_id": "abc123", "count": 3.0, "long": strings.Repeat("x", 600)},
	})
	if err != nil {
		t.Fatal(err)
	}
	assertResponse(t, resp, &provider.Response{
		Parts: []provider.Part{textPart("Hello there.")},
		Stop:  provider.StopEndTurn,
		Usage: provider.Usage{InputTokens: 36, OutputTokens: 87},
		Model: "gpt-4.1-2025-04-14",
	})
	c := f.Nth(t, 0)
	if c.Method != http.MethodPost || c.Path != "/v1/responses" || c.Header.Get("Authorization") != "Bearer "+testKey {
		t.Errorf("request %s %s auth %q", c.Method, c.Path, c.Header.Get("Authorization"))
	}
	httpfake.AssertJSON(t, "body", c.Body, `{
		"model": "gpt-4.1-mini",
		"instructions": "You are terse.",
		"input": [{"type":"message","role":"user","content":[{"type":"input_text","text":"Say hello."}]}],
		"max_output_tokens": 1024,
		"metadata": {"trace_id": "abc123"},
		"store": false
	}`)
}

func TestRequestMapping(t *testing.T) {
	f := newFakeAPI(t, httpfake.JSON(200, textResponse("resp_1", "ok")))
	p := newTestProvider(t, f)
	png := []byte("\x89PNG\r\n\x1a\n0000")
	_, err := p.Complete(context.Background(), &provider.Request{
		MaxTokens: 300,
		Messages: []provider.Message{
			{Role: provider.User, Parts: []provider.Part{
				{Text: "What is in these?"},
				{Image: &provider.Image{Data: png, MediaType: "image/png"}},
				{Image: &provider.Image{Data: png}},
				{Image: &provider.Image{URL: "https://example.com/cat.jpg"}},
			}},
			{Role: provider.Assistant, Parts: []provider.Part{
				{Text: "Let me look."},
				{Text: ""},
				toolPart("call_a", "read", `{"path":"a.txt"}`),
				toolPart("call_b", "grep", `{"pattern": "x"`),
			}},
			{Role: provider.User, Parts: []provider.Part{
				{ToolResult: &provider.ToolResult{ToolUseID: "call_a", Content: "contents of a"}},
				{ToolResult: &provider.ToolResult{ToolUseID: "call_b", Content: "bad arguments", IsError: true}},
				{Text: "Keep going."},
			}},
		},
		Tools: []provider.ToolSpec{
			{Name: "read", Description: "Read a file.", InputSchema: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string","maxLength":4096}},"required":["path"],"additionalProperties":false}`)},
			{Name: "now"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	httpfake.AssertJSON(t, "body", f.Nth(t, 0).Body, `{
		"model": "gpt-4.1",
		"max_output_tokens": 300,
		"store": false,
		"input": [
			{"type":"message","role":"user","content":[
				{"type":"input_text","text":"What is in these?"},
				{"type":"input_image","detail":"auto","image_url":"data:image/png;base64,iVBORw0KGgowMDAw"},
				{"type":"input_image","detail":"auto","image_url":"data:image/png;base64,iVBORw0KGgowMDAw"},
				{"type":"input_image","detail":"auto","image_url":"https://example.com/cat.jpg"}
			]},
			{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Let me look.","annotations":[]}]},
			{"type":"function_call","call_id":"call_a","name":"read","arguments":"{\"path\":\"a.txt\"}"},
			{"type":"function_call","call_id":"call_b","name":"grep","arguments":"{\"pattern\": \"x\""},
			{"type":"function_call_output","call_id":"call_a","output":"contents of a"},
			{"type":"function_call_output","call_id":"call_b","output":"ERROR: bad arguments"},
			{"type":"message","role":"user","content":[{"type":"input_text","text":"Keep going."}]}
		],
		"tools": [
			{"type":"function","name":"read","description":"Read a file.","strict":false,
			 "parameters":{"type":"object","properties":{"path":{"type":"string","maxLength":4096}},"required":["path"],"additionalProperties":false}},
			{"type":"function","name":"now","strict":false,"parameters":{"type":"object","properties":{}}}
		]
	}`)
}

func TestToolCalls(t *testing.T) {
	f := newFakeAPI(t, httpfake.JSON(200, responseBody("resp_2", "completed", "", "["+
		reasoningItem+","+
		messageItem("msg_1", "Reading both.")+","+
		functionCallItem("fc_1", "call_1", "read", `{"path":"a.txt"}`)+","+
		functionCallItem("fc_2", "call_2", "read", `{"path": "b.txt"`)+","+
		functionCallItem("fc_3", "call_3", "now", ``)+
		"]",
		`{"input_tokens":120,"input_tokens_details":{"cached_tokens":0},"output_tokens":300,"output_tokens_details":{"reasoning_tokens":256},"total_tokens":420}`)))
	p := newTestProvider(t, f)
	resp, err := p.Complete(context.Background(), &provider.Request{
		Messages: []provider.Message{userText("Read a and b.")},
		Tools:    []provider.ToolSpec{{Name: "read", InputSchema: json.RawMessage(`{"type":"object"}`)}, {Name: "now"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	assertResponse(t, resp, &provider.Response{
		Parts: []provider.Part{
			textPart("Reading both."),
			toolPart("call_1", "read", `{"path":"a.txt"}`),
			toolPart("call_2", "read", `{"path": "b.txt"`),
			toolPart("call_3", "now", ``),
		},
		Stop:  provider.StopToolUse,
		Usage: provider.Usage{InputTokens: 120, OutputTokens: 300},
		Model: "gpt-4.1-2025-04-14",
	})
}

func TestStopReasons(t *testing.T) {
	refusal := `{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"refusal","refusal":"I can't help with that."}]}`
	for _, tc := range []struct {
		name, status, reason, output string
		wantParts                    []provider.Part
		want                         provider.StopReason
	}{
		{"end turn", "completed", "", "[" + messageItem("m", "Done.") + "]", []provider.Part{textPart("Done.")}, provider.StopEndTurn},
		{"tool use", "completed", "", "[" + functionCallItem("fc", "call_9", "ls", `{}`) + "]", []provider.Part{toolPart("call_9", "ls", `{}`)}, provider.StopToolUse},
		{"max output tokens", "incomplete", "max_output_tokens", `[{"type":"message","id":"m","status":"incomplete","role":"assistant","content":[{"type":"output_text","text":"Once upon","annotations":[]}]}]`, []provider.Part{textPart("Once upon")}, provider.StopMaxTokens},
		{"max output tokens in reasoning", "incomplete", "max_output_tokens", "[" + reasoningItem + "]", nil, provider.StopMaxTokens},
		{"max output tokens with a call", "incomplete", "max_output_tokens", "[" + functionCallItem("fc", "call_9", "ls", `{"pa`) + "]", []provider.Part{toolPart("call_9", "ls", `{"pa`)}, provider.StopMaxTokens},
		{"content filter", "incomplete", "content_filter", "[]", nil, provider.StopContentFilter},
		{"refusal", "completed", "", "[" + refusal + "]", []provider.Part{textPart("I can't help with that.")}, provider.StopContentFilter},
		{"empty output", "completed", "", "[]", nil, provider.StopEndTurn},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPI(t, httpfake.JSON(200, responseBody("resp_1", tc.status, tc.reason, tc.output, "")))
			resp, err := newTestProvider(t, f).Complete(context.Background(), &provider.Request{Messages: []provider.Message{userText("go")}})
			if err != nil {
				t.Fatal(err)
			}
			assertResponse(t, resp, &provider.Response{
				Parts: tc.wantParts, Stop: tc.want,
				Usage: provider.Usage{InputTokens: 36, OutputTokens: 87}, Model: "gpt-4.1-2025-04-14",
			})
		})
	}
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		name, usage string
		want        provider.Usage
	}{
		{"cached", `{"input_tokens":2006,"input_tokens_details":{"cached_tokens":1920},"output_tokens":300,"output_tokens_details":{"reasoning_tokens":200},"total_tokens":2306}`,
			provider.Usage{InputTokens: 86, OutputTokens: 300, CacheReadTokens: 1920}},
		{"cache writes", `{"input_tokens":5000,"input_tokens_details":{"cached_tokens":1000,"cache_write_tokens":3500},"output_tokens":10,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":5010}`,
			provider.Usage{InputTokens: 500, OutputTokens: 10, CacheReadTokens: 1000, CacheWriteTokens: 3500}},
		{"no details", `{"input_tokens":12,"output_tokens":3,"total_tokens":15}`,
			provider.Usage{InputTokens: 12, OutputTokens: 3}},
		{"inconsistent", `{"input_tokens":10,"input_tokens_details":{"cached_tokens":64},"output_tokens":1,"total_tokens":11}`,
			provider.Usage{InputTokens: 0, OutputTokens: 1, CacheReadTokens: 64}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPI(t, httpfake.JSON(200, responseBody("resp_1", "completed", "", "["+messageItem("m", "x")+"]", tc.usage)))
			resp, err := newTestProvider(t, f).Complete(context.Background(), &provider.Request{Messages: []provider.Message{userText("go")}})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Usage != tc.want {
				t.Errorf("usage = %+v, want %+v", resp.Usage, tc.want)
			}
		})
	}
}

func TestHTTPErrors(t *testing.T) {
	for _, tc := range []struct {
		name       string
		status     int
		header     map[string]string
		body       string
		kind       *errs.Kind
		message    string
		retryAfter time.Duration
	}{
		{"bad request", 400, nil,
			`{"error":{"message":"Invalid 'input[0].content': empty array.","type":"invalid_request_error","param":"input[0].content","code":"empty_array"}}`,
			errs.NonRetryable, "Invalid 'input[0].content': empty array.", 0},
		{"unauthorized", 401, nil,
			`{"error":{"message":"Incorrect API key provided: sk-test-***cdef. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`,
			errs.NonRetryable, "Incorrect API key provided: sk-test-***cdef. You can find your API key at https://platform.openai.com/account/api-keys.", 0},
		{"forbidden", 403, nil,
			`{"error":{"message":"Project does not have access to model gpt-5.","type":"invalid_request_error","param":null,"code":"model_not_found"}}`,
			errs.NonRetryable, "Project does not have access to model gpt-5.", 0},
		{"not found", 404, nil,
			`{"error":{"message":"The model 'gpt-9' does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}`,
			errs.NonRetryable, "The model 'gpt-9' does not exist or you do not have access to it.", 0},
		{"rate limited", 429, map[string]string{"retry-after": "7"},
			`{"error":{"message":"Rate limit reached for gpt-4.1 in organization org-x on tokens per min (TPM): Limit 30000, Used 30000, Requested 1200.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`,
			errs.Retryable, "Rate limit reached for gpt-4.1 in organization org-x on tokens per min (TPM): Limit 30000, Used 30000, Requested 1200.", 7 * time.Second},
		{"rate limited ms", 429, map[string]string{"retry-after-ms": "1500", "retry-after": "2"},
			`{"error":{"message":"Rate limit reached.","type":"requests","param":null,"code":"rate_limit_exceeded"}}`,
			errs.Retryable, "Rate limit reached.", 1500 * time.Millisecond},
		{"server error", 500, nil,
			`{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}`,
			errs.Retryable, "The server had an error while processing your request. Sorry about that!", 0},
		{"unavailable", 503, map[string]string{"retry-after": "30"},
			`{"error":{"message":"The engine is currently overloaded, please try again later","type":"server_error","param":null,"code":null}}`,
			errs.Retryable, "The engine is currently overloaded, please try again later", 30 * time.Second},
		{"overloaded, not JSON", 529, nil, "upstream overloaded\n", errs.Retryable, "upstream overloaded", 0},
		{"conflict, empty body", 409, nil, "", errs.Retryable, "Conflict", 0},
	} {
		for _, streaming := range []bool{false, true} {
			name := tc.name
			if streaming {
				name += "/stream"
			}
			t.Run(name, func(t *testing.T) {
				f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
					for k, v := range tc.header {
						w.Header().Set(k, v)
					}
					if strings.HasPrefix(tc.body, "{") {
						httpfake.JSON(tc.status, tc.body)(w, r)
						return
					}
					w.Header().Set("Content-Type", "text/plain")
					w.WriteHeader(tc.status)
					_, _ = w.Write([]byte(tc.body))
				})
				req := &provider.Request{Model: "gpt-4.1", Messages: []provider.Message{userText("hi")}}
				var texts []string
				if streaming {
					req.OnText = func(s string) { texts = append(texts, s) }
				}
				_, err := newTestProvider(t, f).Complete(context.Background(), req)
				pe := providerErr(t, err, tc.kind, tc.status)
				if pe.Message != tc.message || pe.RetryAfter != tc.retryAfter || pe.Model != "gpt-4.1" {
					t.Errorf("message %q retry after %v model %q; want %q %v gpt-4.1", pe.Message, pe.RetryAfter, pe.Model, tc.message, tc.retryAfter)
				}
				if n := f.Count(); n != 1 {
					t.Errorf("the API got %d calls, want 1 (no SDK retries)", n)
				}
				if len(texts) != 0 {
					t.Errorf("OnText got %q", texts)
				}
			})
		}
	}
}

func TestKeyNeverInErrors(t *testing.T) {
	f := newFakeAPI(t, httpfake.JSON(401, `{"error":{"message":"key `+testKey+` was refused","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`))
	_, err := newTestProvider(t, f).Complete(context.Background(), &provider.Request{Messages: []provider.Message{userText("hi")}})
	pe := providerErr(t, err, errs.NonRetryable, 401)
	if pe.Message != "key [redacted] was refused" {
		t.Errorf("message %q", pe.Message)
	}
}

func TestConnectionRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	for _, streaming := range []bool{false, true} {
		p, err := New(Config{APIKey: testKey, BaseURL: "http://" + addr + "/v1", DefaultModel: "gpt-4.1"})
		if err != nil {
			t.Fatal(err)
		}
		req := &provider.Request{Messages: []provider.Message{userText("hi")}}
		if streaming {
			req.OnText = func(string) {}
		}
		_, err = p.Complete(context.Background(), req)
		pe := providerErr(t, err, errs.Retryable, 0)
		if !strings.Contains(pe.Message, "connection refused") {
			t.Errorf("streaming %v: message %q does not say connection refused", streaming, pe.Message)
		}
	}
}

func TestConnectionReset(t *testing.T) {
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		_, _ = conn.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{\"id\":"))
		conn.Close()
	})
	_, err := newTestProvider(t, f).Complete(context.Background(), &provider.Request{Messages: []provider.Message{userText("hi")}})
	providerErr(t, err, errs.Retryable, 0)
}

func TestMalformedResponses(t *testing.T) {
	for _, tc := range []struct {
		name, contentType, body string
		kind                    *errs.Kind
		message                 string
	}{
		{"not JSON", "application/json", `{"id": "resp_1", "output": [`, errs.NonRetryable, ""},
		{"not a response", "application/json", `{"hello": "world"}`, errs.NonRetryable, "malformed response: the body is not a response object (no id, status or output)"},
		{"HTML", "text/html", `<html>gateway</html>`, errs.NonRetryable, ""},
		{"failed, retryable", "application/json",
			`{"id":"resp_1","object":"response","status":"failed","error":{"code":"server_error","message":"The model failed to generate a response."},"incomplete_details":null,"model":"gpt-4.1","output":[],"usage":null}`,
			errs.Retryable, "server_error: The model failed to generate a response."},
		{"failed, not retryable", "application/json",
			`{"id":"resp_1","object":"response","status":"failed","error":{"code":"invalid_image","message":"The image is not valid."},"incomplete_details":null,"model":"gpt-4.1","output":[],"usage":null}`,
			errs.NonRetryable, "invalid_image: The image is not valid."},
		{"cancelled", "application/json",
			`{"id":"resp_1","object":"response","status":"cancelled","error":null,"incomplete_details":null,"model":"gpt-4.1","output":[]}`,
			errs.NonRetryable, `cancelled: the response has status "cancelled", not completed`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPI(t, httpfake.JSON(200, tc.body, "Content-Type", tc.contentType))
			_, err := newTestProvider(t, f).Complete(context.Background(), &provider.Request{Messages: []provider.Message{userText("hi")}})
			pe := providerErr(t, err, tc.kind, 0)
			if tc.message != "" && pe.Message != tc.message {
				t.Errorf("message %q, want %q", pe.Message, tc.message)
			}
			if tc.message == "" && !strings.HasPrefix(pe.Message, "malformed response: ") {
				t.Errorf("message %q does not say the response is malformed", pe.Message)
			}
		})
	}
}

func TestInvalidRequests(t *testing.T) {
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
		t.Error("the API was called")
	})
	for _, tc := range []struct {
		name    string
		noModel bool
		req     provider.Request
		message string
	}{
		{"no model", true, provider.Request{Messages: []provider.Message{userText("hi")}},
			"no model: the request names none and the provider has no default model"},
		{"no content", false, provider.Request{Messages: []provider.Message{userText("")}},
			"the request has no content to send"},
		{"image from the assistant", false, provider.Request{Messages: []provider.Message{
			{Role: provider.Assistant, Parts: []provider.Part{{Image: &provider.Image{URL: "https://example.com/x.png"}}}}}},
			"messages[0]: parts[0]: the Responses API takes no images in assistant messages"},
		{"empty image", false, provider.Request{Messages: []provider.Message{{Role: provider.User, Parts: []provider.Part{{Image: &provider.Image{}}}}}},
			"messages[0]: parts[0]: image has neither data nor a URL"},
		{"schema not an object", false, provider.Request{Messages: []provider.Message{userText("hi")},
			Tools: []provider.ToolSpec{{Name: "t", InputSchema: json.RawMessage(`["type"]`)}}},
			"tools[0] (t): input schema: not a JSON object"},
		{"unknown role", false, provider.Request{Messages: []provider.Message{{Role: 7, Parts: []provider.Part{{Text: "x"}}}}},
			"messages[0]: unknown role 7"},
		{"negative max tokens", false, provider.Request{Messages: []provider.Message{userText("hi")}, MaxTokens: -1},
			"max tokens -1 is negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestProvider(t, f, func(c *Config) {
				if tc.noModel {
					c.DefaultModel = ""
				}
			})
			_, err := p.Complete(context.Background(), &tc.req)
			pe := providerErr(t, err, errs.InvalidArgument, 0)
			if pe.Message != tc.message {
				t.Errorf("message %q, want %q", pe.Message, tc.message)
			}
		})
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		header map[string]string
		want   time.Duration
	}{
		{"none", nil, 0},
		{"seconds", map[string]string{"Retry-After": "20"}, 20 * time.Second},
		{"fractional seconds", map[string]string{"Retry-After": "1.5"}, 1500 * time.Millisecond},
		{"milliseconds win", map[string]string{"Retry-After-Ms": "250", "Retry-After": "20"}, 250 * time.Millisecond},
		{"bad milliseconds", map[string]string{"Retry-After-Ms": "soon", "Retry-After": "3"}, 3 * time.Second},
		{"date", map[string]string{"Retry-After": "Sun, 01 Mar 2026 12:00:45 GMT"}, 45 * time.Second},
		{"past date", map[string]string{"Retry-After": "Sun, 01 Mar 2026 11:00:00 GMT"}, 0},
		{"negative", map[string]string{"Retry-After": "-5"}, 0},
		{"garbage", map[string]string{"Retry-After": "later"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tc.header {
				h.Set(k, v)
			}
			if got := retryAfter(h, now); got != tc.want {
				t.Errorf("retryAfter = %v, want %v", got, tc.want)
			}
		})
	}
}
