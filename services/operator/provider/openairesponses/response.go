package openairesponses

import (
	"encoding/json"
	"strings"

	"github.com/openai/openai-go/v3/responses"

	"github.com/secbear/neuron/services/operator/provider"
)

// outItem is one output item as this package uses it, assembled either
// from a complete response or from stream events.
type outItem struct {
	// kind is the item type: "message", "function_call", or another type,
	// which is ignored (reasoning, built-in tool calls).
	kind string
	// texts are a message's parts in order: output_text, or the refusal
	// message of a refusal part.
	texts   []string
	refusal bool
	// callID, name and args describe a function call; args are the raw
	// arguments string.
	callID, name string
	args         string
}

// itemFromAPI converts an output item of the API.
func itemFromAPI(it responses.ResponseOutputItemUnion) outItem {
	o := outItem{kind: it.Type}
	switch it.Type {
	case "message":
		for _, c := range it.Content {
			switch c.Type {
			case "output_text":
				o.texts = append(o.texts, c.Text)
			case "refusal":
				o.refusal = true
				o.texts = append(o.texts, c.Refusal)
			}
		}
	case "function_call":
		o.callID, o.name = it.CallID, it.Name
		o.args = it.Arguments.OfString
		// The API sends the arguments as a JSON string; a server that
		// sends them as a JSON value has them passed on as that value.
		if raw := strings.TrimSpace(it.JSON.Arguments.Raw()); raw != "" && raw != "null" && raw[0] != '"' {
			o.args = raw
		}
	}
	return o
}

// result is a converted response plus what chaining needs.
type result struct {
	resp *provider.Response
	// id is the API's response id.
	id string
}

// finish builds the provider response from the parts of an API response.
func finish(status responses.ResponseStatus, incomplete string, model string, usage responses.ResponseUsage, items []outItem) *provider.Response {
	r := &provider.Response{Model: model, Usage: mapUsage(usage)}
	var calls, refused bool
	for _, it := range items {
		switch it.kind {
		case "message":
			for _, t := range it.texts {
				if t != "" {
					r.Parts = append(r.Parts, provider.Part{Text: t})
				}
			}
			refused = refused || it.refusal
		case "function_call":
			calls = true
			r.Parts = append(r.Parts, provider.Part{ToolUse: &provider.ToolUse{
				ID:    it.callID,
				Name:  it.name,
				Input: json.RawMessage(it.args),
			}})
		}
	}
	switch {
	case status == responses.ResponseStatusIncomplete && incomplete == "content_filter":
		r.Stop = provider.StopContentFilter
	case status == responses.ResponseStatusIncomplete:
		// max_output_tokens, and reasons this package does not know: the
		// output was cut short either way.
		r.Stop = provider.StopMaxTokens
	case refused:
		r.Stop = provider.StopContentFilter
	case calls:
		r.Stop = provider.StopToolUse
	default:
		r.Stop = provider.StopEndTurn
	}
	return r
}

// mapUsage maps the API's usage. The API's input_tokens include cached
// tokens (cached_tokens, read from the prompt cache) and cache writes
// (cache_write_tokens); InputTokens is what remains, so the three fields
// add up to input_tokens. output_tokens include reasoning tokens.
func mapUsage(u responses.ResponseUsage) provider.Usage {
	d := u.InputTokensDetails
	return provider.UsageFromTotals(u.InputTokens, d.CachedTokens, d.CacheWriteTokens, u.OutputTokens)
}
