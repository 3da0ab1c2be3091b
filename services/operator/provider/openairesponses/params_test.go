package openairesponses

import (
	"context"
	"testing"

	"github.com/secbear/neuron/internal/httpfake"
	"github.com/secbear/neuron/services/operator/provider"
)

// TestModelParametersOnTheWire: temperature, reasoning effort and the
// output schema reach the Responses body (temperature, reasoning.effort,
// text.format).
func TestModelParametersOnTheWire(t *testing.T) {
	f := newFakeAPI(t, httpfake.JSON(200, textResponse("resp_1", "hi")))
	p := newTestProvider(t, f)
	temp := 0.4
	_, err := p.Complete(context.Background(), &provider.Request{
		Messages:        []provider.Message{userText("Say hello.")},
		MaxTokens:       33,
		Temperature:     &temp,
		ReasoningEffort: provider.EffortMedium,
		OutputSchema:    map[string]any{"type": "object"},
	})
	if err != nil {
		t.Fatal(err)
	}
	httpfake.AssertJSON(t, "body", f.Nth(t, 0).Body, `{
		"model": "gpt-4.1",
		"input": [{"type":"message","role":"user","content":[{"type":"input_text","text":"Say hello."}]}],
		"max_output_tokens": 33,
		"temperature": 0.4,
		"reasoning": {"effort": "medium"},
		"text": {"format": {"type": "json_schema", "name": "output", "schema": {"type": "object"}}},
		"store": false
	}`)
}
