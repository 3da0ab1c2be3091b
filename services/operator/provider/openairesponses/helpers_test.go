package openairesponses

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/secbear/neuron/internal/httpfake"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

const testKey = "sk-test-0123456789abcdef"

// newFakeAPI is a local Responses API answering with handler; every
// request body must be a JSON object. Handlers that answer by the call's
// position use httpfake.Index.
func newFakeAPI(t *testing.T, handler http.HandlerFunc) *httpfake.Server {
	t.Helper()
	return httpfake.New(t, httpfake.RequireJSON(t, handler))
}

func newTestProvider(t *testing.T, f *httpfake.Server, mod ...func(*Config)) *Provider {
	t.Helper()
	cfg := Config{APIKey: testKey, BaseURL: f.URL() + "/v1", DefaultModel: "gpt-4.1"}
	for _, m := range mod {
		m(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p
}

const defaultUsage = `{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},"output_tokens":87,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":123}`

// responseBody is a response object as the API returns it.
func responseBody(id, status, incompleteReason, output, usage string) string {
	incomplete := "null"
	if incompleteReason != "" {
		incomplete = fmt.Sprintf(`{"reason":%q}`, incompleteReason)
	}
	if usage == "" {
		usage = defaultUsage
	}
	return fmt.Sprintf(`{
  "id": %q,
  "object": "response",
  "created_at": 1741476542,
  "status": %q,
  "background": false,
  "error": null,
  "incomplete_details": %s,
  "instructions": null,
  "max_output_tokens": null,
  "max_tool_calls": null,
  "model": "gpt-4.1-2025-04-14",
  "output": %s,
  "parallel_tool_calls": true,
  "previous_response_id": null,
  "reasoning": {"effort": null, "summary": null},
  "service_tier": "default",
  "store": true,
  "temperature": 1.0,
  "text": {"format": {"type": "text"}, "verbosity": "medium"},
  "tool_choice": "auto",
  "tools": [],
  "top_logprobs": 0,
  "top_p": 1.0,
  "truncation": "disabled",
  "usage": %s,
  "user": null,
  "metadata": {}
}`, id, status, incomplete, output, usage)
}

func messageItem(id, text string) string {
	return fmt.Sprintf(`{"type":"message","id":%q,"status":"completed","role":"assistant","content":[{"type":"output_text","text":%q,"annotations":[],"logprobs":[]}]}`, id, text)
}

func functionCallItem(id, callID, name, args string) string {
	return fmt.Sprintf(`{"type":"function_call","id":%q,"call_id":%q,"name":%q,"arguments":%q,"status":"completed"}`, id, callID, name, args)
}

const reasoningItem = `{"type":"reasoning","id":"rs_67ccd2bf17f0819081ff3bb2cf6508e6","summary":[]}`

// textResponse answers with a completed response holding one text message.
func textResponse(id, text string) string {
	return responseBody(id, "completed", "", "["+messageItem("msg_"+id, text)+"]", "")
}

// sseBody renders events, each a JSON object with a "type", as the API
// streams them: one httpfake.Event frame each, for httpfake.SSE.
func sseBody(events ...string) string {
	var b strings.Builder
	for _, ev := range events {
		var head struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal([]byte(ev), &head); err != nil {
			panic(fmt.Sprintf("bad test event %s: %v", ev, err))
		}
		compact := strings.Join(strings.Fields(ev), " ")
		b.WriteString(httpfake.Event(head.Type, compact))
	}
	return b.String()
}

// providerErr checks that err is a *provider.Error of the given kind and
// status.
func providerErr(t *testing.T, err error, kind *errs.Kind, status int) *provider.Error {
	t.Helper()
	var pe *provider.Error
	if !errors.As(err, &pe) {
		t.Fatalf("error %v (%T) is not a *provider.Error", err, err)
	}
	if pe.Kind != kind || !errors.Is(err, kind) {
		t.Errorf("kind = %v, want %v (error %v)", pe.Kind, kind, err)
	}
	if pe.HTTPStatus != status {
		t.Errorf("HTTPStatus = %d, want %d", pe.HTTPStatus, status)
	}
	if pe.Provider != Name {
		t.Errorf("Provider = %q, want %q", pe.Provider, Name)
	}
	if strings.Contains(err.Error(), testKey) {
		t.Errorf("error %q holds the API key", err)
	}
	return pe
}

func userText(s string) provider.Message {
	return provider.Message{Role: provider.User, Parts: []provider.Part{{Text: s}}}
}

func assistantOf(r *provider.Response) provider.Message {
	return provider.Message{Role: provider.Assistant, Parts: r.Parts}
}

// assertResponse checks a response's parts, stop reason, usage and model.
func assertResponse(t *testing.T, got *provider.Response, want *provider.Response) {
	t.Helper()
	if !reflect.DeepEqual(got.Parts, want.Parts) {
		t.Errorf("parts:\n got %s\nwant %s", showParts(got.Parts), showParts(want.Parts))
	}
	if got.Stop != want.Stop {
		t.Errorf("stop = %v, want %v", got.Stop, want.Stop)
	}
	if got.Usage != want.Usage {
		t.Errorf("usage = %+v, want %+v", got.Usage, want.Usage)
	}
	if got.Model != want.Model {
		t.Errorf("model = %q, want %q", got.Model, want.Model)
	}
	if !got.Cost.IsZero() {
		t.Errorf("cost = %s, want 0", got.Cost)
	}
}

func showParts(parts []provider.Part) string {
	var b strings.Builder
	for _, p := range parts {
		switch {
		case p.ToolUse != nil:
			fmt.Fprintf(&b, "[tool_use id=%q name=%q input=%q]", p.ToolUse.ID, p.ToolUse.Name, p.ToolUse.Input)
		case p.ToolResult != nil:
			fmt.Fprintf(&b, "[tool_result %+v]", *p.ToolResult)
		case p.Image != nil:
			fmt.Fprintf(&b, "[image %+v]", *p.Image)
		default:
			fmt.Fprintf(&b, "[text %q]", p.Text)
		}
	}
	return b.String()
}

func textPart(s string) provider.Part { return provider.Part{Text: s} }

func toolPart(id, name, input string) provider.Part {
	return provider.Part{ToolUse: &provider.ToolUse{ID: id, Name: name, Input: json.RawMessage(input)}}
}
