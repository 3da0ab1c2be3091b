package gemini

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// testKey is the API key the tests configure; no error may show it.
const testKey = "AIzaSyTEST-key-0123456789abcdef"

// testModel is the default model of the tests' providers.
const testModel = "gemini-2.5-flash"

// call is one HTTP request the fake API received.
type call struct {
	Method string
	Path   string
	Query  string
	Header http.Header
	Body   []byte
}

// fake is a local Gemini API: it records each request and answers with
// its handler.
type fake struct {
	srv   *httptest.Server
	mu    sync.Mutex
	calls []call
}

func newFake(t *testing.T, h http.HandlerFunc) *fake {
	t.Helper()
	f := &fake{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.calls = append(f.calls, call{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Clone(), body})
		f.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		h(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fake) recorded() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]call(nil), f.calls...)
}

// only returns the single request received, failing unless there was
// exactly one.
func (f *fake) only(t *testing.T) call {
	t.Helper()
	c := f.recorded()
	if len(c) != 1 {
		t.Fatalf("the API got %d requests, want 1", len(c))
	}
	return c[0]
}

// newProvider returns a provider talking to f with the test key.
func newProvider(t *testing.T, f *fake) *Provider {
	t.Helper()
	p, err := New(Config{APIKey: testKey, BaseURL: f.srv.URL, DefaultModel: testModel})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p
}

// jsonReply answers with status and a JSON body.
func jsonReply(status int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json; charset=UTF-8")
		w.WriteHeader(status)
		io.WriteString(w, body)
	}
}

// sseReply answers a streamGenerateContent request as the API does: one
// "data: <GenerateContentResponse>" event per chunk, separated by CRLFs.
func sseReply(chunks ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, c := range chunks {
			io.WriteString(w, "data: "+c+"\r\n\r\n")
			w.(http.Flusher).Flush()
		}
	}
}

// assertJSON compares a request body with the expected JSON, as values.
func assertJSON(t *testing.T, got []byte, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("request body is not JSON: %v\n%s", err, got)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("bad expected JSON: %v", err)
	}
	if !reflect.DeepEqual(g, w) {
		gi, _ := json.MarshalIndent(g, "", "  ")
		wi, _ := json.MarshalIndent(w, "", "  ")
		t.Fatalf("request body:\n%s\nwant:\n%s", gi, wi)
	}
}

// assertGenerate checks the method, path, query and auth of a request.
func assertGenerate(t *testing.T, c call, model string, stream bool) {
	t.Helper()
	method, query := "generateContent", ""
	if stream {
		method, query = "streamGenerateContent", "alt=sse"
	}
	if c.Method != http.MethodPost || c.Path != "/v1beta/models/"+model+":"+method || c.Query != query {
		t.Fatalf("request %s %s?%s, want POST /v1beta/models/%s:%s?%s", c.Method, c.Path, c.Query, model, method, query)
	}
	if got := c.Header.Get("X-Goog-Api-Key"); got != testKey {
		t.Fatalf("x-goog-api-key %q, want the test key", got)
	}
	if got := c.Header.Get("Content-Type"); got != "application/json" {
		t.Fatalf("content-type %q", got)
	}
}

// providerError asserts err is a *provider.Error and returns it.
func providerError(t *testing.T, err error) *provider.Error {
	t.Helper()
	if err == nil {
		t.Fatal("no error")
	}
	var pe *provider.Error
	if !errors.As(err, &pe) {
		t.Fatalf("error %T %v is not a *provider.Error", err, err)
	}
	if strings.Contains(err.Error(), testKey) {
		t.Fatalf("error shows the API key: %v", err)
	}
	if pe.Provider != Name {
		t.Fatalf("error provider %q", pe.Provider)
	}
	if !errors.Is(err, pe.Kind) {
		t.Fatalf("error does not wrap its kind")
	}
	return pe
}

func kindName(k *errs.Kind) string {
	if k == nil {
		return "<nil>"
	}
	return k.Error()
}

func text(s string) provider.Part { return provider.Part{Text: s} }

func toolUse(id, name, input string) provider.Part {
	return provider.Part{ToolUse: &provider.ToolUse{ID: id, Name: name, Input: json.RawMessage(input)}}
}

func toolResult(id, content string, isErr bool) provider.Part {
	return provider.Part{ToolResult: &provider.ToolResult{ToolUseID: id, Content: content, IsError: isErr}}
}

func user(parts ...provider.Part) provider.Message {
	return provider.Message{Role: provider.User, Parts: parts}
}

func assistant(parts ...provider.Part) provider.Message {
	return provider.Message{Role: provider.Assistant, Parts: parts}
}

// assertParts compares response parts, tool inputs as exact bytes.
func assertParts(t *testing.T, got []provider.Part, want ...provider.Part) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d parts %s, want %d %s", len(got), describe(got), len(want), describe(want))
	}
	for i := range got {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Fatalf("part %d: got %s, want %s", i, describe(got[i:i+1]), describe(want[i:i+1]))
		}
	}
}

func describe(parts []provider.Part) string {
	var b strings.Builder
	for _, p := range parts {
		switch {
		case p.ToolUse != nil:
			b.WriteString("[tool_use " + p.ToolUse.ID + " " + p.ToolUse.Name + " " + string(p.ToolUse.Input) + "]")
		default:
			b.WriteString("[text " + p.Text + "]")
		}
	}
	return b.String()
}
