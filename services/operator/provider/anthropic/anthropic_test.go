package anthropic

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/secbear/neuron/internal/httpfake"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

func TestName(t *testing.T) {
	p, err := New(Config{APIKey: testKey})
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Name(); got != "anthropic" {
		t.Errorf("Name() = %q, want anthropic", got)
	}
}

func TestNewErrors(t *testing.T) {
	// The environment is never read: a key there does not count.
	t.Setenv("ANTHROPIC_API_KEY", testKey)
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no key", Config{}, "anthropic provider: no API key in the configuration: invalid argument"},
		{"relative base URL", Config{APIKey: testKey, BaseURL: "api.anthropic.com/v1"}, `anthropic provider: base URL "api.anthropic.com/v1" is not an absolute http(s) URL: invalid argument`},
		{"base URL with credentials", Config{APIKey: testKey, BaseURL: "ftp://user:" + testKey + "@host"}, `anthropic provider: base URL "ftp://user:xxxxx@host" is not an absolute http(s) URL: invalid argument`},
		{"unparsable base URL", Config{APIKey: testKey, BaseURL: "http://[::1" + testKey}, "anthropic provider: base URL is not a URL: invalid argument"},
		{"negative max tokens", Config{APIKey: testKey, MaxTokens: -1}, "anthropic provider: max tokens -1 is negative: invalid argument"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(tt.cfg)
			if err == nil {
				t.Fatalf("New = %v, want an error", p)
			}
			if err.Error() != tt.want {
				t.Errorf("error = %q, want %q", err, tt.want)
			}
			if !errors.Is(err, errs.InvalidArgument) {
				t.Errorf("error %v does not wrap errs.InvalidArgument", err)
			}
			if strings.Contains(err.Error(), testKey) {
				t.Errorf("error %q contains the API key", err)
			}
		})
	}
}

// TestEnvironmentIgnored checks that New reads no environment: the
// Config's key and base URL are used, ANTHROPIC_API_KEY and
// ANTHROPIC_BASE_URL are not (the operator's wiring reads them), and
// without a base URL the public API is the target, not the variable's.
func TestEnvironmentIgnored(t *testing.T) {
	f := newFakeAPI(t, replyJSON(200, message(`[{"type":"text","text":"hi"}]`, `"end_turn"`, plainUsage)))
	other := newFakeAPI(t, replyJSON(500, errorBody("api_error", "wrong server")))

	t.Setenv("ANTHROPIC_API_KEY", "sk-ant-from-env")
	t.Setenv("ANTHROPIC_BASE_URL", other.URL())
	p, err := New(Config{APIKey: testKey, BaseURL: f.URL() + "/proxy/anthropic", DefaultModel: testModel})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Complete(context.Background(), &provider.Request{Messages: userText("hi")}); err != nil {
		t.Fatal(err)
	}
	c := f.Only(t)
	if c.Path != "/proxy/anthropic/v1/messages" {
		t.Errorf("path = %q, want /proxy/anthropic/v1/messages", c.Path)
	}
	if got := c.Header.Get("X-Api-Key"); got != testKey {
		t.Errorf("x-api-key = %q, want the configured key", got)
	}

	// No base URL: the SDK's default, not $ANTHROPIC_BASE_URL. The
	// client's transport sees where the request would go.
	var host string
	hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		host = r.URL.Host
		return nil, errors.New("not sent")
	})}
	p, err = New(Config{APIKey: testKey, HTTPClient: hc, DefaultModel: testModel})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = p.Complete(context.Background(), &provider.Request{Messages: userText("hi")})
	if host != "api.anthropic.com" {
		t.Errorf("request host = %q, want api.anthropic.com", host)
	}
	if n := len(other.Requests()); n != 0 {
		t.Errorf("the env base URL got %d requests, want 0", n)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestSDKEnvironmentIgnored checks that the SDK's own credential chain is
// off: an auth token in the environment is not sent.
func TestSDKEnvironmentIgnored(t *testing.T) {
	t.Setenv("ANTHROPIC_AUTH_TOKEN", "sk-ant-oat-should-not-be-sent")
	t.Setenv("ANTHROPIC_CUSTOM_HEADERS", "X-Leak: yes")
	f := newFakeAPI(t, replyJSON(200, message(`[{"type":"text","text":"hi"}]`, `"end_turn"`, plainUsage)))
	p := newProvider(t, f, Config{})
	if _, err := p.Complete(context.Background(), &provider.Request{Messages: userText("hi")}); err != nil {
		t.Fatal(err)
	}
	h := f.Only(t).Header
	if got := h.Get("Authorization"); got != "" {
		t.Errorf("Authorization = %q, want none", got)
	}
	if got := h.Get("X-Leak"); got != "" {
		t.Errorf("X-Leak = %q, want none", got)
	}
}

func userText(s string) []provider.Message {
	return []provider.Message{{Role: provider.User, Parts: []provider.Part{{Text: s}}}}
}

func TestCompleteText(t *testing.T) {
	f := newFakeAPI(t, replyJSON(200, message(
		`[{"type":"text","text":"Hello! How can I help?","citations":null}]`, `"end_turn"`,
		`{"input_tokens":2095,"output_tokens":503,"cache_creation_input_tokens":2051,"cache_read_input_tokens":1024,"cache_creation":{"ephemeral_5m_input_tokens":2051,"ephemeral_1h_input_tokens":0},"service_tier":"standard"}`)))
	p := newProvider(t, f, Config{})
	resp, err := p.Complete(context.Background(), &provider.Request{
		System:   "You are terse.",
		Messages: userText("Hello"),
	})
	if err != nil {
		t.Fatal(err)
	}
	want := &provider.Response{
		Parts: []provider.Part{{Text: "Hello! How can I help?"}},
		Stop:  provider.StopEndTurn,
		Usage: provider.Usage{InputTokens: 2095, OutputTokens: 503, CacheReadTokens: 1024, CacheWriteTokens: 2051},
		Model: answerModel,
	}
	if !reflect.DeepEqual(resp, want) {
		t.Errorf("response = %+v, want %+v", resp, want)
	}

	c := f.Only(t)
	if c.Method != http.MethodPost || c.Path != "/v1/messages" {
		t.Errorf("request = %s %s, want POST /v1/messages", c.Method, c.Path)
	}
	for k, v := range map[string]string{
		"X-Api-Key":         testKey,
		"Anthropic-Version": "2023-06-01",
		"Content-Type":      "application/json",
		"Authorization":     "",
		// The SDK's retry and timeout bookkeeping: no retries, no timeout.
		"X-Stainless-Retry-Count": "0",
		"X-Stainless-Timeout":     "",
	} {
		if got := c.Header.Get(k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	httpfake.AssertJSON(t, "request body", c.Body, `{
		"model": "claude-sonnet-4-5",
		"max_tokens": 4096,
		"system": [{"type": "text", "text": "You are terse."}],
		"messages": [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}]
	}`)
}

func TestMaxTokensAndModel(t *testing.T) {
	tests := []struct {
		name          string
		cfg           Config
		req           provider.Request
		wantModel     string
		wantMaxTokens float64
	}{
		{"defaults", Config{}, provider.Request{}, testModel, 4096},
		{"config max tokens", Config{MaxTokens: 777}, provider.Request{}, testModel, 777},
		{"request max tokens", Config{MaxTokens: 777}, provider.Request{MaxTokens: 123}, testModel, 123},
		{"request model", Config{}, provider.Request{Model: "claude-opus-4-1"}, "claude-opus-4-1", 4096},
		// Beyond what the SDK lets a non-streaming call ask for by itself.
		{"large non-streaming", Config{}, provider.Request{MaxTokens: 200000}, testModel, 200000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeAPI(t, replyJSON(200, message(`[{"type":"text","text":"ok"}]`, `"end_turn"`, plainUsage)))
			p := newProvider(t, f, tt.cfg)
			tt.req.Messages = userText("hi")
			if _, err := p.Complete(context.Background(), &tt.req); err != nil {
				t.Fatal(err)
			}
			body := f.Only(t).JSON(t)
			if body["model"] != tt.wantModel || body["max_tokens"] != tt.wantMaxTokens {
				t.Errorf("model, max_tokens = %v, %v; want %v, %v", body["model"], body["max_tokens"], tt.wantModel, tt.wantMaxTokens)
			}
			if _, ok := body["stream"]; ok {
				t.Errorf("non-streaming request has stream = %v", body["stream"])
			}
		})
	}
}

// pngPixel is a 1x1 PNG.
var pngPixel = []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89\x00\x00\x00\rIDATx\x9cc\xf8\xcf\xc0\xf0\x1f\x00\x05\x00\x01\xff\x89\x99=\x1d\x00\x00\x00\x00IEND\xaeB`\x82")

// TestRequestMapping checks the whole wire form of a conversation with
// images, tool calls and results, tools and metadata.
func TestRequestMapping(t *testing.T) {
	f := newFakeAPI(t, replyJSON(200, message(`[{"type":"text","text":"Done."}]`, `"end_turn"`, plainUsage)))
	p := newProvider(t, f, Config{})
	req := &provider.Request{
		System: "Be careful.",
		Messages: []provider.Message{
			{Role: provider.User, Parts: []provider.Part{
				{Text: "Compare these."},
				{Image: &provider.Image{Data: pngPixel}},
				{Image: &provider.Image{Data: []byte("GIF89a...."), MediaType: "image/gif"}},
				{Image: &provider.Image{URL: "https://example.com/cat.jpg"}},
				{Image: &provider.Image{Data: []byte{0xff, 0xd8, 0xff}, MediaType: "image/jpg"}},
				{Text: ""},
			}},
			// Consecutive user messages are merged.
			{Role: provider.User, Parts: []provider.Part{{Text: "And read a.txt."}}},
			{Role: provider.Assistant, Parts: []provider.Part{
				{Text: "Reading."},
				{ToolUse: &provider.ToolUse{ID: "toolu_01A", Name: "read", Input: json.RawMessage(`{"path": "a.txt"}`)}},
				{ToolUse: &provider.ToolUse{ID: "toolu_01B", Name: "read", Input: json.RawMessage(`{"path": "b.txt"`)}},
				{ToolUse: &provider.ToolUse{ID: "toolu_01C", Name: "list"}},
			}},
			{Role: provider.User, Parts: []provider.Part{
				{ToolResult: &provider.ToolResult{ToolUseID: "toolu_01A", Content: "alpha"}},
				{ToolResult: &provider.ToolResult{ToolUseID: "toolu_01B", Content: "invalid JSON arguments", IsError: true}},
				{ToolResult: &provider.ToolResult{ToolUseID: "toolu_01C"}},
			}},
			// A message with nothing to send is dropped; the next one merges.
			{Role: provider.User, Parts: []provider.Part{{Text: ""}}},
			{Role: provider.User, Parts: []provider.Part{{Text: "Go on."}}},
		},
		Tools: []provider.ToolSpec{
			{Name: "read", Description: "Read a file.", InputSchema: json.RawMessage(
				`{"type":"object","properties":{"path":{"type":"string","description":"File path"}},"required":["path"],"additionalProperties":false}`)},
			{Name: "list"},
		},
		MaxTokens: 1024,
		Metadata:  map[string]any{"user_id": "u-5f2c", "trace_id": "abc"},
	}
	if _, err := p.Complete(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	httpfake.AssertJSON(t, "request body", f.Only(t).Body, `{
		"model": "claude-sonnet-4-5",
		"max_tokens": 1024,
		"system": [{"type": "text", "text": "Be careful."}],
		"metadata": {"user_id": "u-5f2c"},
		"messages": [
			{"role": "user", "content": [
				{"type": "text", "text": "Compare these."},
				{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGP4z8DwHwAFAAH/iZk9HQAAAABJRU5ErkJggg=="}},
				{"type": "image", "source": {"type": "base64", "media_type": "image/gif", "data": "R0lGODlhLi4uLg=="}},
				{"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
				{"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/"}},
				{"type": "text", "text": "And read a.txt."}
			]},
			{"role": "assistant", "content": [
				{"type": "text", "text": "Reading."},
				{"type": "tool_use", "id": "toolu_01A", "name": "read", "input": {"path": "a.txt"}},
				{"type": "tool_use", "id": "toolu_01B", "name": "read", "input": {}},
				{"type": "tool_use", "id": "toolu_01C", "name": "list", "input": {}}
			]},
			{"role": "user", "content": [
				{"type": "tool_result", "tool_use_id": "toolu_01A", "content": [{"type": "text", "text": "alpha"}]},
				{"type": "tool_result", "tool_use_id": "toolu_01B", "content": [{"type": "text", "text": "invalid JSON arguments"}], "is_error": true},
				{"type": "tool_result", "tool_use_id": "toolu_01C"},
				{"type": "text", "text": "Go on."}
			]}
		],
		"tools": [
			{"name": "read", "description": "Read a file.", "input_schema": {"type": "object", "properties": {"path": {"type": "string", "description": "File path"}}, "required": ["path"], "additionalProperties": false}},
			{"name": "list", "input_schema": {"type": "object"}}
		]
	}`)
}

// TestToolCalls checks several tool calls in one response, their inputs
// passed through byte for byte.
func TestToolCalls(t *testing.T) {
	f := newFakeAPI(t, replyJSON(200, message(`[
		{"type":"text","text":"I'll check both files."},
		{"type":"tool_use","id":"toolu_01T1x1fJ34qAmk2tNTrN7Up6","name":"read","input":{"path": "a.txt",  "lines": [1, 2]}},
		{"type":"tool_use","id":"toolu_01AbCdEfGh","name":"read","input":{"path":"b.txt"}},
		{"type":"tool_use","id":"toolu_01NoArgs","name":"list","input":{}}
	]`, `"tool_use"`, plainUsage)))
	p := newProvider(t, f, Config{})
	resp, err := p.Complete(context.Background(), &provider.Request{Messages: userText("read a and b")})
	if err != nil {
		t.Fatal(err)
	}
	want := &provider.Response{
		Parts: []provider.Part{
			{Text: "I'll check both files."},
			{ToolUse: &provider.ToolUse{ID: "toolu_01T1x1fJ34qAmk2tNTrN7Up6", Name: "read", Input: json.RawMessage(`{"path": "a.txt",  "lines": [1, 2]}`)}},
			{ToolUse: &provider.ToolUse{ID: "toolu_01AbCdEfGh", Name: "read", Input: json.RawMessage(`{"path":"b.txt"}`)}},
			{ToolUse: &provider.ToolUse{ID: "toolu_01NoArgs", Name: "list", Input: json.RawMessage(`{}`)}},
		},
		Stop:  provider.StopToolUse,
		Usage: provider.Usage{InputTokens: 12, OutputTokens: 6},
		Model: answerModel,
	}
	if !reflect.DeepEqual(resp, want) {
		t.Errorf("response =\n%s\nwant\n%s", dump(resp), dump(want))
	}
}

func dump(r *provider.Response) string {
	var b strings.Builder
	for _, p := range r.Parts {
		if p.ToolUse != nil {
			b.WriteString("tool_use " + p.ToolUse.ID + " " + p.ToolUse.Name + " " + string(p.ToolUse.Input) + "\n")
		} else {
			b.WriteString("text " + p.Text + "\n")
		}
	}
	b.WriteString("stop " + r.Stop.String() + " model " + r.Model + "\n")
	j, _ := json.Marshal(r.Usage)
	b.Write(j)
	return b.String()
}

func TestStopReasons(t *testing.T) {
	tests := []struct {
		wire     string
		toolCall bool
		want     provider.StopReason
	}{
		{`"end_turn"`, false, provider.StopEndTurn},
		{`"stop_sequence"`, false, provider.StopEndTurn},
		{`"tool_use"`, true, provider.StopToolUse},
		{`"max_tokens"`, false, provider.StopMaxTokens},
		{`"model_context_window_exceeded"`, false, provider.StopMaxTokens},
		{`"refusal"`, false, provider.StopContentFilter},
		{`"pause_turn"`, false, provider.StopEndTurn},
		{`null`, false, provider.StopEndTurn},
		{`"something_new"`, false, provider.StopEndTurn},
		{`"something_new"`, true, provider.StopToolUse},
	}
	for _, tt := range tests {
		content := `[{"type":"text","text":"Hi"}]`
		if tt.toolCall {
			content = `[{"type":"tool_use","id":"toolu_1","name":"list","input":{}}]`
		}
		for _, streaming := range []bool{false, true} {
			name := tt.wire
			if tt.toolCall {
				name += " with tool call"
			}
			if streaming {
				name += " streaming"
			}
			t.Run(name, func(t *testing.T) {
				var handle http.HandlerFunc
				if streaming {
					events := ssePlainText(tt.wire)
					if tt.toolCall {
						events[1] = httpfake.Event("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"list","input":{}}}`)
						events = append(events[:3], events[5:]...)
					}
					handle = replySSE(events...)
				} else {
					handle = replyJSON(200, message(content, tt.wire, plainUsage))
				}
				f := newFakeAPI(t, handle)
				p := newProvider(t, f, Config{})
				req := &provider.Request{Messages: userText("hi")}
				if streaming {
					req.OnText = func(string) {}
				}
				resp, err := p.Complete(context.Background(), req)
				if err != nil {
					t.Fatal(err)
				}
				if resp.Stop != tt.want {
					t.Errorf("stop = %v, want %v", resp.Stop, tt.want)
				}
				if got := len(resp.ToolUses()) > 0; got != tt.toolCall {
					t.Errorf("has tool calls = %v, want %v", got, tt.toolCall)
				}
			})
		}
	}
}

// TestInvalidRequests checks requests that cannot be expressed: they fail
// with errs.InvalidArgument before anything is sent.
func TestInvalidRequests(t *testing.T) {
	f := newFakeAPI(t, replyJSON(200, message(`[]`, `"end_turn"`, plainUsage)))
	p := newProvider(t, f, Config{})
	noDefault, err := New(Config{APIKey: testKey, BaseURL: f.URL()})
	if err != nil {
		t.Fatal(err)
	}
	msgs := func(parts ...provider.Part) []provider.Message {
		return []provider.Message{{Role: provider.User, Parts: parts}}
	}
	tests := []struct {
		name string
		p    *Provider
		req  *provider.Request
		want string
	}{
		{"nil request", p, nil, "anthropic model : nil request"},
		{"no model", noDefault, &provider.Request{Messages: userText("hi")}, "anthropic model : no model named and no default model configured"},
		{"negative max tokens", p, &provider.Request{Messages: userText("hi"), MaxTokens: -5}, "anthropic model claude-sonnet-4-5: max tokens -5 is negative"},
		{"unknown role", p, &provider.Request{Messages: []provider.Message{{Parts: []provider.Part{{Text: "x"}}}}}, "anthropic model claude-sonnet-4-5: messages[0]: unknown role 0"},
		{"empty image", p, &provider.Request{Messages: msgs(provider.Part{Image: &provider.Image{}})}, "anthropic model claude-sonnet-4-5: messages[0].parts[0]: image has neither data nor a URL"},
		{"unsupported image", p, &provider.Request{Messages: msgs(provider.Part{Text: "x"}, provider.Part{Image: &provider.Image{Data: []byte("%PDF-1.7")}})}, `anthropic model claude-sonnet-4-5: messages[0].parts[1]: image media type "application/pdf" is not one of image/jpeg, image/png, image/gif, image/webp`},
		{"tool use without id", p, &provider.Request{Messages: []provider.Message{{Role: provider.Assistant, Parts: []provider.Part{{ToolUse: &provider.ToolUse{Name: "x"}}}}}}, "anthropic model claude-sonnet-4-5: messages[0].parts[0]: tool use needs an id and a name"},
		{"tool result without id", p, &provider.Request{Messages: msgs(provider.Part{ToolResult: &provider.ToolResult{Content: "x"}})}, "anthropic model claude-sonnet-4-5: messages[0].parts[0]: tool result needs the tool use id"},
		{"tool without name", p, &provider.Request{Messages: userText("hi"), Tools: []provider.ToolSpec{{}}}, "anthropic model claude-sonnet-4-5: tools[0]: name is required"},
		{"schema not JSON", p, &provider.Request{Messages: userText("hi"), Tools: []provider.ToolSpec{{Name: "read", InputSchema: json.RawMessage(`{"type":`)}}}, "anthropic model claude-sonnet-4-5: tools[0] (read): input schema is not a JSON object"},
		{"schema not an object", p, &provider.Request{Messages: userText("hi"), Tools: []provider.ToolSpec{{Name: "read", InputSchema: json.RawMessage(`["a"]`)}}}, "anthropic model claude-sonnet-4-5: tools[0] (read): input schema is not a JSON object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.p.Complete(context.Background(), tt.req)
			var pe *provider.Error
			if !errors.As(err, &pe) {
				t.Fatalf("error = %v, want a *provider.Error", err)
			}
			if pe.Kind != errs.InvalidArgument || pe.Provider != Name || pe.HTTPStatus != 0 {
				t.Errorf("error = %+v, want kind invalid argument", pe)
			}
			if err.Error() != tt.want {
				t.Errorf("error = %q, want %q", err, tt.want)
			}
		})
	}
	if n := len(f.Requests()); n != 0 {
		t.Errorf("the API received %d requests, want 0", n)
	}
}
