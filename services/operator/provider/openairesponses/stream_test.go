package openairesponses

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/secbear/neuron/internal/httpfake"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// inProgress is the response object of response.created and
// response.in_progress events.
const inProgress = `{"id":"resp_s1","object":"response","created_at":1741290958,"status":"in_progress","error":null,"incomplete_details":null,"instructions":null,"max_output_tokens":null,"model":"gpt-4.1-2025-04-14","output":[],"parallel_tool_calls":true,"previous_response_id":null,"reasoning":{"effort":null,"summary":null},"store":true,"temperature":1.0,"text":{"format":{"type":"text"}},"tool_choice":"auto","tools":[],"top_p":1.0,"truncation":"disabled","usage":null,"user":null,"metadata":{}}`

func created() []string {
	return []string{
		`{"type":"response.created","sequence_number":0,"response":` + inProgress + `}`,
		`{"type":"response.in_progress","sequence_number":1,"response":` + inProgress + `}`,
	}
}

func textDelta(seq, out int, item, delta string) string {
	return fmt.Sprintf(`{"type":"response.output_text.delta","sequence_number":%d,"item_id":%q,"output_index":%d,"content_index":0,"delta":%q,"logprobs":[]}`, seq, item, out, delta)
}

func argsDelta(seq, out int, item, delta string) string {
	return fmt.Sprintf(`{"type":"response.function_call_arguments.delta","sequence_number":%d,"item_id":%q,"output_index":%d,"delta":%q}`, seq, item, out, delta)
}

func completedEvent(typ, status, incomplete, output, usage string) string {
	return fmt.Sprintf(`{"type":%q,"sequence_number":99,"response":%s}`, typ, responseBody("resp_s1", status, incomplete, output, usage))
}

func streamProvider(t *testing.T, events string) (*Provider, *httpfake.Server) {
	t.Helper()
	f := newFakeAPI(t, httpfake.SSE(events))
	return newTestProvider(t, f), f
}

func TestStreaming(t *testing.T) {
	usage := `{"input_tokens":1500,"input_tokens_details":{"cached_tokens":1024},"output_tokens":220,"output_tokens_details":{"reasoning_tokens":128},"total_tokens":1720}`
	finalOutput := "[" + reasoningItem + "," + messageItem("msg_1", "Checking the weather in two cities.") + "," +
		functionCallItem("fc_1", "call_paris", "get_weather", `{"location":"Paris","unit":"c"}`) + "," +
		functionCallItem("fc_2", "call_rome", "get_weather", `{"location": "Rome"`) + "]"
	events := append(created(),
		`{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"rs_67ccd2bf17f0819081ff3bb2cf6508e6","type":"reasoning","summary":[]}}`,
		`{"type":"response.output_item.done","sequence_number":3,"output_index":0,"item":`+reasoningItem+`}`,
		`{"type":"response.output_item.added","sequence_number":4,"output_index":1,"item":{"id":"msg_1","type":"message","status":"in_progress","role":"assistant","content":[]}}`,
		`{"type":"response.content_part.added","sequence_number":5,"item_id":"msg_1","output_index":1,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}`,
		textDelta(6, 1, "msg_1", "Checking"),
		textDelta(7, 1, "msg_1", " the weather"),
		textDelta(8, 1, "msg_1", " in two cities."),
		`{"type":"response.output_text.done","sequence_number":9,"item_id":"msg_1","output_index":1,"content_index":0,"text":"Checking the weather in two cities.","logprobs":[]}`,
		`{"type":"response.content_part.done","sequence_number":10,"item_id":"msg_1","output_index":1,"content_index":0,"part":{"type":"output_text","text":"Checking the weather in two cities.","annotations":[]}}`,
		`{"type":"response.output_item.done","sequence_number":11,"output_index":1,"item":`+messageItem("msg_1", "Checking the weather in two cities.")+`}`,
		`{"type":"response.output_item.added","sequence_number":12,"output_index":2,"item":{"type":"function_call","id":"fc_1","call_id":"call_paris","name":"get_weather","arguments":"","status":"in_progress"}}`,
		argsDelta(13, 2, "fc_1", `{"location":`),
		argsDelta(14, 2, "fc_1", `"Paris","unit":"c"}`),
		`{"type":"response.function_call_arguments.done","sequence_number":15,"item_id":"fc_1","output_index":2,"arguments":"{\"location\":\"Paris\",\"unit\":\"c\"}"}`,
		`{"type":"response.output_item.done","sequence_number":16,"output_index":2,"item":`+functionCallItem("fc_1", "call_paris", "get_weather", `{"location":"Paris","unit":"c"}`)+`}`,
		`{"type":"response.output_item.added","sequence_number":17,"output_index":3,"item":{"type":"function_call","id":"fc_2","call_id":"call_rome","name":"get_weather","arguments":"","status":"in_progress"}}`,
		argsDelta(18, 3, "fc_2", `{"location": `),
		argsDelta(19, 3, "fc_2", `"Rome"`),
		`{"type":"response.function_call_arguments.done","sequence_number":20,"item_id":"fc_2","output_index":3,"arguments":"{\"location\": \"Rome\""}`,
		`{"type":"response.output_item.done","sequence_number":21,"output_index":3,"item":`+functionCallItem("fc_2", "call_rome", "get_weather", `{"location": "Rome"`)+`}`,
		completedEvent("response.completed", "completed", "", finalOutput, usage),
	)
	p, f := streamProvider(t, sseBody(events...))
	var chunks []string
	resp, err := p.Complete(context.Background(), &provider.Request{
		Messages: []provider.Message{userText("Weather in Paris and Rome?")},
		OnText:   func(s string) { chunks = append(chunks, s) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"Checking", " the weather", " in two cities."}; !reflect.DeepEqual(chunks, want) {
		t.Errorf("OnText chunks %q, want %q", chunks, want)
	}
	assertResponse(t, resp, &provider.Response{
		Parts: []provider.Part{
			textPart("Checking the weather in two cities."),
			toolPart("call_paris", "get_weather", `{"location":"Paris","unit":"c"}`),
			toolPart("call_rome", "get_weather", `{"location": "Rome"`),
		},
		Stop:  provider.StopToolUse,
		Usage: provider.Usage{InputTokens: 476, OutputTokens: 220, CacheReadTokens: 1024},
		Model: "gpt-4.1-2025-04-14",
	})
	httpfake.AssertJSON(t, "body", f.Nth(t, 0).Body, `{
		"model": "gpt-4.1",
		"stream": true,
		"store": false,
		"input": [{"type":"message","role":"user","content":[{"type":"input_text","text":"Weather in Paris and Rome?"}]}]
	}`)
}

// TestStreamingFragments checks the assembly from deltas alone, for a
// stream without the .done events, whose final response has no output.
func TestStreamingFragments(t *testing.T) {
	events := append(created(),
		`{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","role":"assistant","content":[]}}`,
		textDelta(3, 0, "msg_1", "Let me "),
		textDelta(4, 0, "msg_1", "run it."),
		`{"type":"response.output_item.added","sequence_number":5,"output_index":1,"item":{"type":"function_call","id":"fc_1","call_id":"call_1","name":"bash","arguments":"","status":"in_progress"}}`,
		argsDelta(6, 1, "fc_1", `{"cmd":`),
		argsDelta(7, 1, "fc_1", `"ls -la`),
		argsDelta(8, 1, "fc_1", `"}`),
		`{"type":"response.output_item.added","sequence_number":9,"output_index":2,"item":{"type":"function_call","id":"fc_2","call_id":"call_2","name":"bash","arguments":"","status":"in_progress"}}`,
		argsDelta(10, 2, "fc_2", `{"cmd": "pwd`),
		completedEvent("response.completed", "completed", "", "[]", ""),
	)
	p, _ := streamProvider(t, sseBody(events...))
	var text strings.Builder
	resp, err := p.Complete(context.Background(), &provider.Request{
		Messages: []provider.Message{userText("list files")},
		OnText:   func(s string) { text.WriteString(s) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if text.String() != "Let me run it." {
		t.Errorf("OnText got %q", text.String())
	}
	assertResponse(t, resp, &provider.Response{
		Parts: []provider.Part{
			textPart("Let me run it."),
			toolPart("call_1", "bash", `{"cmd":"ls -la"}`),
			toolPart("call_2", "bash", `{"cmd": "pwd`),
		},
		Stop:  provider.StopToolUse,
		Usage: provider.Usage{InputTokens: 36, OutputTokens: 87},
		Model: "gpt-4.1-2025-04-14",
	})
}

func TestStreamingOutcomes(t *testing.T) {
	refusal := `{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"refusal","refusal":"I can't help with that."}]}`
	for _, tc := range []struct {
		name   string
		events []string
		chunks []string
		want   *provider.Response
	}{
		{"final output only", append(created(),
			completedEvent("response.completed", "completed", "", "["+messageItem("msg_1", "All done.")+"]", "")),
			nil,
			&provider.Response{Parts: []provider.Part{textPart("All done.")}, Stop: provider.StopEndTurn}},
		{"incomplete", append(created(),
			`{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","role":"assistant","content":[]}}`,
			textDelta(3, 0, "msg_1", "Once upon"),
			textDelta(4, 0, "msg_1", " a time"),
			completedEvent("response.incomplete", "incomplete", "max_output_tokens",
				`[{"type":"message","id":"msg_1","status":"incomplete","role":"assistant","content":[{"type":"output_text","text":"Once upon a time","annotations":[]}]}]`, "")),
			[]string{"Once upon", " a time"},
			&provider.Response{Parts: []provider.Part{textPart("Once upon a time")}, Stop: provider.StopMaxTokens}},
		{"content filter", append(created(),
			completedEvent("response.incomplete", "incomplete", "content_filter", "[]", "")),
			nil,
			&provider.Response{Stop: provider.StopContentFilter}},
		{"refusal", append(created(),
			`{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","role":"assistant","content":[]}}`,
			`{"type":"response.content_part.added","sequence_number":3,"item_id":"msg_1","output_index":0,"content_index":0,"part":{"type":"refusal","refusal":""}}`,
			`{"type":"response.refusal.delta","sequence_number":4,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"I can't "}`,
			`{"type":"response.refusal.delta","sequence_number":5,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"help with that."}`,
			`{"type":"response.refusal.done","sequence_number":6,"item_id":"msg_1","output_index":0,"content_index":0,"refusal":"I can't help with that."}`,
			`{"type":"response.output_item.done","sequence_number":7,"output_index":0,"item":`+refusal+`}`,
			completedEvent("response.completed", "completed", "", "["+refusal+"]", "")),
			[]string{"I can't ", "help with that."},
			&provider.Response{Parts: []provider.Part{textPart("I can't help with that.")}, Stop: provider.StopContentFilter}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := streamProvider(t, sseBody(tc.events...))
			var chunks []string
			resp, err := p.Complete(context.Background(), &provider.Request{
				Messages: []provider.Message{userText("go")},
				OnText:   func(s string) { chunks = append(chunks, s) },
			})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(chunks, tc.chunks) {
				t.Errorf("OnText chunks %q, want %q", chunks, tc.chunks)
			}
			tc.want.Usage = provider.Usage{InputTokens: 36, OutputTokens: 87}
			tc.want.Model = "gpt-4.1-2025-04-14"
			assertResponse(t, resp, tc.want)
		})
	}
}

func TestStreamingFailures(t *testing.T) {
	partial := append(created(),
		`{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","role":"assistant","content":[]}}`,
		textDelta(3, 0, "msg_1", "Hel"))
	for _, tc := range []struct {
		name    string
		body    string
		kind    *errs.Kind
		message string
	}{
		{"response failed", sseBody(append(partial,
			`{"type":"response.failed","sequence_number":4,"response":{"id":"resp_s1","object":"response","created_at":1741290958,"status":"failed","error":{"code":"server_error","message":"The model failed to generate a response."},"incomplete_details":null,"model":"gpt-4.1-2025-04-14","output":[],"usage":null}}`)...),
			errs.Retryable, "server_error: The model failed to generate a response."},
		{"response failed, policy", sseBody(append(partial,
			`{"type":"response.failed","sequence_number":4,"response":{"id":"resp_s1","object":"response","created_at":1741290958,"status":"failed","error":{"code":"invalid_prompt","message":"Invalid prompt: flagged."},"incomplete_details":null,"model":"gpt-4.1-2025-04-14","output":[],"usage":null}}`)...),
			errs.NonRetryable, "invalid_prompt: Invalid prompt: flagged."},
		{"error event", sseBody(append(partial,
			`{"type":"error","sequence_number":4,"code":"rate_limit_exceeded","message":"Rate limit reached for gpt-4.1.","param":null}`)...),
			errs.Retryable, "rate_limit_exceeded: Rate limit reached for gpt-4.1."},
		{"nested error event", sseBody(append(partial,
			`{"type":"error","sequence_number":4,"error":{"type":"invalid_request_error","code":"context_length_exceeded","message":"Your input exceeds the context window of this model.","param":"input"}}`)...),
			errs.NonRetryable, "context_length_exceeded: Your input exceeds the context window of this model."},
		{"nested server error event", sseBody(append(partial,
			`{"type":"error","sequence_number":4,"error":{"type":"server_error","code":null,"message":"An error occurred while processing your request.","param":null}}`)...),
			errs.Retryable, "server_error: An error occurred while processing your request."},
		{"cut short", sseBody(partial...), errs.Retryable, "the stream ended before the response completed"},
		{"malformed event", sseBody(partial...) + "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\n\n",
			errs.NonRetryable, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := streamProvider(t, tc.body)
			var chunks []string
			_, err := p.Complete(context.Background(), &provider.Request{
				Messages: []provider.Message{userText("hi")},
				OnText:   func(s string) { chunks = append(chunks, s) },
			})
			pe := providerErr(t, err, tc.kind, 0)
			if tc.message != "" && pe.Message != tc.message {
				t.Errorf("message %q, want %q", pe.Message, tc.message)
			}
			if tc.message == "" && !strings.HasPrefix(pe.Message, "malformed response: ") {
				t.Errorf("message %q does not say the response is malformed", pe.Message)
			}
			if !reflect.DeepEqual(chunks, []string{"Hel"}) {
				t.Errorf("OnText chunks %q", chunks)
			}
		})
	}
}

func TestStreamingBodyCutMidEvent(t *testing.T) {
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		body := sseBody(created()...) + "event: response.output_text.delta\ndata: {\"type\":"
		fmt.Fprintf(buf, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s", len(body)+500, body)
		_ = buf.Flush()
	})
	_, err := newTestProvider(t, f).Complete(context.Background(), &provider.Request{
		Messages: []provider.Message{userText("hi")},
		OnText:   func(string) {},
	})
	providerErr(t, err, errs.Retryable, 0)
}

func TestStreamingCancel(t *testing.T) {
	released := make(chan struct{})
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
		defer close(released)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, sseBody(append(created(),
			`{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","role":"assistant","content":[]}}`,
			textDelta(3, 0, "msg_1", "Thinking"))...))
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
			t.Error("the client did not go away")
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	var chunks []string
	_, err := newTestProvider(t, f).Complete(ctx, &provider.Request{
		Messages: []provider.Message{userText("hi")},
		OnText: func(s string) {
			chunks = append(chunks, s)
			cancel()
		},
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want context.Canceled", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("Complete took %v after the cancel", time.Since(start))
	}
	if !reflect.DeepEqual(chunks, []string{"Thinking"}) {
		t.Errorf("OnText chunks %q", chunks)
	}
	<-released
}

func TestCancelBeforeResponse(t *testing.T) {
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := newTestProvider(t, f).Complete(ctx, &provider.Request{Messages: []provider.Message{userText("hi")}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v, want context.DeadlineExceeded", err)
	}
}
