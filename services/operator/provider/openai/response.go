package openai

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/openai/openai-go/v3/packages/ssestream"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// The response side of the wire format: only what is mapped is decoded,
// with encoding/json. One type serves a completion and a streamed chunk
// (whose choices carry a delta instead of a message).
type chatCompletion struct {
	Model   string       `json:"model"`
	Choices []choice     `json:"choices"`
	Usage   *usageFields `json:"usage"`
}

type choice struct {
	Index        int64           `json:"index"`
	Message      responseMessage `json:"message"`
	Delta        responseMessage `json:"delta"`
	FinishReason string          `json:"finish_reason"`
}

type responseMessage struct {
	Content      contentText        `json:"content"`
	Refusal      string             `json:"refusal"`
	ToolCalls    []responseToolCall `json:"tool_calls"`
	FunctionCall functionCall       `json:"function_call"`
}

type responseToolCall struct {
	Index    int64        `json:"index"`
	ID       string       `json:"id"`
	Function functionCall `json:"function"`
}

type usageFields struct {
	PromptTokens        int64 `json:"prompt_tokens"`
	CompletionTokens    int64 `json:"completion_tokens"`
	PromptTokensDetails struct {
		CachedTokens     int64 `json:"cached_tokens"`
		CacheWriteTokens int64 `json:"cache_write_tokens"`
	} `json:"prompt_tokens_details"`
}

// contentText is a message's content: a string, null, or (from some compatible
// servers) an array of content parts, whose text parts are joined.
type contentText string

func (t *contentText) UnmarshalJSON(b []byte) error {
	switch {
	case len(b) > 0 && b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*t = contentText(s)
	case len(b) > 0 && b[0] == '[':
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if err := json.Unmarshal(b, &parts); err != nil {
			return err
		}
		var sb strings.Builder
		for _, p := range parts {
			if p.Type == "text" {
				sb.WriteString(p.Text)
			}
		}
		*t = contentText(sb.String())
	case string(b) == "null":
	default:
		return fmt.Errorf("content is neither a string nor an array of parts: %.40s", b)
	}
	return nil
}

// fromCompletion maps a non-streaming response.
func (p *Provider) fromCompletion(model string, res *chatCompletion) (*provider.Response, error) {
	var ch *choice
	for i := range res.Choices {
		if res.Choices[i].Index == 0 {
			ch = &res.Choices[i]
			break
		}
	}
	if ch == nil {
		return nil, p.errorf(model, errs.NonRetryable, "malformed response: no choices")
	}
	msg := &ch.Message
	var a assembly
	a.text.WriteString(string(msg.Content))
	a.refusal.WriteString(msg.Refusal)
	for _, tc := range msg.ToolCalls {
		c := a.add(tc.ID)
		c.name = tc.Function.Name
		c.args.WriteString(tc.Function.Arguments)
	}
	if len(msg.ToolCalls) == 0 && msg.FunctionCall.Name != "" {
		// The legacy single function_call.
		c := a.add("")
		c.name = msg.FunctionCall.Name
		c.args.WriteString(msg.FunctionCall.Arguments)
	}
	a.finish = ch.FinishReason
	a.usage = res.Usage
	a.model = res.Model
	return a.response(model), nil
}

// stream makes a streaming call and assembles its chunks.
func (p *Provider) stream(ctx context.Context, model string, params *chatRequest, onText func(string)) (*provider.Response, error) {
	params.Stream = true
	params.StreamOptions = &streamOptions{IncludeUsage: true}
	body, err := p.encode(model, params)
	if err != nil {
		return nil, err
	}
	var call callRecorder
	var raw *http.Response
	err = p.client.Post(ctx, "chat/completions", body, &raw, call.option())
	s := ssestream.NewStream[chatCompletion](ssestream.NewDecoder(raw), err)
	defer s.Close()
	var a assembly
	finished := false
	for s.Next() {
		chunk := s.Current()
		if chunk.Model != "" {
			a.model = chunk.Model
		}
		if chunk.Usage != nil {
			a.usage = chunk.Usage
		}
		for _, ch := range chunk.Choices {
			if ch.Index != 0 {
				continue
			}
			d := ch.Delta
			if d.Content != "" {
				a.text.WriteString(string(d.Content))
				onText(string(d.Content))
			}
			if d.Refusal != "" {
				a.refusal.WriteString(d.Refusal)
				onText(d.Refusal)
			}
			for _, tc := range d.ToolCalls {
				c := a.fragment(tc.Index, tc.ID)
				if tc.Function.Name != "" {
					c.name = tc.Function.Name
				}
				c.args.WriteString(tc.Function.Arguments)
			}
			if d.FunctionCall.Name != "" || d.FunctionCall.Arguments != "" {
				c := a.fragment(-1, "")
				if d.FunctionCall.Name != "" {
					c.name = d.FunctionCall.Name
				}
				c.args.WriteString(d.FunctionCall.Arguments)
			}
			if ch.FinishReason != "" {
				a.finish = ch.FinishReason
				finished = true
			}
		}
	}
	if err := s.Err(); err != nil {
		return nil, p.streamError(ctx, model, err, &call)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if !finished {
		// The stream ended (with or without [DONE]) before any finish
		// reason: the answer is incomplete.
		return nil, p.errorf(model, errs.Retryable, "the stream ended before the response was complete")
	}
	return a.response(model), nil
}

// streamError maps a streaming failure: an error event inside the stream,
// or any failure of the call itself.
func (p *Provider) streamError(ctx context.Context, model string, err error, call *callRecorder) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	se, ok := err.(*ssestream.StreamError)
	if !ok {
		return p.callError(ctx, model, err, call)
	}
	// data: {"error": {"message": ..., "type": ..., "code": ...}}
	var ev struct {
		Error json.RawMessage `json:"error"`
	}
	_ = json.Unmarshal(se.Event.Data, &ev)
	var body struct {
		Message string          `json:"message"`
		Code    json.RawMessage `json:"code"`
	}
	msg := string(ev.Error)
	if json.Unmarshal(ev.Error, &body) == nil && body.Message != "" {
		msg = body.Message
	} else if s := ""; json.Unmarshal(ev.Error, &s) == nil && s != "" {
		msg = s
	}
	// Some compatible servers put the HTTP status they would have sent in
	// "code"; a 4xx there will not go away on retry.
	var status int
	if json.Unmarshal(body.Code, &status) == nil && status >= 400 && status < 600 {
		return p.errorf(model, provider.KindForHTTP(status), "error event in the stream (code %d): %s", status, p.scrub(msg))
	}
	return p.errorf(model, errs.Retryable, "error event in the stream: %s", p.scrub(msg))
}

// assembly collects a response's text, refusal and tool calls.
type assembly struct {
	text    strings.Builder
	refusal strings.Builder
	calls   []*callAssembly
	// byIndex maps a streamed tool call index to its entry in calls.
	byIndex map[int64]*callAssembly
	finish  string
	usage   *usageFields
	model   string
}

type callAssembly struct {
	id   string
	name string
	args strings.Builder
}

func (a *assembly) add(id string) *callAssembly {
	c := &callAssembly{id: id}
	a.calls = append(a.calls, c)
	return c
}

// fragment returns the call a streamed fragment belongs to: by index,
// unless the fragment carries a different id (some servers number every
// call 0), in which case it starts a new call.
func (a *assembly) fragment(index int64, id string) *callAssembly {
	if a.byIndex == nil {
		a.byIndex = map[int64]*callAssembly{}
	}
	c, ok := a.byIndex[index]
	if !ok || (id != "" && c.id != "" && id != c.id) {
		c = a.add(id)
		a.byIndex[index] = c
	}
	if c.id == "" {
		c.id = id
	}
	return c
}

func (a *assembly) response(model string) *provider.Response {
	r := &provider.Response{Model: a.model}
	if r.Model == "" {
		r.Model = model
	}
	if a.text.Len() > 0 {
		r.Parts = append(r.Parts, provider.Part{Text: a.text.String()})
	}
	if a.refusal.Len() > 0 {
		r.Parts = append(r.Parts, provider.Part{Text: a.refusal.String()})
	}
	for i, c := range a.calls {
		id := c.id
		if id == "" {
			id = fmt.Sprintf("call_%d", i)
		}
		args := c.args.String()
		if args == "" {
			args = "{}"
		}
		r.Parts = append(r.Parts, provider.Part{ToolUse: &provider.ToolUse{
			ID: id, Name: c.name, Input: json.RawMessage(args),
		}})
	}
	r.Stop = stopReason(a.finish, a.refusal.Len() > 0, len(a.calls) > 0)
	r.Usage = usage(a.usage)
	return r
}

// stopReason maps finish_reason. A refusal is a content filter whatever
// the reason; tool calls with "stop" or no reason (some compatible
// servers) are a tool use.
func stopReason(finish string, refused, calls bool) provider.StopReason {
	if refused {
		return provider.StopContentFilter
	}
	switch finish {
	case "tool_calls", "function_call":
		return provider.StopToolUse
	case "length":
		return provider.StopMaxTokens
	case "content_filter":
		return provider.StopContentFilter
	}
	if calls {
		return provider.StopToolUse
	}
	return provider.StopEndTurn
}

// usage maps the API's usage. OpenAI's prompt_tokens counts every input
// token, cached or not; Usage keeps the three kinds apart so that each is
// priced once: CacheReadTokens = prompt_tokens_details.cached_tokens,
// CacheWriteTokens = prompt_tokens_details.cache_write_tokens, and
// InputTokens = prompt_tokens minus both (never below 0).
func usage(u *usageFields) provider.Usage {
	if u == nil {
		return provider.Usage{}
	}
	d := u.PromptTokensDetails
	return provider.UsageFromTotals(u.PromptTokens, d.CachedTokens, d.CacheWriteTokens, u.CompletionTokens)
}
