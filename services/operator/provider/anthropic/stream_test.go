package anthropic

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/secbear/neuron/internal/httpfake"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

func TestStreamText(t *testing.T) {
	f := newFakeAPI(t, replySSE(ssePlainText(`"end_turn"`)...))
	p := newProvider(t, f, Config{MaxTokens: 512})
	var tc textCollector
	resp, err := p.Complete(context.Background(), &provider.Request{
		System:   "Be brief.",
		Messages: userText("Say hello"),
		OnText:   tc.on,
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := tc.got(), []string{"Hello", "!"}; !reflect.DeepEqual(got, want) {
		t.Errorf("OnText chunks = %q, want %q", got, want)
	}
	want := &provider.Response{
		Parts: []provider.Part{{Text: "Hello!"}},
		Stop:  provider.StopEndTurn,
		Usage: provider.Usage{InputTokens: 25, OutputTokens: 15},
		Model: answerModel,
	}
	if !reflect.DeepEqual(resp, want) {
		t.Errorf("response =\n%s\nwant\n%s", dump(resp), dump(want))
	}
	c := f.Only(t)
	if c.Path != "/v1/messages" || c.Header.Get("X-Api-Key") != testKey {
		t.Errorf("request = %s with key %q", c.Path, c.Header.Get("X-Api-Key"))
	}
	httpfake.AssertJSON(t, "request body", c.Body, `{
		"model": "claude-sonnet-4-5",
		"max_tokens": 512,
		"stream": true,
		"system": [{"type": "text", "text": "Be brief."}],
		"messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello"}]}]
	}`)
}

// TestStreamToolCalls streams text and several tool calls, one with an
// input assembled from fragments, one whose fragments do not form valid
// JSON (passed through verbatim), and one with no input deltas.
func TestStreamToolCalls(t *testing.T) {
	f := newFakeAPI(t, replySSE(
		httpfake.Event("message_start", `{"type":"message_start","message":{"id":"msg_014p7gG3wDgGV9EUtLvnow3U","type":"message","role":"assistant","model":"`+answerModel+`","stop_sequence":null,"usage":{"input_tokens":472,"output_tokens":2,"cache_creation_input_tokens":200,"cache_read_input_tokens":1500},"content":[],"stop_reason":null}}`),
		httpfake.Event("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`),
		httpfake.Event("ping", `{"type": "ping"}`),
		httpfake.Event("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Okay, let's check"}}`),
		httpfake.Event("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" both files:"}}`),
		httpfake.Event("content_block_stop", `{"type":"content_block_stop","index":0}`),
		httpfake.Event("content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_01T1x1fJ34qAmk2tNTrN7Up6","name":"read","input":{}}}`),
		httpfake.Event("content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}`),
		httpfake.Event("content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"path\": \"a"}}`),
		httpfake.Event("content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":".txt\", \"lines\""}}`),
		httpfake.Event("content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":": [1, 2]}"}}`),
		httpfake.Event("content_block_stop", `{"type":"content_block_stop","index":1}`),
		httpfake.Event("content_block_start", `{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_01Broken","name":"read","input":{}}}`),
		httpfake.Event("content_block_delta", `{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"path\": "}}`),
		httpfake.Event("content_block_delta", `{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"\"b.txt\""}}`),
		httpfake.Event("content_block_stop", `{"type":"content_block_stop","index":2}`),
		httpfake.Event("content_block_start", `{"type":"content_block_start","index":3,"content_block":{"type":"tool_use","id":"toolu_01NoArgs","name":"list","input":{}}}`),
		httpfake.Event("content_block_stop", `{"type":"content_block_stop","index":3}`),
		httpfake.Event("message_delta", `{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":89}}`),
		httpfake.Event("message_stop", `{"type":"message_stop"}`),
	))
	p := newProvider(t, f, Config{})
	var tc textCollector
	resp, err := p.Complete(context.Background(), &provider.Request{
		Messages: userText("read a and b"),
		Tools:    []provider.ToolSpec{{Name: "read", InputSchema: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}}}`)}, {Name: "list"}},
		OnText:   tc.on,
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := tc.got(), []string{"Okay, let's check", " both files:"}; !reflect.DeepEqual(got, want) {
		t.Errorf("OnText chunks = %q, want %q", got, want)
	}
	want := &provider.Response{
		Parts: []provider.Part{
			{Text: "Okay, let's check both files:"},
			{ToolUse: &provider.ToolUse{ID: "toolu_01T1x1fJ34qAmk2tNTrN7Up6", Name: "read", Input: json.RawMessage(`{"path": "a.txt", "lines": [1, 2]}`)}},
			{ToolUse: &provider.ToolUse{ID: "toolu_01Broken", Name: "read", Input: json.RawMessage(`{"path": "b.txt"`)}},
			{ToolUse: &provider.ToolUse{ID: "toolu_01NoArgs", Name: "list", Input: json.RawMessage(`{}`)}},
		},
		Stop:  provider.StopToolUse,
		Usage: provider.Usage{InputTokens: 472, OutputTokens: 89, CacheReadTokens: 1500, CacheWriteTokens: 200},
		Model: answerModel,
	}
	if !reflect.DeepEqual(resp, want) {
		t.Errorf("response =\n%s\nwant\n%s", dump(resp), dump(want))
	}
	body := f.Only(t).JSON(t)
	if body["stream"] != true {
		t.Errorf("stream = %v, want true", body["stream"])
	}
	httpfake.AssertJSON(t, "tools", body["tools"], `[
		{"name": "read", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}},
		{"name": "list", "input_schema": {"type": "object"}}
	]`)
}

// TestStreamCumulativeUsage checks a message_delta that carries the
// message's full usage: its counts replace message_start's.
func TestStreamCumulativeUsage(t *testing.T) {
	events := ssePlainText(`"max_tokens"`)
	events[6] = httpfake.Event("message_delta", `{"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"input_tokens":30,"cache_creation_input_tokens":7,"cache_read_input_tokens":11,"output_tokens":40}}`)
	f := newFakeAPI(t, replySSE(events...))
	p := newProvider(t, f, Config{})
	resp, err := p.Complete(context.Background(), &provider.Request{Messages: userText("hi"), OnText: func(string) {}})
	if err != nil {
		t.Fatal(err)
	}
	want := provider.Usage{InputTokens: 30, OutputTokens: 40, CacheReadTokens: 11, CacheWriteTokens: 7}
	if resp.Usage != want || resp.Stop != provider.StopMaxTokens {
		t.Errorf("usage, stop = %+v, %v; want %+v, max_tokens", resp.Usage, resp.Stop, want)
	}
}

// TestStreamErrors checks streams that fail after the 200 response began.
func TestStreamErrors(t *testing.T) {
	start := ssePlainText(`"end_turn"`)[:4] // message_start .. first text delta
	withStart := func(more ...string) []string { return append(append([]string(nil), start...), more...) }
	tests := []struct {
		name   string
		events []string
		want   provider.Error
	}{
		{
			name:   "overloaded error event",
			events: withStart(httpfake.Event("error", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_011CSHoEeqs5C35K2UUqR7Fy"}`)),
			want:   provider.Error{Kind: errs.Retryable, HTTPStatus: 529, Message: "Overloaded"},
		},
		{
			name:   "api error event",
			events: withStart(httpfake.Event("error", `{"type":"error","error":{"type":"api_error","message":"Internal server error"}}`)),
			want:   provider.Error{Kind: errs.Retryable, HTTPStatus: 500, Message: "Internal server error"},
		},
		{
			name:   "invalid request error event",
			events: withStart(httpfake.Event("error", `{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}`)),
			want:   provider.Error{Kind: errs.NonRetryable, HTTPStatus: 400, Message: "prompt is too long: 210000 tokens > 200000 maximum"},
		},
		{
			name:   "unknown error type",
			events: withStart(httpfake.Event("error", `{"type":"error","error":{"type":"brand_new_error","message":"Something"}}`)),
			want:   provider.Error{Kind: errs.Retryable, HTTPStatus: 500, Message: "Something"},
		},
		{
			name:   "ends before message_stop",
			events: withStart(),
			want:   provider.Error{Kind: errs.Retryable, Message: "stream ended before message_stop"},
		},
		{
			name:   "no events",
			events: nil,
			want:   provider.Error{Kind: errs.NonRetryable, Message: "malformed response: the stream has no message_start event"},
		},
		{
			name:   "event before message_start",
			events: []string{httpfake.Event("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)},
			want:   provider.Error{Kind: errs.NonRetryable, Message: `malformed response: stream event "content_block_start" before message_start`},
		},
		{
			name:   "delta for a block that never started",
			events: withStart(httpfake.Event("content_block_delta", `{"type":"content_block_delta","index":4,"delta":{"type":"text_delta","text":"x"}}`)),
			want:   provider.Error{Kind: errs.NonRetryable, Message: "malformed response: event for content block 4, which has not started"},
		},
		{
			name:   "event data not JSON",
			events: withStart(httpfake.Event("content_block_delta", `{"type":"content_block_delta","index":0,`)),
			want:   provider.Error{Kind: errs.NonRetryable, Message: "malformed response: the body is not a JSON message"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeAPI(t, replySSE(tt.events...))
			p := newProvider(t, f, Config{})
			_, err := p.Complete(context.Background(), &provider.Request{Messages: userText("hi"), OnText: func(string) {}})
			tt.want.Provider, tt.want.Model = Name, testModel
			checkError(t, err, &tt.want)
		})
	}
}

// TestStreamConnectionDropped cuts the connection in the middle of a
// stream: a retryable failure with no status.
func TestStreamConnectionDropped(t *testing.T) {
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		for _, e := range ssePlainText(`"end_turn"`)[:4] {
			_, _ = io.WriteString(w, e)
		}
		w.(http.Flusher).Flush()
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		_ = conn.Close()
	})
	p := newProvider(t, f, Config{})
	var tc textCollector
	_, err := p.Complete(context.Background(), &provider.Request{Messages: userText("hi"), OnText: tc.on})
	var pe *provider.Error
	if !errors.As(err, &pe) || pe.Kind != errs.Retryable || pe.HTTPStatus != 0 {
		t.Fatalf("error = %#v, want a retryable *provider.Error with no status", err)
	}
	if got := tc.got(); !reflect.DeepEqual(got, []string{"Hello"}) {
		t.Errorf("OnText chunks = %q, want [Hello]", got)
	}
}

// TestStreamCancel cancels the context while the stream is open: the error
// is the context's.
func TestStreamCancel(t *testing.T) {
	released := make(chan struct{})
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
		defer close(released)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		for _, e := range ssePlainText(`"end_turn"`)[:4] {
			_, _ = io.WriteString(w, e)
		}
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
			t.Error("the client did not go away after its context was cancelled")
		}
	})
	p := newProvider(t, f, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var tc textCollector
	_, err := p.Complete(ctx, &provider.Request{Messages: userText("hi"), OnText: func(s string) {
		tc.on(s)
		cancel()
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error = %v, want context.Canceled", err)
	}
	if got := tc.got(); !reflect.DeepEqual(got, []string{"Hello"}) {
		t.Errorf("OnText chunks = %q, want [Hello]", got)
	}
	<-released
}

func TestCancelNonStreaming(t *testing.T) {
	for _, tt := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"cancel", func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }, context.Canceled},
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 200*time.Millisecond)
		}, context.DeadlineExceeded},
	} {
		t.Run(tt.name, func(t *testing.T) {
			received := make(chan struct{})
			f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
				close(received)
				<-r.Context().Done()
			})
			p := newProvider(t, f, Config{})
			ctx, cancel := tt.ctx()
			defer cancel()
			go func() {
				<-received
				if tt.want == context.Canceled {
					cancel()
				}
			}()
			_, err := p.Complete(ctx, &provider.Request{Messages: userText("hi")})
			if !errors.Is(err, tt.want) {
				t.Fatalf("error = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestCancelledBeforeCall(t *testing.T) {
	f := newFakeAPI(t, replyJSON(200, message(`[]`, `"end_turn"`, plainUsage)))
	p := newProvider(t, f, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := p.Complete(ctx, &provider.Request{Messages: userText("hi")})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error = %v, want context.Canceled", err)
	}
	if n := len(f.Requests()); n != 0 {
		t.Errorf("the API received %d requests, want 0", n)
	}
}
