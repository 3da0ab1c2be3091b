package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/secbear/neuron/internal/httpfake"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// wireTools is the "tools" of the body WireRequest returns for tools.
func wireTools(t *testing.T, p *Provider, tools []provider.ToolSpec) string {
	t.Helper()
	b, err := p.WireRequest(&provider.Request{Model: "m", Messages: []provider.Message{userText("hi")}, Tools: tools})
	if err != nil {
		t.Fatal(err)
	}
	var body map[string]json.RawMessage
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatalf("body is not JSON: %v\n%s", err, b)
	}
	return string(body["tools"])
}

// The tools of a tool set are encoded once and sent as encoded; a set
// whose content differs in any way (even the same slice, changed in
// place) is another set; a set that cannot be sent fails every time.
func TestToolSetCache(t *testing.T) {
	p, err := NewCompatible(Config{BaseURL: "http://127.0.0.1:1/v1"})
	if err != nil {
		t.Fatal(err)
	}
	tools := []provider.ToolSpec{
		{Name: "read", Description: "Read a file.", InputSchema: json.RawMessage(` {"type":"object","properties":{"path":{"type":"string"}}} `)},
		{Name: "now"},
	}
	want := `[{"type":"function","function":{"name":"read","description":"Read a file.","parameters":{"type":"object","properties":{"path":{"type":"string"}}}}},
		{"type":"function","function":{"name":"now","parameters":{"type":"object","properties":{}}}}]`
	for range 3 {
		httpfake.AssertJSON(t, "tools", []byte(wireTools(t, p, tools)), want)
	}
	if p.tools.n != 1 {
		t.Errorf("%d tool sets kept, want 1", p.tools.n)
	}

	copy(tools[0].InputSchema[9:], `"array" `) // "object" -> "array" (same length)
	tools[1].Description = "The time."
	got := wireTools(t, p, tools)
	want2 := `[{"type":"function","function":{"name":"read","description":"Read a file.","parameters":{"type":"array" ,"properties":{"path":{"type":"string"}}}}},
		{"type":"function","function":{"name":"now","description":"The time.","parameters":{"type":"object","properties":{}}}}]`
	httpfake.AssertJSON(t, "tools after a change in place", []byte(got), want2)

	bad := []provider.ToolSpec{{Name: "x", InputSchema: json.RawMessage(`[1]`)}}
	for range 2 {
		if _, err := p.WireRequest(&provider.Request{Model: "m", Messages: []provider.Message{userText("hi")}, Tools: bad}); !errors.Is(err, errs.InvalidArgument) {
			t.Fatalf("bad schema: %v", err)
		}
	}

	// Past maxToolSets, sets are still sent right, only not kept.
	for i := range maxToolSets + 5 {
		name := fmt.Sprintf("t%d", i)
		got := wireTools(t, p, []provider.ToolSpec{{Name: name}})
		httpfake.AssertJSON(t, name, []byte(got), `[{"type":"function","function":{"name":"`+name+`","parameters":{"type":"object","properties":{}}}}]`)
	}
	if p.tools.n != maxToolSets {
		t.Errorf("%d tool sets kept, want %d", p.tools.n, maxToolSets)
	}
	// No tools: no "tools" key.
	if got := wireTools(t, p, nil); got != "" {
		t.Errorf("tools %s for none", got)
	}
}
