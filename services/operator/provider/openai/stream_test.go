package openai

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/secbear/neuron/internal/httpfake"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// chunk is one chat.completion.chunk event as OpenAI streams it: one
// choice with delta and finish_reason (null when empty), usage null.
func chunk(delta, finish string) string {
	fr := "null"
	if finish != "" {
		fr = `"` + finish + `"`
	}
	return `{"id":"chatcmpl-7Xq","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-2024-08-06",` +
		`"service_tier":"default","system_fingerprint":"fp_fc9f1d7035",` +
		`"choices":[{"index":0,"delta":` + delta + `,"logprobs":null,"finish_reason":` + fr + `}],"usage":null}`
}

// usageChunk is the final chunk include_usage asks for: no choices.
func usageChunk(usage string) string {
	return `{"id":"chatcmpl-7Xq","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-2024-08-06",` +
		`"service_tier":"default","system_fingerprint":"fp_fc9f1d7035","choices":[],"usage":` + usage + `}`
}

func TestStreaming(t *testing.T) {
	for _, tc := range []struct {
		name   string
		events []string
		chunks []string
		want   provider.Response
	}{
		{"text", []string{
			chunk(`{"role":"assistant","content":"","refusal":null}`, ""),
			chunk(`{"content":"Hel"}`, ""),
			chunk(`{"content":"lo, "}`, ""),
			chunk(`{"content":"world."}`, ""),
			chunk(`{}`, "stop"),
			usageChunk(`{"prompt_tokens":1117,"completion_tokens":46,"total_tokens":1163,` +
				`"prompt_tokens_details":{"cached_tokens":1024,"audio_tokens":0},` +
				`"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}`),
			`[DONE]`,
		}, []string{"Hel", "lo, ", "world."},
			provider.Response{Parts: []provider.Part{text("Hello, world.")}, Stop: provider.StopEndTurn,
				Usage: provider.Usage{InputTokens: 93, OutputTokens: 46, CacheReadTokens: 1024}, Model: "gpt-4o-2024-08-06"}},
		{"text and tool call fragments", []string{
			chunk(`{"role":"assistant","content":null,"refusal":null}`, ""),
			chunk(`{"content":"Reading."}`, ""),
			chunk(`{"tool_calls":[{"index":0,"id":"call_DdmO9pD3xa9XTPNJ32zg2hcA","type":"function","function":{"name":"read","arguments":""}}]}`, ""),
			chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"pa"}}]}`, ""),
			chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"th\": \"a.txt\"}"}}]}`, ""),
			chunk(`{"tool_calls":[{"index":1,"id":"call_2","type":"function","function":{"name":"write","arguments":""}}]}`, ""),
			chunk(`{"tool_calls":[{"index":1,"function":{"arguments":"{\"path\": \"b.txt\""}}]}`, ""),
			chunk(`{}`, "tool_calls"),
			usageChunk(`{"prompt_tokens":82,"completion_tokens":37,"total_tokens":119,"prompt_tokens_details":{"cached_tokens":0}}`),
			`[DONE]`,
		}, []string{"Reading."},
			provider.Response{Parts: []provider.Part{
				text("Reading."),
				toolUse("call_DdmO9pD3xa9XTPNJ32zg2hcA", "read", `{"path": "a.txt"}`),
				toolUse("call_2", "write", `{"path": "b.txt"`),
			}, Stop: provider.StopToolUse, Usage: provider.Usage{InputTokens: 82, OutputTokens: 37}, Model: "gpt-4o-2024-08-06"}},
		{"whole tool calls all at index 0 (compatible server)", []string{
			chunk(`{"role":"assistant","content":"","tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"read","arguments":"{\"path\":\"a\"}"}}]}`, ""),
			chunk(`{"role":"assistant","content":"","tool_calls":[{"index":0,"id":"call_b","type":"function","function":{"name":"read","arguments":"{\"path\":\"b\"}"}}]}`, ""),
			chunk(`{"role":"assistant","content":""}`, "tool_calls"),
			`[DONE]`,
		}, nil,
			provider.Response{Parts: []provider.Part{toolUse("call_a", "read", `{"path":"a"}`), toolUse("call_b", "read", `{"path":"b"}`)},
				Stop: provider.StopToolUse, Model: "gpt-4o-2024-08-06"}},
		{"length", []string{
			chunk(`{"role":"assistant","content":"Once"}`, ""),
			chunk(`{"content":" upon"}`, "length"),
			usageChunk(`{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}`),
			`[DONE]`,
		}, []string{"Once", " upon"},
			provider.Response{Parts: []provider.Part{text("Once upon")}, Stop: provider.StopMaxTokens,
				Usage: provider.Usage{InputTokens: 5, OutputTokens: 2}, Model: "gpt-4o-2024-08-06"}},
		{"content_filter", []string{
			chunk(`{"role":"assistant","content":"Sure"}`, ""),
			chunk(`{}`, "content_filter"),
			`[DONE]`,
		}, []string{"Sure"},
			provider.Response{Parts: []provider.Part{text("Sure")}, Stop: provider.StopContentFilter, Model: "gpt-4o-2024-08-06"}},
		{"refusal", []string{
			chunk(`{"role":"assistant","content":null,"refusal":""}`, ""),
			chunk(`{"refusal":"I'm sorry, "}`, ""),
			chunk(`{"refusal":"I can't help with that."}`, ""),
			chunk(`{}`, "stop"),
			`[DONE]`,
		}, []string{"I'm sorry, ", "I can't help with that."},
			provider.Response{Parts: []provider.Part{text("I'm sorry, I can't help with that.")}, Stop: provider.StopContentFilter, Model: "gpt-4o-2024-08-06"}},
	} {
		for _, fl := range flavours {
			t.Run(tc.name+"/"+fl.name, func(t *testing.T) {
				f := httpfake.New(t, httpfake.SSE(tc.events...))
				p := fl.make(t, f.URL()+"/v1")
				var chunks []string
				got, err := p.Complete(context.Background(), &provider.Request{
					Messages:  []provider.Message{userText("hi")},
					MaxTokens: 100,
					OnText:    func(s string) { chunks = append(chunks, s) },
				})
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(chunks, tc.chunks) {
					t.Fatalf("OnText chunks %q, want %q", chunks, tc.chunks)
				}
				if !reflect.DeepEqual(*got, tc.want) {
					t.Fatalf("response\n got %s\nwant %s", describe(got), describe(&tc.want))
				}
				if strings.Join(chunks, "") != got.Text() {
					t.Fatalf("chunks %q do not make the text %q", chunks, got.Text())
				}
				req := f.Only(t)
				if req.Path != "/v1/chat/completions" {
					t.Fatalf("path %q", req.Path)
				}
				maxField := "max_completion_tokens"
				if fl.name == CompatibleName {
					maxField = "max_tokens"
				}
				httpfake.AssertJSON(t, "request body", req.Body, `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"`+maxField+
					`":100,"stream":true,"stream_options":{"include_usage":true}}`)
			})
		}
	}
}

func TestStreamFailures(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		kind    *errs.Kind
		status  int
		message string
	}{
		{"ends without a finish reason", httpfake.SSE(chunk(`{"role":"assistant","content":"Hel"}`, "")),
			errs.Retryable, 0, "the stream ended before the response was complete"},
		{"DONE without a finish reason", httpfake.SSE(chunk(`{"role":"assistant","content":"Hel"}`, ""), "[DONE]"),
			errs.Retryable, 0, "the stream ended before the response was complete"},
		{"error event", httpfake.SSE(chunk(`{"role":"assistant","content":"Hel"}`, ""),
			`{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}`),
			errs.Retryable, 0, "error event in the stream: The server had an error while processing your request. Sorry about that!"},
		{"error event with an HTTP code (vLLM)", httpfake.SSE(`{"error":{"object":"error","message":"This model's maximum context length is 4096 tokens.","type":"BadRequestError","param":null,"code":400}}`),
			errs.NonRetryable, 0, "error event in the stream (code 400): This model's maximum context length is 4096 tokens."},
		{"malformed chunk", httpfake.SSE(chunk(`{"role":"assistant","content":"Hel"}`, ""), `{"id": "x", "choices": [`),
			errs.NonRetryable, 0, ""},
		{"cut short mid-stream", func(w http.ResponseWriter, r *http.Request) {
			conn, buf, err := w.(http.Hijacker).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			body := "data: " + chunk(`{"role":"assistant","content":"Hel"}`, "") + "\n\n"
			_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
			_, _ = buf.WriteString(strconv.FormatInt(int64(len(body)), 16) + "\r\n" + body + "\r\n")
			_ = buf.Flush()
			_ = conn.Close()
		}, errs.Retryable, 0, "reading the response: unexpected EOF"},
	} {
		for _, fl := range flavours {
			t.Run(tc.name+"/"+fl.name, func(t *testing.T) {
				f := httpfake.New(t, tc.handler)
				p := fl.make(t, f.URL()+"/v1")
				_, err := p.Complete(context.Background(), &provider.Request{
					Messages: []provider.Message{userText("hi")}, OnText: func(string) {},
				})
				pe := asProviderError(t, err)
				if pe.Kind != tc.kind || pe.HTTPStatus != tc.status || pe.Provider != fl.name || pe.Model != "gpt-4o" {
					t.Fatalf("error %+v, want kind %v status %d", pe, tc.kind, tc.status)
				}
				if tc.message != "" && pe.Message != tc.message {
					t.Fatalf("message %q, want %q", pe.Message, tc.message)
				}
				if tc.message == "" && !strings.HasPrefix(pe.Message, "malformed response (HTTP 200): ") {
					t.Fatalf("message %q", pe.Message)
				}
			})
		}
	}
}

func TestCancelMidStream(t *testing.T) {
	for _, fl := range flavours {
		t.Run(fl.name, func(t *testing.T) {
			f := httpfake.New(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, "data: "+chunk(`{"role":"assistant","content":"Hel"}`, "")+"\n\n")
				w.(http.Flusher).Flush()
				<-r.Context().Done() // hold the stream open until the client goes
			})
			p := fl.make(t, f.URL()+"/v1")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var chunks []string
			_, err := p.Complete(ctx, &provider.Request{
				Messages: []provider.Message{userText("hi")},
				OnText:   func(s string) { chunks = append(chunks, s); cancel() },
			})
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("error %v (%T), want context.Canceled", err, err)
			}
			if !reflect.DeepEqual(chunks, []string{"Hel"}) {
				t.Fatalf("chunks %q", chunks)
			}
		})
	}
}

func TestCancelBeforeAnswer(t *testing.T) {
	for _, stream := range []bool{false, true} {
		arrived := make(chan struct{})
		f := httpfake.New(t, func(w http.ResponseWriter, r *http.Request) {
			close(arrived)
			<-r.Context().Done()
		})
		p := flavours[0].make(t, f.URL()+"/v1")
		ctx, cancel := context.WithCancel(context.Background())
		req := &provider.Request{Messages: []provider.Message{userText("hi")}}
		if stream {
			req.OnText = func(string) {}
		}
		go func() {
			<-arrived
			cancel()
		}()
		_, err := p.Complete(ctx, req)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("stream=%v: error %v (%T), want context.Canceled", stream, err, err)
		}
		cancel()
	}
}

func TestDeadline(t *testing.T) {
	f := httpfake.New(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	p := flavours[1].make(t, f.URL()+"/v1")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := p.Complete(ctx, &provider.Request{Messages: []provider.Message{userText("hi")}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v, want context.DeadlineExceeded", err)
	}
}

func TestConnectionRefused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	for _, fl := range flavours {
		for _, stream := range []bool{false, true} {
			p := fl.make(t, "http://"+addr+"/v1")
			req := &provider.Request{Messages: []provider.Message{userText("hi")}}
			if stream {
				req.OnText = func(string) {}
			}
			_, err := p.Complete(context.Background(), req)
			pe := asProviderError(t, err)
			if pe.Kind != errs.Retryable || pe.HTTPStatus != 0 || !provider.Retryable(err) {
				t.Fatalf("%s stream=%v: error %+v, want retryable with no status", fl.name, stream, pe)
			}
			if !strings.Contains(pe.Message, "connection refused") || strings.Contains(pe.Message, addr+"/v1") {
				t.Fatalf("message %q", pe.Message)
			}
		}
	}
}

func TestBodyCutShort(t *testing.T) {
	f := httpfake.New(t, func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{\"id\": \"chatcmpl-1\", \"cho")
		_ = buf.Flush()
		_ = conn.Close()
	})
	p := flavours[0].make(t, f.URL()+"/v1")
	_, err := p.Complete(context.Background(), &provider.Request{Messages: []provider.Message{userText("hi")}})
	pe := asProviderError(t, err)
	if pe.Kind != errs.Retryable || pe.HTTPStatus != 0 || pe.Message != "reading the response: unexpected EOF" {
		t.Fatalf("error %+v", pe)
	}
}

func TestMalformedResponse(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		message string
	}{
		{"truncated JSON", httpfake.JSON(200, `{"id": "chatcmpl-1", "choices": [`), "malformed response (HTTP 200): error parsing response json: unexpected EOF"},
		{"not JSON", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			_, _ = io.WriteString(w, "<html>captive portal</html>")
		}, "malformed response (HTTP 200): expected destination type of 'string' or '[]byte' for responses with content-type 'text/html' that is not 'application/json'"},
		{"no choices", httpfake.JSON(200, `{"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o", "choices": []}`),
			"malformed response: no choices"},
		{"content of the wrong type", httpfake.JSON(200, `{"model": "m", "choices": [{"index": 0, "message": {"content": 42}, "finish_reason": "stop"}]}`),
			"malformed response (HTTP 200): error parsing response json: content is neither a string nor an array of parts: 42"},
		{"usage of the wrong type", httpfake.JSON(200, `{"model": "m", "choices": [{"index": 0, "message": {"content": "hi"}}], "usage": {"prompt_tokens": "ten"}}`),
			"malformed response (HTTP 200): error parsing response json: json: cannot unmarshal string into Go struct field usageFields.usage.prompt_tokens of type int64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := httpfake.New(t, tc.handler)
			p := flavours[0].make(t, f.URL()+"/v1")
			_, err := p.Complete(context.Background(), &provider.Request{Messages: []provider.Message{userText("hi")}})
			pe := asProviderError(t, err)
			if pe.Kind != errs.NonRetryable || pe.HTTPStatus != 0 || pe.Message != tc.message {
				t.Fatalf("error %+v", pe)
			}
		})
	}
}
