package anthropic

import (
	"encoding/json"
	"net/http"

	"sync"
	"testing"

	"github.com/secbear/neuron/internal/httpfake"
)

const (
	testKey   = "sk-ant-test-0123456789"
	testModel = "claude-sonnet-4-5"
	// answerModel is the dated model the fake API says answered.
	answerModel = "claude-sonnet-4-5-20250929"
)

// requestID is the request-id header the fake API answers with.
const requestID = "req_011CSHoEeqs5C35K2UUqR7Fy"

// newFakeAPI is a local Messages API answering with handle; every request
// body must be a JSON object.
func newFakeAPI(t *testing.T, handle http.HandlerFunc) *httpfake.Server {
	t.Helper()
	return httpfake.New(t, httpfake.RequireJSON(t, handle))
}

// newProvider returns a Provider talking to f.
func newProvider(t *testing.T, f *httpfake.Server, cfg Config) *Provider {
	t.Helper()
	if cfg.APIKey == "" {
		cfg.APIKey = testKey
	}
	if cfg.BaseURL == "" {
		cfg.BaseURL = f.URL()
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

// replyJSON answers with a JSON body and the API's request-id; headers
// are name, value pairs.
func replyJSON(status int, body string, headers ...string) http.HandlerFunc {
	return httpfake.JSON(status, body, append([]string{"request-id", requestID}, headers...)...)
}

// replySSE answers with a stream of events (httpfake.Event frames),
// flushing after each.
func replySSE(events ...string) http.HandlerFunc {
	return httpfake.WithHeaders(httpfake.SSE(events...), "request-id", requestID)
}

// message is a non-streaming Messages API response body.
func message(content, stopReason, usage string) string {
	return `{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant",` +
		`"model":"` + answerModel + `","content":` + content + `,` +
		`"stop_reason":` + stopReason + `,"stop_sequence":null,"usage":` + usage + `}`
}

const plainUsage = `{"input_tokens":12,"output_tokens":6,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"service_tier":"standard"}`

// ssePlainText is a complete stream answering "Hello!".
func ssePlainText(stopReason string) []string {
	return []string{
		httpfake.Event("message_start", `{"type":"message_start","message":{"id":"msg_01","type":"message","role":"assistant","content":[],"model":"`+answerModel+`","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1,"service_tier":"standard"}}}`),
		httpfake.Event("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`),
		httpfake.Event("ping", `{"type": "ping"}`),
		httpfake.Event("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}`),
		httpfake.Event("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"!"}}`),
		httpfake.Event("content_block_stop", `{"type":"content_block_stop","index":0}`),
		httpfake.Event("message_delta", `{"type":"message_delta","delta":{"stop_reason":`+stopReason+`,"stop_sequence":null},"usage":{"output_tokens":15}}`),
		httpfake.Event("message_stop", `{"type":"message_stop"}`),
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
		"request_id": requestID,
	})
	if err != nil {
		panic(err)
	}
	return string(b)
}
