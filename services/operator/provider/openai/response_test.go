package openai

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/secbear/neuron/internal/httpfake"
	"github.com/secbear/neuron/services/operator/provider"
)

// completion is a chat.completion body with the given message, finish
// reason and usage, as OpenAI sends it.
func completion(message, finish, usage string) string {
	return `{
  "id": "chatcmpl-abc123",
  "object": "chat.completion",
  "created": 1741570283,
  "model": "gpt-4o-2024-08-06",
  "choices": [{"index": 0, "message": ` + message + `, "logprobs": null, "finish_reason": "` + finish + `"}],
  "usage": ` + usage + `,
  "service_tier": "default",
  "system_fingerprint": "fp_fc9f1d7035"
}`
}

const usage12 = `{"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12,
  "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
  "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}}`

func textMessage(s string) string {
	return `{"role": "assistant", "content": "` + s + `", "refusal": null, "annotations": []}`
}

func toolUse(id, name, input string) provider.Part {
	return provider.Part{ToolUse: &provider.ToolUse{ID: id, Name: name, Input: json.RawMessage(input)}}
}

func TestResponseMapping(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		want provider.Response
	}{
		{"plain text", completion(textMessage("Hello there."), "stop", usage12),
			provider.Response{Parts: []provider.Part{text("Hello there.")}, Stop: provider.StopEndTurn,
				Usage: provider.Usage{InputTokens: 10, OutputTokens: 2}, Model: "gpt-4o-2024-08-06"}},
		{"tool calls, one with invalid JSON arguments", completion(`{
		  "role": "assistant", "content": "Reading both.", "refusal": null, "annotations": [],
		  "tool_calls": [
		    {"id": "call_Ab1", "type": "function", "function": {"name": "read", "arguments": "{\"path\":\"a.txt\"}"}},
		    {"id": "call_Cd2", "type": "function", "function": {"name": "read", "arguments": "{\"path\": \"b.txt\""}},
		    {"id": "call_Ef3", "type": "function", "function": {"name": "now", "arguments": ""}}
		  ]}`, "tool_calls", usage12),
			provider.Response{Parts: []provider.Part{
				text("Reading both."),
				toolUse("call_Ab1", "read", `{"path":"a.txt"}`),
				toolUse("call_Cd2", "read", `{"path": "b.txt"`),
				toolUse("call_Ef3", "now", `{}`),
			}, Stop: provider.StopToolUse, Usage: provider.Usage{InputTokens: 10, OutputTokens: 2}, Model: "gpt-4o-2024-08-06"}},
		{"usage with cached and cache-write tokens", completion(textMessage("ok"), "stop", `{
		  "prompt_tokens": 2006, "completion_tokens": 300, "total_tokens": 2306,
		  "prompt_tokens_details": {"cached_tokens": 1920, "cache_write_tokens": 64, "audio_tokens": 0},
		  "completion_tokens_details": {"reasoning_tokens": 256, "audio_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}}`),
			provider.Response{Parts: []provider.Part{text("ok")}, Stop: provider.StopEndTurn,
				Usage: provider.Usage{InputTokens: 22, OutputTokens: 300, CacheReadTokens: 1920, CacheWriteTokens: 64},
				Model: "gpt-4o-2024-08-06"}},
		{"usage with cached tokens only", completion(textMessage("ok"), "stop", `{
		  "prompt_tokens": 1117, "completion_tokens": 46, "total_tokens": 1163,
		  "prompt_tokens_details": {"cached_tokens": 1024}}`),
			provider.Response{Parts: []provider.Part{text("ok")}, Stop: provider.StopEndTurn,
				Usage: provider.Usage{InputTokens: 93, OutputTokens: 46, CacheReadTokens: 1024},
				Model: "gpt-4o-2024-08-06"}},
		{"usage missing", `{"id": "x", "object": "chat.completion", "created": 1, "model": "llama3.2",
		  "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}`,
			provider.Response{Parts: []provider.Part{text("hi")}, Stop: provider.StopEndTurn, Model: "llama3.2"}},
		{"length", completion(textMessage("Once upon a"), "length", usage12),
			provider.Response{Parts: []provider.Part{text("Once upon a")}, Stop: provider.StopMaxTokens,
				Usage: provider.Usage{InputTokens: 10, OutputTokens: 2}, Model: "gpt-4o-2024-08-06"}},
		{"content_filter", completion(`{"role": "assistant", "content": null, "refusal": null}`, "content_filter", usage12),
			provider.Response{Stop: provider.StopContentFilter,
				Usage: provider.Usage{InputTokens: 10, OutputTokens: 2}, Model: "gpt-4o-2024-08-06"}},
		{"refusal", completion(`{"role": "assistant", "content": null, "refusal": "I'm sorry, I can't help with that.", "annotations": []}`, "stop", usage12),
			provider.Response{Parts: []provider.Part{text("I'm sorry, I can't help with that.")}, Stop: provider.StopContentFilter,
				Usage: provider.Usage{InputTokens: 10, OutputTokens: 2}, Model: "gpt-4o-2024-08-06"}},
		{"legacy function_call", completion(`{"role": "assistant", "content": null,
		  "function_call": {"name": "read", "arguments": "{\"path\":\"a.txt\"}"}}`, "function_call", usage12),
			provider.Response{Parts: []provider.Part{toolUse("call_0", "read", `{"path":"a.txt"}`)}, Stop: provider.StopToolUse,
				Usage: provider.Usage{InputTokens: 10, OutputTokens: 2}, Model: "gpt-4o-2024-08-06"}},
		{"tool calls with stop and no ids (compatible server)", `{"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "qwen2.5:7b",
		  "choices": [{"index": 0, "message": {"role": "assistant", "content": "", "tool_calls": [
		    {"type": "function", "function": {"name": "read", "arguments": "{\"path\":\"a\"}"}},
		    {"type": "function", "function": {"name": "read", "arguments": "{\"path\":\"b\"}"}}]}, "finish_reason": "stop"}],
		  "usage": {"prompt_tokens": 50, "completion_tokens": 20, "total_tokens": 70}}`,
			provider.Response{Parts: []provider.Part{toolUse("call_0", "read", `{"path":"a"}`), toolUse("call_1", "read", `{"path":"b"}`)},
				Stop: provider.StopToolUse, Usage: provider.Usage{InputTokens: 50, OutputTokens: 20}, Model: "qwen2.5:7b"}},
		{"content as text parts (compatible server)", `{"id": "x", "object": "chat.completion", "created": 1, "model": "mistral-small",
		  "choices": [{"index": 0, "message": {"role": "assistant", "content": [
		    {"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "Hel"}, {"type": "text", "text": "lo."}]},
		    "finish_reason": "stop"}]}`,
			provider.Response{Parts: []provider.Part{text("Hello.")}, Stop: provider.StopEndTurn, Model: "mistral-small"}},
		{"no model in response", `{"id": "x", "object": "chat.completion", "created": 1,
		  "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}`,
			provider.Response{Parts: []provider.Part{text("hi")}, Stop: provider.StopEndTurn, Model: "gpt-4o"}},
	} {
		for _, fl := range flavours {
			t.Run(tc.name+"/"+fl.name, func(t *testing.T) {
				f := httpfake.New(t, httpfake.JSON(200, tc.body))
				p := fl.make(t, f.URL()+"/v1")
				got, err := p.Complete(context.Background(), &provider.Request{Messages: []provider.Message{userText("hi")}})
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(*got, tc.want) {
					t.Fatalf("response\n got %+v\nwant %+v", describe(got), describe(&tc.want))
				}
				if !got.Cost.IsZero() {
					t.Fatalf("cost %v, want 0", got.Cost)
				}
			})
		}
	}
}

// describe renders a response readably for failure messages.
func describe(r *provider.Response) string {
	type part struct {
		Text    string            `json:",omitempty"`
		ToolUse *provider.ToolUse `json:",omitempty"`
	}
	var ps []part
	for _, p := range r.Parts {
		ps = append(ps, part{p.Text, p.ToolUse})
	}
	b, _ := json.Marshal(struct {
		Parts []part
		Stop  string
		Usage provider.Usage
		Model string
	}{ps, r.Stop.String(), r.Usage, r.Model})
	return string(b)
}

func TestStopReason(t *testing.T) {
	for _, tc := range []struct {
		finish  string
		refused bool
		calls   bool
		want    provider.StopReason
	}{
		{"stop", false, false, provider.StopEndTurn},
		{"", false, false, provider.StopEndTurn},
		{"tool_calls", false, true, provider.StopToolUse},
		{"function_call", false, true, provider.StopToolUse},
		{"stop", false, true, provider.StopToolUse},
		{"", false, true, provider.StopToolUse},
		{"length", false, false, provider.StopMaxTokens},
		{"length", false, true, provider.StopMaxTokens},
		{"content_filter", false, false, provider.StopContentFilter},
		{"stop", true, false, provider.StopContentFilter},
		{"length", true, false, provider.StopContentFilter},
	} {
		if got := stopReason(tc.finish, tc.refused, tc.calls); got != tc.want {
			t.Errorf("stopReason(%q, %v, %v) = %v, want %v", tc.finish, tc.refused, tc.calls, got, tc.want)
		}
	}
}
