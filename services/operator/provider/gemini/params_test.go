package gemini

import (
	"context"
	"testing"

	"github.com/secbear/neuron/internal/httpfake"
	"github.com/secbear/neuron/services/operator/provider"
)

// TestModelParametersOnTheWire: temperature, the thinking level and the
// output schema reach generationConfig.
func TestModelParametersOnTheWire(t *testing.T) {
	f := httpfake.New(t, httpfake.JSON(200, helloResponse))
	p := newProvider(t, f)
	temp := 1.5
	_, err := p.Complete(context.Background(), &provider.Request{
		Messages:        []provider.Message{user(text("Hi there"))},
		MaxTokens:       64,
		Temperature:     &temp,
		ReasoningEffort: provider.EffortMinimal,
		OutputSchema:    map[string]any{"type": "object"},
	})
	if err != nil {
		t.Fatal(err)
	}
	httpfake.AssertJSON(t, "request body", f.Only(t).Body, `{
	  "contents": [{"role": "user", "parts": [{"text": "Hi there"}]}],
	  "generationConfig": {"maxOutputTokens": 64, "temperature": 1.5,
	    "thinkingConfig": {"thinkingLevel": "MINIMAL"},
	    "responseMimeType": "application/json", "responseJsonSchema": {"type": "object"}}
	}`)
}
