package anthropic

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	sdk "github.com/anthropics/anthropic-sdk-go"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// streamBlock is a content block being assembled from a stream.
type streamBlock struct {
	// typ is the block's type; only "text" and "tool_use" become parts.
	typ  string
	text strings.Builder
	id   string
	name string
	// input is the tool_use input of content_block_start, used when no
	// input_json_delta follows.
	input json.RawMessage
	// partial is the concatenated input_json_delta fragments.
	partial  strings.Builder
	hasDelta bool
}

// assembly is the state of a stream being read.
type assembly struct {
	started bool
	stopped bool
	model   string
	stop    sdk.StopReason
	usage   sdk.Usage
	blocks  []*streamBlock
}

// stream makes a streaming call and assembles its events into a Response,
// passing each text delta to onText as it arrives.
func (p *Provider) stream(ctx context.Context, model string, params sdk.MessageNewParams, onText func(string)) (*provider.Response, error) {
	s := p.client.Messages.NewStreaming(ctx, params)
	defer s.Close()
	var a assembly
	for s.Next() {
		if err := p.event(model, &a, s.Current(), onText); err != nil {
			return nil, err
		}
		if a.stopped {
			break
		}
	}
	if err := s.Err(); err != nil {
		return nil, p.callError(ctx, model, err)
	}
	if err := ctxError(ctx, model); err != nil {
		return nil, err
	}
	switch {
	case !a.started:
		return nil, p.malformed(model, "the stream has no message_start event")
	case !a.stopped:
		return nil, &provider.Error{Provider: Name, Model: model, Kind: errs.Retryable,
			Message: "stream ended before message_stop"}
	}
	return a.response(model), nil
}

// event applies one stream event. ping events never reach it (the SDK
// drops them), and an error event ends the stream with an API error.
func (p *Provider) event(model string, a *assembly, ev sdk.MessageStreamEventUnion, onText func(string)) error {
	if !a.started && ev.Type != "message_start" {
		return p.malformed(model, "stream event %q before message_start", ev.Type)
	}
	switch ev.Type {
	case "message_start":
		if a.started {
			return p.malformed(model, "a second message_start event")
		}
		a.started = true
		a.model = string(ev.Message.Model)
		a.usage = ev.Message.Usage
		a.stop = ev.Message.StopReason
	case "content_block_start":
		b, err := a.block(ev.Index, true)
		if err != nil {
			return p.malformed(model, "%v", err)
		}
		cb := ev.ContentBlock
		b.typ = cb.Type
		switch cb.Type {
		case "text":
			if cb.Text != "" {
				b.text.WriteString(cb.Text)
				onText(cb.Text)
			}
		case "tool_use":
			b.id, b.name = cb.ID, cb.Name
			var raw struct {
				Input json.RawMessage `json:"input"`
			}
			if json.Unmarshal([]byte(cb.RawJSON()), &raw) == nil {
				b.input = raw.Input
			}
		}
	case "content_block_delta":
		b, err := a.block(ev.Index, false)
		if err != nil {
			return p.malformed(model, "%v", err)
		}
		switch ev.Delta.Type {
		case "text_delta":
			if ev.Delta.Text != "" {
				b.text.WriteString(ev.Delta.Text)
				onText(ev.Delta.Text)
			}
		case "input_json_delta":
			if ev.Delta.PartialJSON != "" {
				b.partial.WriteString(ev.Delta.PartialJSON)
				b.hasDelta = true
			}
		}
	case "content_block_stop":
		if _, err := a.block(ev.Index, false); err != nil {
			return p.malformed(model, "%v", err)
		}
	case "message_delta":
		if ev.Delta.StopReason != "" {
			a.stop = ev.Delta.StopReason
		}
		// Usage counts here are cumulative totals for the message: they
		// replace those of message_start. Output tokens are always sent,
		// the others only when they changed.
		u := ev.Usage
		a.usage.OutputTokens = u.OutputTokens
		if u.JSON.InputTokens.Valid() {
			a.usage.InputTokens = u.InputTokens
		}
		if u.JSON.CacheReadInputTokens.Valid() {
			a.usage.CacheReadInputTokens = u.CacheReadInputTokens
		}
		if u.JSON.CacheCreationInputTokens.Valid() {
			a.usage.CacheCreationInputTokens = u.CacheCreationInputTokens
		}
	case "message_stop":
		a.stopped = true
	}
	return nil
}

// block returns the block at index; start says the event opens it, which
// must happen in order and once.
func (a *assembly) block(index int64, start bool) (*streamBlock, error) {
	n := int64(len(a.blocks))
	if start {
		if index != n {
			return nil, fmt.Errorf("content_block_start for index %d, want %d", index, n)
		}
		b := &streamBlock{}
		a.blocks = append(a.blocks, b)
		return b, nil
	}
	if index < 0 || index >= n {
		return nil, fmt.Errorf("event for content block %d, which has not started", index)
	}
	return a.blocks[index], nil
}

// response is the assembled Response.
func (a *assembly) response(model string) *provider.Response {
	resp := &provider.Response{
		Model: a.model,
		Usage: usage(a.usage.InputTokens, a.usage.OutputTokens,
			a.usage.CacheReadInputTokens, a.usage.CacheCreationInputTokens),
	}
	if resp.Model == "" {
		resp.Model = model
	}
	for _, b := range a.blocks {
		switch b.typ {
		case "text":
			if b.text.Len() > 0 {
				resp.Parts = append(resp.Parts, provider.Part{Text: b.text.String()})
			}
		case "tool_use":
			in := b.input
			if b.hasDelta {
				in = json.RawMessage(b.partial.String())
			}
			resp.Parts = append(resp.Parts, provider.Part{ToolUse: &provider.ToolUse{
				ID: b.id, Name: b.name, Input: toolInput(in),
			}})
		}
	}
	resp.Stop = stopReason(a.stop, resp)
	return resp
}
