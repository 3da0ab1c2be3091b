package openai

import (
	"context"
	"testing"

	"github.com/secbear/neuron/internal/httpfake"
	"github.com/secbear/neuron/services/operator/provider"
)

// TestModelParametersOnTheWire: temperature, reasoning effort and the
// output schema reach the Chat Completions body as the API names them.
func TestModelParametersOnTheWire(t *testing.T) {
	f := httpfake.New(t, httpfake.JSON(200, okBody))
	p, err := New(Config{APIKey: testKey, BaseURL: f.URL() + "/v1"})
	if err != nil {
		t.Fatal(err)
	}
	temp := 0.25
	_, err = p.Complete(context.Background(), &provider.Request{
		Model:           "gpt-4.1",
		Messages:        []provider.Message{userText("hi")},
		MaxTokens:       77,
		Temperature:     &temp,
		ReasoningEffort: provider.EffortLow,
		OutputSchema:    map[string]any{"type": "object", "properties": map[string]any{"answer": map[string]any{"type": "string"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	httpfake.AssertJSON(t, "request body", f.Only(t).Body, `{
	  "model": "gpt-4.1",
	  "messages": [{"role": "user", "content": "hi"}],
	  "max_completion_tokens": 77,
	  "temperature": 0.25,
	  "reasoning_effort": "low",
	  "response_format": {"type": "json_schema", "json_schema": {"name": "output",
	    "schema": {"type": "object", "properties": {"answer": {"type": "string"}}}}}
	}`)
}
