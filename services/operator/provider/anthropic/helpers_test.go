package anthropic

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"

	"sync"
	"testing"
)

const (
	testKey   = "sk-ant-test-0123456789"
	testModel = "claude-sonnet-4-5"
	// answerModel is the dated model the fake API says answered.
	answerModel = "claude-sonnet-4-5-20250929"
)

// call is one request the fake API received.
type call struct {
	Method string
	Path   string
	Header http.Header
	Body   map[string]any
}

// fakeAPI is a local Messages API: it records each request and answers
// with handle.
type fakeAPI struct {
	t      *testing.T
	srv    *httptest.Server
	handle http.HandlerFunc

	mu    sync.Mutex
	calls []call
}

func newFakeAPI(t *testing.T, handle http.HandlerFunc) *fakeAPI {
	t.Helper()
	f := &fakeAPI{t: t, handle: handle}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("reading request body: %v", err)
		}
		c := call{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone()}
		if len(raw) > 0 {
			if err := json.Unmarshal(raw, &c.Body); err != nil {
				t.Errorf("request body is not a JSON object: %v: %s", err, raw)
			}
		}
		f.mu.Lock()
		f.calls = append(f.calls, c)
		f.mu.Unlock()
		f.handle(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// Calls returns the requests received so far.
func (f *fakeAPI) Calls() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]call(nil), f.calls...)
}

// only returns the one request received, failing unless there is exactly one.
func (f *fakeAPI) only() call {
	f.t.Helper()
	calls := f.Calls()
	if len(calls) != 1 {
		f.t.Fatalf("the API received %d requests, want 1", len(calls))
	}
	return calls[0]
}

// newProvider returns a Provider talking to f.
func newProvider(t *testing.T, f *fakeAPI, cfg Config) *Provider {
	t.Helper()
	if cfg.APIKey == "" {
		cfg.APIKey = testKey
	}
	if cfg.BaseURL == "" {
		cfg.BaseURL = f.srv.URL
	}
	if cfg.DefaultModel == "" {
		cfg.DefaultModel = testModel
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p
}

// replyJSON answers with a JSON body.
func replyJSON(status int, body string, headers ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i+1 < len(headers); i += 2 {
			w.Header().Set(headers[i], headers[i+1])
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("request-id", "req_011CSHoEeqs5C35K2UUqR7Fy")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

// sse is one server-sent event.
type sse struct{ event, data string }

func (e sse) String() string { return fmt.Sprintf("event: %s\ndata: %s\n\n", e.event, e.data) }

// replySSE answers with an event stream, flushing after each event.
func replySSE(events ...sse) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		w.Header().Set("Cache-Control", "no-cache")
		w.Header().Set("request-id", "req_011CSHoEeqs5C35K2UUqR7Fy")
		w.WriteHeader(http.StatusOK)
		for _, e := range events {
			_, _ = io.WriteString(w, e.String())
			w.(http.Flusher).Flush()
		}
	}
}

// message is a non-streaming Messages API response body.
func message(content, stopReason, usage string) string {
	return `{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant",` +
		`"model":"` + answerModel + `","content":` + content + `,` +
		`"stop_reason":` + stopReason + `,"stop_sequence":null,"usage":` + usage + `}`
}

const plainUsage = `{"input_tokens":12,"output_tokens":6,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"service_tier":"standard"}`

// assertJSON compares got (decoded JSON) with the JSON text want.
func assertJSON(t *testing.T, what string, got any, want string) {
	t.Helper()
	var w any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("%s: bad want JSON: %v", what, err)
	}
	if !reflect.DeepEqual(normalize(got), w) {
		g, _ := json.MarshalIndent(got, "", "  ")
		ww, _ := json.MarshalIndent(w, "", "  ")
		t.Errorf("%s:\ngot  %s\nwant %s", what, g, ww)
	}
}

// normalize round-trips v through JSON so it compares with decoded JSON.
func normalize(v any) any {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		panic(err)
	}
	return out
}

// ssePlainText is a complete stream answering "Hello!".
func ssePlainText(stopReason string) []sse {
	return []sse{
		{"message_start", `{"type":"message_start","message":{"id":"msg_01","type":"message","role":"assistant","content":[],"model":"` + answerModel + `","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1,"service_tier":"standard"}}}`},
		{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`},
		{"ping", `{"type": "ping"}`},
		{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}`},
		{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"!"}}`},
		{"content_block_stop", `{"type":"content_block_stop","index":0}`},
		{"message_delta", `{"type":"message_delta","delta":{"stop_reason":` + stopReason + `,"stop_sequence":null},"usage":{"output_tokens":15}}`},
		{"message_stop", `{"type":"message_stop"}`},
	}
}

// textCollector collects OnText chunks.
type textCollector struct {
	mu     sync.Mutex
	chunks []string
}

func (c *textCollector) on(s string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.chunks = append(c.chunks, s)
}

func (c *textCollector) got() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.chunks...)
}

// errorBody is the API's error body.
func errorBody(typ, msg string) string {
	b, err := json.Marshal(map[string]any{
		"type":       "error",
		"error":      map[string]string{"type": typ, "message": msg},
		"request_id": "req_011CSHoEeqs5C35K2UUqR7Fy",
	})
	if err != nil {
		panic(err)
	}
	return string(b)
}
