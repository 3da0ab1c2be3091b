package gemini

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/secbear/neuron/internal/httpfake"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

const helloResponse = `{
  "candidates": [{
    "content": {"parts": [{"text": "Hello! How can I help?"}], "role": "model"},
    "finishReason": "STOP",
    "index": 0
  }],
  "usageMetadata": {
    "promptTokenCount": 12,
    "candidatesTokenCount": 8,
    "totalTokenCount": 40,
    "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 12}],
    "thoughtsTokenCount": 20
  },
  "modelVersion": "gemini-2.5-flash-001",
  "responseId": "mDvHaPbKCfC7nvgP0q2w4Q8"
}`

func TestName(t *testing.T) {
	p, err := New(Config{APIKey: testKey})
	if err != nil {
		t.Fatal(err)
	}
	if p.Name() != "gemini" {
		t.Fatalf("Name() = %q", p.Name())
	}
}

// The key is the Config's; GEMINI_API_KEY and GOOGLE_API_KEY (which the
// operator's wiring reads, and the SDK would) are never used.
func TestNewKey(t *testing.T) {
	t.Setenv("GEMINI_API_KEY", "gemini-key")
	t.Setenv("GOOGLE_API_KEY", "google-key")
	_, err := New(Config{DefaultModel: testModel})
	if pe := providerError(t, err); pe.Kind != errs.InvalidArgument || err.Error() != "gemini model gemini-2.5-flash: no API key: set Config.APIKey" {
		t.Fatalf("error %v (%s)", err, kindName(pe.Kind))
	}
	f := httpfake.New(t, httpfake.JSON(200, helloResponse))
	p, err := New(Config{APIKey: "cfg-key", BaseURL: f.URL(), DefaultModel: testModel})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Complete(context.Background(), &provider.Request{Messages: []provider.Message{user(text("hi"))}}); err != nil {
		t.Fatal(err)
	}
	if got := f.Only(t).Header.Get("X-Goog-Api-Key"); got != "cfg-key" {
		t.Fatalf("key sent %q, want cfg-key", got)
	}
}

func TestNewBadConfig(t *testing.T) {
	_, err := New(Config{APIKey: testKey, MaxTokens: -1})
	pe := providerError(t, err)
	if pe.Kind != errs.InvalidArgument || pe.Message != "max tokens -1 is negative" {
		t.Fatalf("got %v", err)
	}
}

func TestSDKConfigErrorIsRedacted(t *testing.T) {
	// The SDK's client errors print the whole ClientConfig, key included.
	sdkErr := fmt.Errorf("api key is required for Google AI backend. ClientConfig: &genai.ClientConfig{APIKey:%q}.\nYou can get the API key", testKey)
	got := redact(sdkConfigError(sdkErr), testKey)
	if got != "api key is required for Google AI backend" {
		t.Fatalf("got %q", got)
	}
	if got := redact("bad key "+testKey+" here", testKey); got != "bad key [redacted] here" {
		t.Fatalf("redact: %q", got)
	}
}

func TestPlainText(t *testing.T) {
	f := httpfake.New(t, httpfake.JSON(200, helloResponse))
	p, err := New(Config{APIKey: testKey, BaseURL: f.URL(), DefaultModel: testModel, MaxTokens: 2048})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := p.Complete(context.Background(), &provider.Request{
		System:   "You are terse.",
		Messages: []provider.Message{user(text("Hi there"))},
		Metadata: map[string]any{"trace_id": "t-1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := f.Only(t)
	assertGenerate(t, c, testModel, false)
	if strings.Contains(c.RawQuery, "key=") {
		t.Fatalf("key in the query: %q", c.RawQuery)
	}
	httpfake.AssertJSON(t, "request body", c.Body, `{
	  "contents": [{"role": "user", "parts": [{"text": "Hi there"}]}],
	  "systemInstruction": {"role": "user", "parts": [{"text": "You are terse."}]},
	  "generationConfig": {"maxOutputTokens": 2048}
	}`)
	assertParts(t, resp.Parts, text("Hello! How can I help?"))
	if resp.Stop != provider.StopEndTurn || resp.Model != "gemini-2.5-flash-001" || !resp.Cost.IsZero() {
		t.Fatalf("stop %v model %q cost %v", resp.Stop, resp.Model, resp.Cost)
	}
	if want := (provider.Usage{InputTokens: 12, OutputTokens: 28}); resp.Usage != want {
		t.Fatalf("usage %+v, want %+v", resp.Usage, want)
	}
}

func TestRequestMapping(t *testing.T) {
	f := httpfake.New(t, httpfake.JSON(200, helloResponse))
	p := newProvider(t, f)
	png := []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
	_, err := p.Complete(context.Background(), &provider.Request{
		Model:     "gemini-2.5-pro",
		MaxTokens: 512,
		Messages: []provider.Message{
			user(text("Look:"), provider.Part{Image: &provider.Image{Data: png, MediaType: "image/png"}}),
			// Consecutive user messages merge into one content.
			user(
				provider.Part{Image: &provider.Image{URL: "https://example.com/cat.JPG?size=large"}},
				provider.Part{Image: &provider.Image{URL: "data:image/gif;base64,R0lGODlhAQABAAAAACw="}},
				provider.Part{Image: &provider.Image{Data: png}}, // media type sniffed
				provider.Part{Image: &provider.Image{URL: "https://generativelanguage.googleapis.com/v1beta/files/abc", MediaType: "image/webp"}},
				text(""), // empty text is dropped
			),
			assistant(text("Two images.")),
			assistant(text("Anything else?")),
			user(text("No.")),
		},
		Tools: []provider.ToolSpec{
			{Name: "read", Description: "Read a file.", InputSchema: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string","description":"File path."},"limit":{"type":"integer","minimum":1}},"required":["path"],"additionalProperties":false}`)},
			{Name: "now", Description: "The time."},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := f.Only(t)
	assertGenerate(t, c, "gemini-2.5-pro", false)
	httpfake.AssertJSON(t, "request body", c.Body, `{
	  "contents": [
	    {"role": "user", "parts": [
	      {"text": "Look:"},
	      {"inlineData": {"data": "iVBORw0KGgoAAAANSUhEUg==", "mimeType": "image/png"}},
	      {"fileData": {"fileUri": "https://example.com/cat.JPG?size=large", "mimeType": "image/jpeg"}},
	      {"inlineData": {"data": "R0lGODlhAQABAAAAACw=", "mimeType": "image/gif"}},
	      {"inlineData": {"data": "iVBORw0KGgoAAAANSUhEUg==", "mimeType": "image/png"}},
	      {"fileData": {"fileUri": "https://generativelanguage.googleapis.com/v1beta/files/abc", "mimeType": "image/webp"}}
	    ]},
	    {"role": "model", "parts": [{"text": "Two images."}, {"text": "Anything else?"}]},
	    {"role": "user", "parts": [{"text": "No."}]}
	  ],
	  "generationConfig": {"maxOutputTokens": 512},
	  "tools": [{"functionDeclarations": [
	    {"name": "read", "description": "Read a file.", "parametersJsonSchema": {
	      "type": "object",
	      "properties": {"path": {"type": "string", "description": "File path."}, "limit": {"type": "integer", "minimum": 1}},
	      "required": ["path"],
	      "additionalProperties": false
	    }},
	    {"name": "now", "description": "The time."}
	  ]}]
	}`)
}

func TestToolCalls(t *testing.T) {
	f := httpfake.New(t, httpfake.JSON(200, `{
	  "candidates": [{
	    "content": {"role": "model", "parts": [
	      {"text": "I'll read both files."},
	      {"functionCall": {"name": "read", "args": {"path": "a.txt"}}, "thoughtSignature": "CiQB0e2Kb7eN1kWq2vJ3rS5Y0Q=="},
	      {"functionCall": {"id": "fc-7x2", "name": "read", "args": {"path": "b.txt", "limit": 10, "opts": {"raw": true}}}},
	      {"functionCall": {"name": "now"}}
	    ]},
	    "finishReason": "STOP",
	    "index": 0
	  }],
	  "usageMetadata": {"promptTokenCount": 90, "candidatesTokenCount": 40, "totalTokenCount": 130},
	  "modelVersion": "gemini-2.5-flash"
	}`))
	p := newProvider(t, f)
	resp, err := p.Complete(context.Background(), &provider.Request{
		Messages: []provider.Message{
			user(text("Read x")),
			assistant(toolUse("gemini_call_0", "read", `{"path":"x"}`)),
			user(toolResult("gemini_call_0", "x contents", false)),
		},
		Tools: []provider.ToolSpec{{Name: "read", InputSchema: json.RawMessage(`{"type":"object"}`)}, {Name: "now"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	// Ids continue after the one call already in the conversation; the
	// id Gemini gave is kept.
	assertParts(t, resp.Parts,
		text("I'll read both files."),
		toolUse("gemini_call_1", "read", `{"path":"a.txt"}`),
		toolUse("fc-7x2", "read", `{"limit":10,"opts":{"raw":true},"path":"b.txt"}`),
		toolUse("gemini_call_3", "now", `{}`),
	)
	if resp.Stop != provider.StopToolUse {
		t.Fatalf("stop %v", resp.Stop)
	}
	if got := len(resp.ToolUses()); got != 3 {
		t.Fatalf("%d tool uses", got)
	}
}

func TestToolResultsSentBack(t *testing.T) {
	f := httpfake.New(t, httpfake.JSON(200, helloResponse))
	p := newProvider(t, f)
	_, err := p.Complete(context.Background(), &provider.Request{
		Messages: []provider.Message{
			user(text("Do it")),
			assistant(
				text("Calling."),
				toolUse("gemini_call_0", "read", `{"path":"a.txt","n":3}`),
				toolUse("fc-1", "write", `{"path": "b.txt"`), // malformed, as the model sent it
				toolUse("toolu_01A", "list", `["not","an","object"]`),
				toolUse("gemini_call_3", "now", ``),
			),
			// One user message per result; they merge into one content.
			user(toolResult("gemini_call_0", "hello", false)),
			user(toolResult("fc-1", "invalid JSON input", true)),
			user(toolResult("toolu_01A", "a\nb", false), toolResult("gemini_call_3", "12:00", false)),
			assistant(toolUse("gemini_call_4", "read", `{"path":"c.txt"}`)),
			user(toolResult("gemini_call_4", "no such file", true)),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	sig := "c2tpcF90aG91Z2h0X3NpZ25hdHVyZV92YWxpZGF0b3I=" // base64 of the sentinel
	httpfake.AssertJSON(t, "request body", f.Only(t).Body, `{
	  "contents": [
	    {"role": "user", "parts": [{"text": "Do it"}]},
	    {"role": "model", "parts": [
	      {"text": "Calling."},
	      {"functionCall": {"name": "read", "args": {"path": "a.txt", "n": 3}}, "thoughtSignature": "`+sig+`"},
	      {"functionCall": {"id": "fc-1", "name": "write", "args": {"_raw": "{\"path\": \"b.txt\""}}},
	      {"functionCall": {"id": "toolu_01A", "name": "list", "args": {"_raw": "[\"not\",\"an\",\"object\"]"}}},
	      {"functionCall": {"name": "now"}}
	    ]},
	    {"role": "user", "parts": [
	      {"functionResponse": {"name": "read", "response": {"output": "hello"}}},
	      {"functionResponse": {"id": "fc-1", "name": "write", "response": {"error": "invalid JSON input"}}},
	      {"functionResponse": {"id": "toolu_01A", "name": "list", "response": {"output": "a\nb"}}},
	      {"functionResponse": {"name": "now", "response": {"output": "12:00"}}}
	    ]},
	    {"role": "model", "parts": [
	      {"functionCall": {"name": "read", "args": {"path": "c.txt"}}, "thoughtSignature": "`+sig+`"}
	    ]},
	    {"role": "user", "parts": [
	      {"functionResponse": {"name": "read", "response": {"error": "no such file"}}}
	    ]}
	  ],
	  "generationConfig": {}
	}`)
}

func TestInvalidRequests(t *testing.T) {
	tests := []struct {
		name string
		req  *provider.Request
		cfg  Config
		want string
	}{
		{name: "nil request", req: nil, want: "nil request"},
		{name: "no model", cfg: Config{}, req: &provider.Request{Messages: []provider.Message{user(text("hi"))}},
			want: "no model named and no default model configured"},
		{name: "no content", req: &provider.Request{Messages: []provider.Message{user(text(""))}},
			want: "the request has no message content"},
		{name: "unknown tool result", req: &provider.Request{Messages: []provider.Message{
			user(text("hi")), assistant(toolUse("a", "read", `{}`)), user(toolResult("b", "x", false))}},
			want: `message 2 part 0: tool result "b" matches no earlier tool call`},
		{name: "result before its call", req: &provider.Request{Messages: []provider.Message{
			user(toolResult("a", "x", false)), assistant(toolUse("a", "read", `{}`))}},
			want: `message 0 part 0: tool result "a" matches no earlier tool call`},
		{name: "tool call from the user", req: &provider.Request{Messages: []provider.Message{user(toolUse("a", "read", `{}`))}},
			want: "message 0 part 0: a tool call in a user message"},
		{name: "bad role", req: &provider.Request{Messages: []provider.Message{{Parts: []provider.Part{text("x")}}}},
			want: "message 0 has no valid role (0)"},
		{name: "empty image", req: &provider.Request{Messages: []provider.Message{user(provider.Part{Image: &provider.Image{}})}},
			want: "message 0 part 0: an image with neither data nor URL"},
		{name: "bad data URL", req: &provider.Request{Messages: []provider.Message{user(provider.Part{Image: &provider.Image{URL: "data:image/png;base64,%%%"}})}},
			want: "message 0 part 0: an image data URL: invalid base64: illegal base64 data at input byte 0"},
		{name: "negative max tokens", req: &provider.Request{MaxTokens: -5, Messages: []provider.Message{user(text("hi"))}},
			want: "max tokens -5 is negative"},
		{name: "bad schema", req: &provider.Request{Messages: []provider.Message{user(text("hi"))},
			Tools: []provider.ToolSpec{{Name: "read", InputSchema: json.RawMessage(`{"type":`)}}},
			want: `tool "read": input schema is not valid JSON: unexpected EOF`},
		{name: "schema with trailing data", req: &provider.Request{Messages: []provider.Message{user(text("hi"))},
			Tools: []provider.ToolSpec{{Name: "read", InputSchema: json.RawMessage(`{} {}`)}}},
			want: `tool "read": input schema has data after the JSON value`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := httpfake.New(t, httpfake.JSON(200, helloResponse))
			cfg := tt.cfg
			cfg.APIKey, cfg.BaseURL = testKey, f.URL()
			if tt.name != "no model" {
				cfg.DefaultModel = testModel
			}
			p, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			_, err = p.Complete(context.Background(), tt.req)
			pe := providerError(t, err)
			if pe.Kind != errs.InvalidArgument || pe.Message != tt.want || pe.HTTPStatus != 0 {
				t.Fatalf("got %v (%s), want InvalidArgument %q", err, kindName(pe.Kind), tt.want)
			}
			if n := f.Count(); n != 0 {
				t.Fatalf("%d requests sent", n)
			}
		})
	}
}

func TestStopReasons(t *testing.T) {
	call := `{"functionCall": {"name": "now", "args": {}}}`
	tests := []struct {
		reason   string
		parts    string
		wantStop provider.StopReason
		wantKind *errs.Kind
		wantMsg  string
	}{
		{reason: "STOP", parts: `{"text": "done"}`, wantStop: provider.StopEndTurn},
		{reason: "STOP", parts: call, wantStop: provider.StopToolUse},
		{reason: "MAX_TOKENS", parts: `{"text": "trunc"}`, wantStop: provider.StopMaxTokens},
		{reason: "MAX_TOKENS", parts: call, wantStop: provider.StopMaxTokens},
		{reason: "CONTINUATION", parts: `{"text": "long"}`, wantStop: provider.StopMaxTokens},
		{reason: "SAFETY", wantStop: provider.StopContentFilter},
		{reason: "RECITATION", parts: `{"text": "part"}`, wantStop: provider.StopContentFilter},
		{reason: "BLOCKLIST", wantStop: provider.StopContentFilter},
		{reason: "PROHIBITED_CONTENT", wantStop: provider.StopContentFilter},
		{reason: "SPII", wantStop: provider.StopContentFilter},
		{reason: "LANGUAGE", wantStop: provider.StopContentFilter},
		{reason: "IMAGE_SAFETY", wantStop: provider.StopContentFilter},
		{reason: "OTHER", wantStop: provider.StopEndTurn},
		{reason: "FINISH_REASON_UNSPECIFIED", parts: call, wantStop: provider.StopToolUse},
		{reason: "SOMETHING_NEW", parts: `{"text": "x"}`, wantStop: provider.StopEndTurn},
		{reason: "MALFORMED_FUNCTION_CALL", wantKind: errs.Retryable,
			wantMsg: "the model produced an invalid function call (MALFORMED_FUNCTION_CALL)"},
		{reason: "UNEXPECTED_TOOL_CALL", wantKind: errs.Retryable,
			wantMsg: "the model produced an invalid function call (UNEXPECTED_TOOL_CALL)"},
	}
	for _, tt := range tests {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/%s/stream=%v", tt.reason, tt.parts, stream), func(t *testing.T) {
				content := `"content": {"role": "model"},`
				if tt.parts != "" {
					content = `"content": {"role": "model", "parts": [` + tt.parts + `]},`
				}
				body := `{"candidates": [{` + content + `"finishReason": "` + tt.reason + `",
				  "finishMessage": "Malformed function call: print(default_api.read(path=))", "index": 0}],
				  "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 3, "totalTokenCount": 13},
				  "modelVersion": "gemini-2.5-flash"}`
				h := httpfake.JSON(200, body)
				var onText func(string)
				if stream {
					h = sseReply(strings.Join(strings.Fields(body), " "))
					onText = func(string) {}
				}
				p := newProvider(t, httpfake.New(t, h))
				resp, err := p.Complete(context.Background(), &provider.Request{Messages: []provider.Message{user(text("hi"))}, OnText: onText})
				if tt.wantKind != nil {
					pe := providerError(t, err)
					if pe.Kind != tt.wantKind || pe.Message != tt.wantMsg || pe.HTTPStatus != 0 {
						t.Fatalf("got %v (%s)", err, kindName(pe.Kind))
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if resp.Stop != tt.wantStop {
					t.Fatalf("stop %v, want %v", resp.Stop, tt.wantStop)
				}
				if want := (provider.Usage{InputTokens: 10, OutputTokens: 3}); resp.Usage != want {
					t.Fatalf("usage %+v", resp.Usage)
				}
			})
		}
	}
}

func TestPromptBlocked(t *testing.T) {
	body := `{
	  "promptFeedback": {
	    "blockReason": "PROHIBITED_CONTENT",
	    "safetyRatings": [{"category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH"}]
	  },
	  "usageMetadata": {"promptTokenCount": 9, "totalTokenCount": 9},
	  "modelVersion": "gemini-2.5-flash",
	  "responseId": "r-1"
	}`
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			h := httpfake.JSON(200, body)
			var onText func(string)
			if stream {
				h = sseReply(strings.Join(strings.Fields(body), " "))
				onText = func(string) { t.Error("OnText called") }
			}
			p := newProvider(t, httpfake.New(t, h))
			resp, err := p.Complete(context.Background(), &provider.Request{Messages: []provider.Message{user(text("bad"))}, OnText: onText})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Stop != provider.StopContentFilter || len(resp.Parts) != 0 || resp.Usage != (provider.Usage{InputTokens: 9}) || resp.Model != "gemini-2.5-flash" {
				t.Fatalf("got %+v", resp)
			}
		})
	}
}

func TestUsage(t *testing.T) {
	tests := []struct {
		name  string
		usage string
		want  provider.Usage
	}{
		{name: "cache and thoughts", usage: `{"promptTokenCount": 1000, "cachedContentTokenCount": 600, "candidatesTokenCount": 50,
			"thoughtsTokenCount": 30, "totalTokenCount": 1080,
			"cacheTokensDetails": [{"modality": "TEXT", "tokenCount": 600}]}`,
			want: provider.Usage{InputTokens: 400, OutputTokens: 80, CacheReadTokens: 600}},
		{name: "tool use prompt", usage: `{"promptTokenCount": 100, "toolUsePromptTokenCount": 25, "candidatesTokenCount": 5, "totalTokenCount": 130}`,
			want: provider.Usage{InputTokens: 125, OutputTokens: 5}},
		{name: "all cached", usage: `{"promptTokenCount": 64, "cachedContentTokenCount": 64, "candidatesTokenCount": 1}`,
			want: provider.Usage{OutputTokens: 1, CacheReadTokens: 64}},
		{name: "none", usage: `{}`, want: provider.Usage{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := httpfake.New(t, httpfake.JSON(200, `{"candidates": [{"content": {"role": "model", "parts": [{"text": "ok"}]}, "finishReason": "STOP"}],
			  "usageMetadata": `+tt.usage+`, "modelVersion": "gemini-2.5-pro"}`))
			resp, err := newProvider(t, f).Complete(context.Background(), &provider.Request{Messages: []provider.Message{user(text("hi"))}})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Usage != tt.want {
				t.Fatalf("usage %+v, want %+v", resp.Usage, tt.want)
			}
		})
	}
}

func TestThoughtPartsAreNotAnswer(t *testing.T) {
	f := httpfake.New(t, httpfake.JSON(200, `{"candidates": [{"content": {"role": "model", "parts": [
	  {"text": "**Planning** I should greet.", "thought": true},
	  {"text": "Hi!", "thoughtSignature": "AbCd"}
	]}, "finishReason": "STOP"}], "modelVersion": "gemini-2.5-pro"}`))
	resp, err := newProvider(t, f).Complete(context.Background(), &provider.Request{Messages: []provider.Message{user(text("hi"))}})
	if err != nil {
		t.Fatal(err)
	}
	assertParts(t, resp.Parts, text("Hi!"))
}

func TestStreaming(t *testing.T) {
	f := httpfake.New(t, sseReply(
		`{"candidates": [{"content": {"parts": [{"text": "Let me "}], "role": "model"}, "index": 0}], "usageMetadata": {"promptTokenCount": 200, "candidatesTokenCount": 2, "totalTokenCount": 202}, "modelVersion": "gemini-2.5-flash", "responseId": "s-1"}`,
		`{"candidates": [{"content": {"parts": [{"text": "think", "thought": true}], "role": "model"}, "index": 0}], "modelVersion": "gemini-2.5-flash", "responseId": "s-1"}`,
		`{"candidates": [{"content": {"parts": [{"text": "check both."}], "role": "model"}, "index": 0}], "usageMetadata": {"promptTokenCount": 200, "candidatesTokenCount": 5, "totalTokenCount": 205}, "modelVersion": "gemini-2.5-flash", "responseId": "s-1"}`,
		`{"candidates": [{"content": {"parts": [{"functionCall": {"name": "read", "args": {"path": "a.txt"}}, "thoughtSignature": "Q2lRQjBlMks="}], "role": "model"}, "index": 0}], "modelVersion": "gemini-2.5-flash", "responseId": "s-1"}`,
		`{"candidates": [{"content": {"parts": [{"functionCall": {"name": "grep", "args": {"pattern": "x", "paths": ["a", "b"]}}}, {"text": " Then done."}], "role": "model"}, "finishReason": "STOP", "index": 0}], "usageMetadata": {"promptTokenCount": 200, "cachedContentTokenCount": 128, "candidatesTokenCount": 31, "thoughtsTokenCount": 12, "totalTokenCount": 243}, "modelVersion": "gemini-2.5-flash-002", "responseId": "s-1"}`,
	))
	p := newProvider(t, f)
	var chunks []string
	resp, err := p.Complete(context.Background(), &provider.Request{
		Messages: []provider.Message{user(text("check a"))},
		Tools:    []provider.ToolSpec{{Name: "read", InputSchema: json.RawMessage(`{"type":"object"}`)}, {Name: "grep"}},
		OnText:   func(s string) { chunks = append(chunks, s) },
	})
	if err != nil {
		t.Fatal(err)
	}
	c := f.Only(t)
	assertGenerate(t, c, testModel, true)
	httpfake.AssertJSON(t, "request body", c.Body, `{
	  "contents": [{"role": "user", "parts": [{"text": "check a"}]}],
	  "generationConfig": {},
	  "tools": [{"functionDeclarations": [{"name": "read", "parametersJsonSchema": {"type": "object"}}, {"name": "grep"}]}]
	}`)
	if got := strings.Join(chunks, "|"); got != "Let me |check both.| Then done." {
		t.Fatalf("OnText chunks %q", chunks)
	}
	assertParts(t, resp.Parts,
		text("Let me check both."),
		toolUse("gemini_call_0", "read", `{"path":"a.txt"}`),
		toolUse("gemini_call_1", "grep", `{"paths":["a","b"],"pattern":"x"}`),
		text(" Then done."),
	)
	if resp.Stop != provider.StopToolUse || resp.Model != "gemini-2.5-flash-002" {
		t.Fatalf("stop %v model %q", resp.Stop, resp.Model)
	}
	if want := (provider.Usage{InputTokens: 72, OutputTokens: 43, CacheReadTokens: 128}); resp.Usage != want {
		t.Fatalf("usage %+v, want %+v", resp.Usage, want)
	}
}

func TestStreamFailures(t *testing.T) {
	first := `{"candidates": [{"content": {"parts": [{"text": "Hel"}], "role": "model"}, "index": 0}], "modelVersion": "gemini-2.5-flash"}`
	tests := []struct {
		name       string
		handler    http.HandlerFunc
		wantKind   *errs.Kind
		wantStatus int
		wantMsg    string
	}{
		{
			name:     "ends without a finish reason",
			handler:  sseReply(first),
			wantKind: errs.Retryable, wantMsg: "the stream ended before the model finished (no finish reason)",
		},
		{
			name:     "error event",
			handler:  sseReply(first, `{"error": {"code": 503, "message": "The model is overloaded. Please try again later.", "status": "UNAVAILABLE"}}`),
			wantKind: errs.Retryable, wantStatus: 503, wantMsg: "The model is overloaded. Please try again later.",
		},
		{
			name:     "malformed chunk",
			handler:  sseReply(first, `{"candidates": [`),
			wantKind: errs.NonRetryable, wantMsg: "malformed response: unexpected end of JSON input",
		},
		{
			name: "connection cut",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				w.Header().Set("Content-Length", "100000") // promise more than is sent
				w.WriteHeader(200)
				fmt.Fprintf(w, "data: %s\r\n\r\n", first)
				w.(http.Flusher).Flush()
				conn, _, err := http.NewResponseController(w).Hijack()
				if err == nil {
					conn.Close()
				}
			},
			wantKind: errs.Retryable, wantMsg: "connection failed: unexpected EOF",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := httpfake.New(t, tt.handler)
			var chunks []string
			_, err := newProvider(t, f).Complete(context.Background(), &provider.Request{
				Messages: []provider.Message{user(text("hi"))},
				OnText:   func(s string) { chunks = append(chunks, s) },
			})
			pe := providerError(t, err)
			if pe.Kind != tt.wantKind || pe.HTTPStatus != tt.wantStatus || pe.Message != tt.wantMsg || pe.Model != testModel {
				t.Fatalf("got %v (%s, status %d)", err, kindName(pe.Kind), pe.HTTPStatus)
			}
			if len(chunks) != 1 || chunks[0] != "Hel" {
				t.Fatalf("chunks %q", chunks)
			}
			if n := f.Count(); n != 1 {
				t.Fatalf("%d requests: the SDK retried", n)
			}
		})
	}
}

func TestHTTPErrors(t *testing.T) {
	tests := []struct {
		name      string
		status    int
		header    map[string]string
		body      string
		wantKind  *errs.Kind
		wantRetry time.Duration
		wantMsg   string
	}{
		{
			name: "400", status: 400,
			body:     `{"error": {"code": 400, "message": "* GenerateContentRequest.contents: contents is not specified\n", "status": "INVALID_ARGUMENT"}}`,
			wantKind: errs.NonRetryable, wantMsg: "* GenerateContentRequest.contents: contents is not specified\n",
		},
		{
			name: "400 invalid key", status: 400,
			body: `{"error": {"code": 400, "message": "API key not valid. Please pass a valid API key.", "status": "INVALID_ARGUMENT",
			  "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID", "domain": "googleapis.com",
			    "metadata": {"service": "generativelanguage.googleapis.com"}},
			   {"@type": "type.googleapis.com/google.rpc.LocalizedMessage", "locale": "en-US", "message": "API key not valid. Please pass a valid API key."}]}}`,
			wantKind: errs.NonRetryable,
			wantMsg:  "the Gemini API refused the API key from Config.APIKey: API key not valid. Please pass a valid API key.",
		},
		{
			name: "401 echoing the key", status: 401,
			body:     `{"error": {"code": 401, "message": "Request had invalid authentication credentials: ` + testKey + `", "status": "UNAUTHENTICATED"}}`,
			wantKind: errs.NonRetryable,
			wantMsg:  "the Gemini API refused the API key from Config.APIKey: Request had invalid authentication credentials: [redacted]",
		},
		{
			name: "403", status: 403,
			body:     `{"error": {"code": 403, "message": "Method doesn't allow unregistered callers.", "status": "PERMISSION_DENIED"}}`,
			wantKind: errs.NonRetryable,
			wantMsg:  "the Gemini API refused the API key from Config.APIKey: Method doesn't allow unregistered callers.",
		},
		{
			name: "404", status: 404,
			body:     `{"error": {"code": 404, "message": "models/gemini-9 is not found for API version v1beta.", "status": "NOT_FOUND"}}`,
			wantKind: errs.NonRetryable, wantMsg: "models/gemini-9 is not found for API version v1beta.",
		},
		{
			name: "429 retry-after seconds", status: 429, header: map[string]string{"Retry-After": "7"},
			body:     `{"error": {"code": 429, "message": "Resource has been exhausted (e.g. check quota).", "status": "RESOURCE_EXHAUSTED"}}`,
			wantKind: errs.Retryable, wantRetry: 7 * time.Second, wantMsg: "Resource has been exhausted (e.g. check quota).",
		},
		{
			name: "429 retry-after-ms", status: 429, header: map[string]string{"Retry-After-Ms": "1500", "Retry-After": "2"},
			body:     `{"error": {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED"}}`,
			wantKind: errs.Retryable, wantRetry: 1500 * time.Millisecond, wantMsg: "quota",
		},
		{
			name: "429 RetryInfo", status: 429,
			body: `{"error": {"code": 429, "message": "You exceeded your current quota, please check your plan and billing details.", "status": "RESOURCE_EXHAUSTED",
			  "details": [
			    {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{"quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests", "quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier", "quotaValue": "10"}]},
			    {"@type": "type.googleapis.com/google.rpc.Help", "links": [{"description": "Learn more about Gemini API quotas", "url": "https://ai.google.dev/gemini-api/docs/rate-limits"}]},
			    {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "37s"}
			  ]}}`,
			wantKind: errs.Retryable, wantRetry: 37 * time.Second,
			wantMsg: "You exceeded your current quota, please check your plan and billing details.",
		},
		{
			name: "500", status: 500,
			body:     `{"error": {"code": 500, "message": "An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting", "status": "INTERNAL"}}`,
			wantKind: errs.Retryable, wantMsg: "An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting",
		},
		{
			name: "503", status: 503,
			body:     `{"error": {"code": 503, "message": "The model is overloaded. Please try again later.", "status": "UNAVAILABLE"}}`,
			wantKind: errs.Retryable, wantMsg: "The model is overloaded. Please try again later.",
		},
		{
			name: "529 plain text", status: 529, body: "overloaded",
			wantKind: errs.Retryable, wantMsg: "overloaded",
		},
		{
			name: "502 no body", status: 502,
			wantKind: errs.Retryable, wantMsg: "502 Bad Gateway",
		},
	}
	for _, tt := range tests {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", tt.name, stream), func(t *testing.T) {
				f := httpfake.New(t, func(w http.ResponseWriter, r *http.Request) {
					for k, v := range tt.header {
						w.Header().Set(k, v)
					}
					if strings.HasPrefix(tt.body, "{") {
						w.Header().Set("Content-Type", "application/json; charset=UTF-8")
					}
					w.WriteHeader(tt.status)
					fmt.Fprint(w, tt.body)
				})
				var onText func(string)
				if stream {
					onText = func(string) { t.Error("OnText called") }
				}
				_, err := newProvider(t, f).Complete(context.Background(), &provider.Request{Messages: []provider.Message{user(text("hi"))}, OnText: onText})
				pe := providerError(t, err)
				if pe.Kind != tt.wantKind || pe.HTTPStatus != tt.status || pe.RetryAfter != tt.wantRetry || pe.Message != tt.wantMsg || pe.Model != testModel {
					t.Fatalf("got %#v (%s)", pe, kindName(pe.Kind))
				}
				if want := fmt.Sprintf("gemini model %s: HTTP %d: %s", testModel, tt.status, tt.wantMsg); err.Error() != want {
					t.Fatalf("Error() = %q, want %q", err.Error(), want)
				}
				if n := f.Count(); n != 1 {
					t.Fatalf("%d requests: the SDK retried", n)
				}
			})
		}
	}
}

func TestRetryAfterDate(t *testing.T) {
	h := http.Header{}
	h.Set("Retry-After", time.Now().Add(30*time.Second).UTC().Format(http.TimeFormat))
	if got := retryAfter(h, nil); got < 28*time.Second || got > 30*time.Second {
		t.Fatalf("RetryAfter %v, want about 30s", got)
	}
	h.Set("Retry-After", time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat))
	if got := retryAfter(h, nil); got != 0 {
		t.Fatalf("past date: %v", got)
	}
	if got := retryAfter(http.Header{}, []map[string]any{{"@type": typeRetryInfo, "retryDelay": "1.5s"}}); got != 1500*time.Millisecond {
		t.Fatalf("RetryInfo 1.5s: %v", got)
	}
}

func TestMalformedResponse(t *testing.T) {
	tests := []struct {
		name string
		body string
		want string
	}{
		{name: "not JSON", body: `<html>oops</html>`, want: "malformed response: invalid character '<' looking for beginning of value"},
		{name: "no candidates", body: `{"modelVersion": "gemini-2.5-flash", "responseId": "x"}`, want: "malformed response: no candidates and no block reason"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := httpfake.New(t, httpfake.JSON(200, tt.body))
			_, err := newProvider(t, f).Complete(context.Background(), &provider.Request{Messages: []provider.Message{user(text("hi"))}})
			pe := providerError(t, err)
			if pe.Kind != errs.NonRetryable || pe.HTTPStatus != 0 || pe.Message != tt.want {
				t.Fatalf("got %v (%s)", err, kindName(pe.Kind))
			}
		})
	}
}

func TestConnectionRefused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	p, err := New(Config{APIKey: testKey, BaseURL: "http://" + addr, DefaultModel: testModel})
	if err != nil {
		t.Fatal(err)
	}
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			var onText func(string)
			if stream {
				onText = func(string) {}
			}
			_, err := p.Complete(context.Background(), &provider.Request{Messages: []provider.Message{user(text("hi"))}, OnText: onText})
			pe := providerError(t, err)
			if pe.Kind != errs.Retryable || pe.HTTPStatus != 0 || !provider.Retryable(err) ||
				!strings.HasPrefix(pe.Message, "connection failed: ") || !strings.Contains(pe.Message, "connection refused") {
				t.Fatalf("got %v (%s)", err, kindName(pe.Kind))
			}
		})
	}
}

func TestCancel(t *testing.T) {
	t.Run("mid-stream", func(t *testing.T) {
		served := make(chan struct{})
		f := httpfake.New(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"Hel\"}], \"role\": \"model\"}}]}\r\n\r\n")
			w.(http.Flusher).Flush()
			<-r.Context().Done() // the client goes away
			close(served)
		})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var chunks []string
		_, err := newProvider(t, f).Complete(ctx, &provider.Request{
			Messages: []provider.Message{user(text("hi"))},
			OnText: func(s string) {
				chunks = append(chunks, s)
				cancel()
			},
		})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want context.Canceled", err)
		}
		if len(chunks) != 1 {
			t.Fatalf("chunks %q", chunks)
		}
		select {
		case <-served:
		case <-time.After(5 * time.Second):
			t.Fatal("the request was not abandoned")
		}
	})
	t.Run("deadline", func(t *testing.T) {
		f := httpfake.New(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err := newProvider(t, f).Complete(ctx, &provider.Request{Messages: []provider.Message{user(text("hi"))}})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v, want context.DeadlineExceeded", err)
		}
	})
	t.Run("before the call", func(t *testing.T) {
		f := httpfake.New(t, httpfake.JSON(200, helloResponse))
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := newProvider(t, f).Complete(ctx, &provider.Request{Messages: []provider.Message{user(text("hi"))}})
		if !errors.Is(err, context.Canceled) || f.Count() != 0 {
			t.Fatalf("got %v after %d requests", err, f.Count())
		}
	})
}

// countingTransport counts requests and marks them, standing in for an
// egress proxy's transport.
type countingTransport struct{ n atomic.Int32 }

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	r = r.Clone(r.Context())
	r.Header.Set("X-Egress", "yes")
	return http.DefaultTransport.RoundTrip(r)
}

func TestHTTPClientAndBaseURL(t *testing.T) {
	f := httpfake.New(t, httpfake.JSON(200, helloResponse))
	tr := &countingTransport{}
	hc := &http.Client{Transport: tr}
	p, err := New(Config{APIKey: testKey, BaseURL: f.URL() + "/proxy/google/", HTTPClient: hc, DefaultModel: testModel})
	if err != nil {
		t.Fatal(err)
	}
	if hc.Transport != tr {
		t.Fatal("New changed the caller's client")
	}
	if _, err := p.Complete(context.Background(), &provider.Request{Messages: []provider.Message{user(text("hi"))}}); err != nil {
		t.Fatal(err)
	}
	c := f.Only(t)
	if egress := c.Header.Get("X-Egress"); tr.n.Load() != 1 || egress != "yes" {
		t.Fatalf("the configured client sent %d requests (egress header %q)", tr.n.Load(), egress)
	}
	if path := c.Path; path != "/proxy/google/v1beta/models/"+testModel+":generateContent" {
		t.Fatalf("path %q", path)
	}
}

// GOOGLE_GEMINI_BASE_URL, which the SDK would read, is not used: without
// a base URL the request goes to the public API.
func TestBaseURLNotFromEnvironment(t *testing.T) {
	f := httpfake.New(t, httpfake.JSON(200, helloResponse))
	t.Setenv("GOOGLE_GEMINI_BASE_URL", f.URL())
	var url string
	hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		url = r.URL.String()
		return nil, errors.New("not sent")
	})}
	p, err := New(Config{APIKey: testKey, HTTPClient: hc, DefaultModel: testModel})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = p.Complete(context.Background(), &provider.Request{Messages: []provider.Message{user(text("hi"))}})
	if want := "https://generativelanguage.googleapis.com/v1beta/models/" + testModel + ":generateContent"; url != want {
		t.Errorf("URL %q, want %q", url, want)
	}
	if n := len(f.Requests()); n != 0 {
		t.Errorf("the GOOGLE_GEMINI_BASE_URL server got %d requests, want 0", n)
	}
}

// A refused key is named by its source when the Config gives one.
func TestRefusedKeySource(t *testing.T) {
	f := httpfake.New(t, httpfake.JSON(401, `{"error": {"code": 401, "message": "API key not valid.", "status": "UNAUTHENTICATED"}}`))
	p, err := New(Config{APIKey: testKey, KeySource: "$GOOGLE_API_KEY", BaseURL: f.URL(), DefaultModel: testModel})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Complete(context.Background(), &provider.Request{Messages: []provider.Message{user(text("hi"))}})
	if pe := providerError(t, err); pe.Message != "the Gemini API refused the API key from $GOOGLE_API_KEY: API key not valid." {
		t.Fatalf("message %q", pe.Message)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
