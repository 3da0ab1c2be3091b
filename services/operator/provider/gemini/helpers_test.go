package gemini

import (
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

// testKey is the API key the tests configure; no error may show it.
const testKey = "AIzaSyTEST-key-0123456789abcdef"

// testModel is the default model of the tests' providers.
const testModel = "gemini-2.5-flash"

// newProvider returns a provider talking to f with the test key.
func newProvider(t *testing.T, f *httpfake.Server) *Provider {
	t.Helper()
	p, err := New(Config{APIKey: testKey, BaseURL: f.URL(), DefaultModel: testModel})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p
}

// sseReply answers a streamGenerateContent request as the API does: one
// "data: <GenerateContentResponse>" event per chunk, separated by CRLFs.
func sseReply(chunks ...string) http.HandlerFunc {
	frames := make([]string, len(chunks))
	for i, c := range chunks {
		frames[i] = "data: " + c + "\r\n\r\n"
	}
	return httpfake.SSE(frames...)
}

// assertGenerate checks the method, path, query and auth of a request.
func assertGenerate(t *testing.T, c httpfake.Request, model string, stream bool) {
	t.Helper()
	method, query := "generateContent", ""
	if stream {
		method, query = "streamGenerateContent", "alt=sse"
	}
	if c.Method != http.MethodPost || c.Path != "/v1beta/models/"+model+":"+method || c.RawQuery != query {
		t.Fatalf("request %s %s?%s, want POST /v1beta/models/%s:%s?%s", c.Method, c.Path, c.RawQuery, model, method, query)
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
