package openai

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"

	oa "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// ErrorPrefix starts the content of a tool message sent for a tool result
// with IsError set: Chat Completions has no error flag on tool messages.
const ErrorPrefix = "ERROR: "

// params maps a request to the Chat Completions wire format.
func (p *Provider) params(req *provider.Request, model string) (oa.ChatCompletionNewParams, error) {
	var params oa.ChatCompletionNewParams
	if model == "" {
		return params, p.errorf(model, errs.InvalidArgument, "no model: the request names none and no default model is configured")
	}
	params.Model = model
	if req.System != "" {
		params.Messages = append(params.Messages, oa.SystemMessage(req.System))
	}
	for i, m := range req.Messages {
		var msgs []oa.ChatCompletionMessageParamUnion
		var err error
		switch m.Role {
		case provider.User:
			msgs, err = p.userMessages(model, i, m.Parts)
		case provider.Assistant:
			msgs, err = p.assistantMessage(model, i, m.Parts)
		default:
			err = p.errorf(model, errs.InvalidArgument, "message %d: unknown role %d", i, int(m.Role))
		}
		if err != nil {
			return params, err
		}
		params.Messages = append(params.Messages, msgs...)
	}
	if len(params.Messages) == 0 {
		return params, p.errorf(model, errs.InvalidArgument, "the request has no messages")
	}
	for _, t := range req.Tools {
		tool, err := p.tool(model, t)
		if err != nil {
			return params, err
		}
		params.Tools = append(params.Tools, tool)
	}
	maxTokens := req.MaxTokens
	if maxTokens == 0 {
		maxTokens = p.maxTokens
	}
	switch {
	case maxTokens < 0:
		return params, p.errorf(model, errs.InvalidArgument, "max tokens %d is negative", maxTokens)
	case maxTokens == 0:
	case p.compatible:
		// Many compatible servers know only the older field.
		params.MaxTokens = oa.Int(int64(maxTokens))
	default:
		// OpenAI deprecated max_tokens; reasoning models reject it.
		params.MaxCompletionTokens = oa.Int(int64(maxTokens))
	}
	return params, nil
}

// userMessages maps one user message: its tool results become "tool"
// messages, first and in order (they must directly follow the assistant
// message that asked for them); its text and images become one "user"
// message after them.
func (p *Provider) userMessages(model string, i int, parts []provider.Part) ([]oa.ChatCompletionMessageParamUnion, error) {
	var out []oa.ChatCompletionMessageParamUnion
	var content []oa.ChatCompletionContentPartUnionParam
	for j, part := range parts {
		switch {
		case part.ToolUse != nil:
			return nil, p.errorf(model, errs.InvalidArgument, "message %d part %d: a user message cannot hold a tool call", i, j)
		case part.ToolResult != nil:
			r := part.ToolResult
			if r.ToolUseID == "" {
				return nil, p.errorf(model, errs.InvalidArgument, "message %d part %d: tool result without a tool call id", i, j)
			}
			text := r.Content
			if r.IsError {
				text = ErrorPrefix + text
			}
			out = append(out, oa.ToolMessage(text, r.ToolUseID))
		case part.Image != nil:
			u, err := p.imageURL(model, i, j, part.Image)
			if err != nil {
				return nil, err
			}
			content = append(content, oa.ImageContentPart(oa.ChatCompletionContentPartImageImageURLParam{URL: u}))
		default:
			content = append(content, oa.TextContentPart(part.Text))
		}
	}
	switch {
	case len(content) == 0:
	case len(content) == 1 && content[0].OfText != nil:
		out = append(out, oa.UserMessage(content[0].OfText.Text))
	default:
		out = append(out, oa.UserMessage(content))
	}
	if len(out) == 0 {
		return nil, p.errorf(model, errs.InvalidArgument, "message %d: empty user message", i)
	}
	return out, nil
}

// assistantMessage maps one assistant message: text as content (a string
// for one part, text parts for several), tool calls as tool_calls with the
// input as the arguments string.
func (p *Provider) assistantMessage(model string, i int, parts []provider.Part) ([]oa.ChatCompletionMessageParamUnion, error) {
	var texts []string
	var calls []oa.ChatCompletionMessageToolCallUnionParam
	for j, part := range parts {
		switch {
		case part.ToolResult != nil:
			return nil, p.errorf(model, errs.InvalidArgument, "message %d part %d: an assistant message cannot hold a tool result", i, j)
		case part.Image != nil:
			return nil, p.errorf(model, errs.InvalidArgument, "message %d part %d: an assistant message cannot hold an image", i, j)
		case part.ToolUse != nil:
			u := part.ToolUse
			if u.ID == "" || u.Name == "" {
				return nil, p.errorf(model, errs.InvalidArgument, "message %d part %d: tool call without an id or a name", i, j)
			}
			args := string(u.Input)
			if args == "" {
				args = "{}"
			}
			calls = append(calls, oa.ChatCompletionMessageToolCallUnionParam{
				OfFunction: &oa.ChatCompletionMessageFunctionToolCallParam{
					ID:       u.ID,
					Function: oa.ChatCompletionMessageFunctionToolCallFunctionParam{Name: u.Name, Arguments: args},
				},
			})
		default:
			texts = append(texts, part.Text)
		}
	}
	if len(texts) == 0 && len(calls) == 0 {
		return nil, p.errorf(model, errs.InvalidArgument, "message %d: empty assistant message", i)
	}
	var msg oa.ChatCompletionAssistantMessageParam
	switch len(texts) {
	case 0:
	case 1:
		msg.Content.OfString = oa.String(texts[0])
	default:
		for _, t := range texts {
			msg.Content.OfArrayOfContentParts = append(msg.Content.OfArrayOfContentParts,
				oa.ChatCompletionAssistantMessageParamContentArrayOfContentPartUnion{
					OfText: &oa.ChatCompletionContentPartTextParam{Text: t},
				})
		}
	}
	msg.ToolCalls = calls
	return []oa.ChatCompletionMessageParamUnion{{OfAssistant: &msg}}, nil
}

// imageURL is an image's URL, or a data: URL for inline bytes.
func (p *Provider) imageURL(model string, i, j int, img *provider.Image) (string, error) {
	if len(img.Data) == 0 {
		if img.URL == "" {
			return "", p.errorf(model, errs.InvalidArgument, "message %d part %d: image with neither data nor URL", i, j)
		}
		return img.URL, nil
	}
	mt := img.MediaType
	if mt == "" {
		mt = http.DetectContentType(img.Data)
	}
	if !strings.HasPrefix(mt, "image/") {
		return "", p.errorf(model, errs.InvalidArgument, "message %d part %d: inline image has media type %q, want image/*", i, j, mt)
	}
	return "data:" + mt + ";base64," + base64.StdEncoding.EncodeToString(img.Data), nil
}

// tool maps a tool spec to a function tool. An empty schema means no
// parameters.
func (p *Provider) tool(model string, t provider.ToolSpec) (oa.ChatCompletionToolUnionParam, error) {
	if t.Name == "" {
		return oa.ChatCompletionToolUnionParam{}, p.errorf(model, errs.InvalidArgument, "tool without a name")
	}
	def := shared.FunctionDefinitionParam{Name: t.Name}
	if t.Description != "" {
		def.Description = oa.String(t.Description)
	}
	schema := shared.FunctionParameters{"type": "object", "properties": map[string]any{}}
	if len(bytes.TrimSpace(t.InputSchema)) > 0 {
		// Top-level members stay raw JSON, so the schema reaches the wire
		// as written (numbers included), only its top-level keys
		// reordered.
		var raw map[string]json.RawMessage
		if err := json.Unmarshal(t.InputSchema, &raw); err != nil || raw == nil {
			return oa.ChatCompletionToolUnionParam{}, p.errorf(model, errs.InvalidArgument, "tool %q: input schema is not a JSON object", t.Name)
		}
		schema = make(shared.FunctionParameters, len(raw))
		for k, v := range raw {
			schema[k] = v
		}
	}
	def.Parameters = schema
	return oa.ChatCompletionFunctionTool(def), nil
}
