package openai

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/secbear/neuron/internal/httpfake"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

const okBody = `{
  "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
  "object": "chat.completion",
  "created": 1741570283,
  "model": "gpt-4o-2024-08-06",
  "choices": [{
    "index": 0,
    "message": {"role": "assistant", "content": "Done.", "refusal": null, "annotations": []},
    "logprobs": null,
    "finish_reason": "stop"
  }],
  "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12,
    "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}},
  "service_tier": "default",
  "system_fingerprint": "fp_fc9f1d7035"
}`

// fullRequest exercises every mapping: system prompt, user text and
// images (inline and URL), assistant text with two tool calls, their
// results (one an error) followed by more user text, tools and max tokens.
func fullRequest() *provider.Request {
	return &provider.Request{
		Model:  "gpt-4.1",
		System: "You are terse.",
		Messages: []provider.Message{
			{Role: provider.User, Parts: []provider.Part{
				text("What is in these files and this picture?"),
				{Image: &provider.Image{Data: []byte("\x89PNG\r\n\x1a\nfake"), MediaType: "image/png"}},
				{Image: &provider.Image{URL: "https://example.com/cat.jpg"}},
			}},
			{Role: provider.Assistant, Parts: []provider.Part{
				text("Let me read them."),
				{ToolUse: &provider.ToolUse{ID: "call_A", Name: "read", Input: json.RawMessage(`{"path":"a.txt"}`)}},
				{ToolUse: &provider.ToolUse{ID: "call_B", Name: "read", Input: json.RawMessage(`{"path": "b.txt"`)}},
			}},
			{Role: provider.User, Parts: []provider.Part{
				{ToolResult: &provider.ToolResult{ToolUseID: "call_A", Content: "hello"}},
				{ToolResult: &provider.ToolResult{ToolUseID: "call_B", Content: "invalid JSON input", IsError: true}},
				text("Be quick."),
			}},
			{Role: provider.Assistant, Parts: []provider.Part{text("a.txt says hello.")}},
			userText("Thanks."),
		},
		Tools: []provider.ToolSpec{
			{Name: "read", Description: "Read a file.", InputSchema: json.RawMessage(
				`{"type":"object","properties":{"path":{"type":"string","maxLength":4096}},"required":["path"],"additionalProperties":false}`)},
			{Name: "now"},
		},
		MaxTokens: 512,
		Metadata:  map[string]any{"trace": "t-1"},
		SessionID: "s-1",
	}
}

// fullMessages is fullRequest's messages on the wire.
const fullMessages = `[
  {"role": "system", "content": "You are terse."},
  {"role": "user", "content": [
    {"type": "text", "text": "What is in these files and this picture?"},
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgpmYWtl"}},
    {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}}
  ]},
  {"role": "assistant", "content": "Let me read them.", "tool_calls": [
    {"id": "call_A", "type": "function", "function": {"name": "read", "arguments": "{\"path\":\"a.txt\"}"}},
    {"id": "call_B", "type": "function", "function": {"name": "read", "arguments": "{\"path\": \"b.txt\""}}
  ]},
  {"role": "tool", "tool_call_id": "call_A", "content": "hello"},
  {"role": "tool", "tool_call_id": "call_B", "content": "ERROR: invalid JSON input"},
  {"role": "user", "content": "Be quick."},
  {"role": "assistant", "content": "a.txt says hello."},
  {"role": "user", "content": "Thanks."}
]`

const fullTools = `[
  {"type": "function", "function": {"name": "read", "description": "Read a file.", "parameters":
    {"type": "object", "properties": {"path": {"type": "string", "maxLength": 4096}}, "required": ["path"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
]`

func TestRequestMapping(t *testing.T) {
	for _, tc := range []struct {
		name     string
		make     func(baseURL string) (*Provider, error)
		auth     string
		maxField string
	}{
		{"openai", func(u string) (*Provider, error) { return New(Config{APIKey: testKey, BaseURL: u}) },
			"Bearer " + testKey, "max_completion_tokens"},
		{"compatible without key", func(u string) (*Provider, error) { return NewCompatible(Config{BaseURL: u}) },
			"", "max_tokens"},
		{"compatible with key", func(u string) (*Provider, error) {
			return NewCompatible(Config{APIKey: "local-key", BaseURL: u})
		}, "Bearer local-key", "max_tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := httpfake.New(t, httpfake.JSON(200, okBody))
			p, err := tc.make(f.URL() + "/v1")
			if err != nil {
				t.Fatal(err)
			}
			req := fullRequest()
			if _, err := p.Complete(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			got := f.Only(t)
			if got.Method != "POST" || got.Path != "/v1/chat/completions" {
				t.Fatalf("request %s %s, want POST /v1/chat/completions", got.Method, got.Path)
			}
			if a := got.Header.Get("Authorization"); a != tc.auth {
				t.Fatalf("Authorization %q, want %q", a, tc.auth)
			}
			if ct := got.Header.Get("Content-Type"); ct != "application/json" {
				t.Fatalf("Content-Type %q", ct)
			}
			want := `{"model": "gpt-4.1", "messages": ` + fullMessages + `, "tools": ` + fullTools +
				`, "` + tc.maxField + `": 512}`
			httpfake.AssertJSON(t, "request body", got.Body, want)

			// WireRequest is exactly what was sent.
			wire, err := p.WireRequest(req)
			if err != nil {
				t.Fatal(err)
			}
			httpfake.AssertJSON(t, "WireRequest", wire, string(got.Body))
		})
	}
}

func TestRequestDefaults(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		req  provider.Request
		want string
	}{
		{"default model, no cap", Config{DefaultModel: "gpt-4o-mini"},
			provider.Request{Messages: []provider.Message{userText("hi")}},
			`{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}`},
		{"config cap", Config{DefaultModel: "gpt-4o-mini", MaxTokens: 1000},
			provider.Request{Messages: []provider.Message{userText("hi")}},
			`{"model": "gpt-4o-mini", "max_completion_tokens": 1000, "messages": [{"role": "user", "content": "hi"}]}`},
		{"request cap and model win", Config{DefaultModel: "gpt-4o-mini", MaxTokens: 1000},
			provider.Request{Model: "o3", MaxTokens: 7, Messages: []provider.Message{userText("hi")}},
			`{"model": "o3", "max_completion_tokens": 7, "messages": [{"role": "user", "content": "hi"}]}`},
		{"empty input, sniffed image, two text parts", Config{DefaultModel: "m"},
			provider.Request{Messages: []provider.Message{
				{Role: provider.User, Parts: []provider.Part{text("a"), text("b")}},
				{Role: provider.Assistant, Parts: []provider.Part{
					text("x"), text("y"),
					{ToolUse: &provider.ToolUse{ID: "c1", Name: "now"}},
				}},
				{Role: provider.User, Parts: []provider.Part{
					{ToolResult: &provider.ToolResult{ToolUseID: "c1", Content: ""}},
					{Image: &provider.Image{Data: []byte("GIF89a....")}},
				}},
			}},
			`{"model": "m", "messages": [
			  {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
			  {"role": "assistant", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}],
			   "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{}"}}]},
			  {"role": "tool", "tool_call_id": "c1", "content": ""},
			  {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/gif;base64,R0lGODlhLi4uLg=="}}]}
			]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := httpfake.New(t, httpfake.JSON(200, okBody))
			cfg := tc.cfg
			cfg.APIKey, cfg.BaseURL = testKey, f.URL()+"/v1"
			p, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.Complete(context.Background(), &tc.req); err != nil {
				t.Fatal(err)
			}
			httpfake.AssertJSON(t, "request body", f.Only(t).Body, tc.want)
		})
	}
}

func TestInvalidRequests(t *testing.T) {
	schema := json.RawMessage(`{"type":"object"}`)
	for _, tc := range []struct {
		name string
		req  *provider.Request
	}{
		{"nil request", nil},
		{"no model", &provider.Request{Messages: []provider.Message{userText("hi")}}},
		{"no messages", &provider.Request{Model: "m"}},
		{"negative max tokens", &provider.Request{Model: "m", MaxTokens: -1, Messages: []provider.Message{userText("hi")}}},
		{"unknown role", &provider.Request{Model: "m", Messages: []provider.Message{{Role: 9, Parts: []provider.Part{text("x")}}}}},
		{"tool call in user message", &provider.Request{Model: "m", Messages: []provider.Message{
			{Role: provider.User, Parts: []provider.Part{{ToolUse: &provider.ToolUse{ID: "c", Name: "n"}}}}}}},
		{"tool result in assistant message", &provider.Request{Model: "m", Messages: []provider.Message{
			{Role: provider.Assistant, Parts: []provider.Part{{ToolResult: &provider.ToolResult{ToolUseID: "c"}}}}}}},
		{"image in assistant message", &provider.Request{Model: "m", Messages: []provider.Message{
			{Role: provider.Assistant, Parts: []provider.Part{{Image: &provider.Image{URL: "https://x/y.png"}}}}}}},
		{"image without data or URL", &provider.Request{Model: "m", Messages: []provider.Message{
			{Role: provider.User, Parts: []provider.Part{{Image: &provider.Image{}}}}}}},
		{"inline image that is not an image", &provider.Request{Model: "m", Messages: []provider.Message{
			{Role: provider.User, Parts: []provider.Part{{Image: &provider.Image{Data: []byte("plain text")}}}}}}},
		{"tool result without id", &provider.Request{Model: "m", Messages: []provider.Message{
			{Role: provider.User, Parts: []provider.Part{{ToolResult: &provider.ToolResult{Content: "x"}}}}}}},
		{"tool call without id", &provider.Request{Model: "m", Messages: []provider.Message{
			{Role: provider.Assistant, Parts: []provider.Part{{ToolUse: &provider.ToolUse{Name: "n"}}}}}}},
		{"empty user message", &provider.Request{Model: "m", Messages: []provider.Message{{Role: provider.User}}}},
		{"empty assistant message", &provider.Request{Model: "m", Messages: []provider.Message{{Role: provider.Assistant}}}},
		{"schema not an object", &provider.Request{Model: "m", Messages: []provider.Message{userText("hi")},
			Tools: []provider.ToolSpec{{Name: "t", InputSchema: json.RawMessage(`[1]`)}}}},
		{"schema not JSON", &provider.Request{Model: "m", Messages: []provider.Message{userText("hi")},
			Tools: []provider.ToolSpec{{Name: "t", InputSchema: json.RawMessage(`{"type":`)}}}},
		{"tool without name", &provider.Request{Model: "m", Messages: []provider.Message{userText("hi")},
			Tools: []provider.ToolSpec{{InputSchema: schema}}}},
	} {
		for _, fl := range flavours {
			t.Run(tc.name+"/"+fl.name, func(t *testing.T) {
				f := httpfake.New(t, httpfake.JSON(200, okBody))
				p, err := New(Config{APIKey: testKey, BaseURL: f.URL() + "/v1"})
				if fl.name == CompatibleName {
					p, err = NewCompatible(Config{BaseURL: f.URL() + "/v1"})
				}
				if err != nil {
					t.Fatal(err)
				}
				_, err = p.Complete(context.Background(), tc.req)
				pe := asProviderError(t, err)
				if pe.Kind != errs.InvalidArgument || !errors.Is(err, errs.InvalidArgument) {
					t.Fatalf("kind %v, want invalid argument (%v)", pe.Kind, err)
				}
				if pe.Provider != fl.name || pe.HTTPStatus != 0 {
					t.Fatalf("provider %q status %d", pe.Provider, pe.HTTPStatus)
				}
				if _, err := p.WireRequest(tc.req); !errors.Is(err, errs.InvalidArgument) {
					t.Fatalf("WireRequest: %v", err)
				}
				if n := f.Count(); n != 0 {
					t.Fatalf("server got %d requests, want none", n)
				}
			})
		}
	}
}
