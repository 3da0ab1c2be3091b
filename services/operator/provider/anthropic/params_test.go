package anthropic

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/secbear/neuron/internal/httpfake"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// TestModelParametersOnTheWire: temperature, effort and the output schema
// reach the Messages API body (temperature, output_config).
func TestModelParametersOnTheWire(t *testing.T) {
	f := newFakeAPI(t, replyJSON(200, message(`[{"type":"text","text":"hi"}]`, `"end_turn"`, plainUsage)))
	p := newProvider(t, f, Config{})
	temp := 0.5
	_, err := p.Complete(context.Background(), &provider.Request{
		Messages:        []provider.Message{{Role: provider.User, Parts: []provider.Part{{Text: "hi"}}}},
		MaxTokens:       99,
		Temperature:     &temp,
		ReasoningEffort: provider.EffortHigh,
		OutputSchema:    map[string]any{"type": "object"},
	})
	if err != nil {
		t.Fatal(err)
	}
	httpfake.AssertJSON(t, "request body", f.Only(t).Body, `{
	  "model": "`+testModel+`",
	  "max_tokens": 99,
	  "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
	  "temperature": 0.5,
	  "output_config": {"effort": "high", "format": {"type": "json_schema", "schema": {"type": "object"}}}
	}`)
}

// TestModelParametersRefused: what the Messages API cannot take is
// refused before any request, naming the parameter and the provider.
func TestModelParametersRefused(t *testing.T) {
	hot := 1.5
	for _, tc := range []struct {
		name  string
		req   provider.Request
		param string
	}{
		{"temperature above 1", provider.Request{Temperature: &hot}, "temperature"},
		{"minimal effort", provider.Request{ReasoningEffort: provider.EffortMinimal}, "reasoning_effort"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPI(t, replyJSON(200, message(`[{"type":"text","text":"hi"}]`, `"end_turn"`, plainUsage)))
			p := newProvider(t, f, Config{})
			req := tc.req
			req.Messages = []provider.Message{{Role: provider.User, Parts: []provider.Part{{Text: "hi"}}}}
			_, err := p.Complete(context.Background(), &req)
			if !errors.Is(err, errs.InvalidArgument) {
				t.Fatalf("err = %v, want InvalidArgument", err)
			}
			if msg := err.Error(); !strings.Contains(msg, "model parameter "+tc.param) || !strings.Contains(msg, "anthropic") {
				t.Fatalf("err %q does not name the parameter %s and the provider", msg, tc.param)
			}
			if n := len(f.Requests()); n != 0 {
				t.Fatalf("%d requests sent, want none", n)
			}
		})
	}
}
