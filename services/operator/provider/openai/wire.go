package openai

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// ErrorPrefix starts the content of a tool message sent for a tool result
// with IsError set: Chat Completions has no error flag on tool messages.
const ErrorPrefix = "ERROR: "

// The request body, in the Chat Completions wire format. These are plain
// structs for encoding/json rather than the SDK's param types: the SDK's
// reflective encoder (and its decoder on the way back) cost about a fifth
// of the CPU of a model call against a fast server, while the SDK still
// does everything else (base URL, auth, headers, error bodies, SSE).
type chatRequest struct {
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	MaxTokens           int             `json:"max_tokens,omitempty"`
	MaxCompletionTokens int             `json:"max_completion_tokens,omitempty"`
	Temperature         *float64        `json:"temperature,omitempty"`
	ReasoningEffort     string          `json:"reasoning_effort,omitempty"`
	ResponseFormat      *responseFormat `json:"response_format,omitempty"`
	Stream              bool            `json:"stream,omitempty"`
	StreamOptions       *streamOptions  `json:"stream_options,omitempty"`
	// tools is the "tools" array, already encoded (toolsJSON); encode
	// adds it to the body.
	tools []byte
}

// responseFormat asks for structured output: a JSON Schema the answer
// conforms to.
type responseFormat struct {
	Type       string     `json:"type"`
	JSONSchema jsonSchema `json:"json_schema"`
}

type jsonSchema struct {
	Name   string         `json:"name"`
	Schema map[string]any `json:"schema"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// chatMessage is one message. Content is a string or a []contentPart;
// nil leaves it out (an assistant message with only tool calls).
type chatMessage struct {
	Role       string         `json:"role"`
	Content    any            `json:"content,omitempty"`
	ToolCalls  []chatToolCall `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
}

type contentPart struct {
	Type     string    `json:"type"`
	Text     *string   `json:"text,omitempty"`
	ImageURL *imageURL `json:"image_url,omitempty"`
}

type imageURL struct {
	URL string `json:"url"`
}

type chatToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function functionCall `json:"function"`
}

type functionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type chatTool struct {
	Type     string      `json:"type"`
	Function functionDef `json:"function"`
}

type functionDef struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters"`
}

// emptySchema is the parameters of a tool with no input schema.
var emptySchema = json.RawMessage(`{"type":"object","properties":{}}`)

// textPart is a text part pointing at s, which stays in the request
// (no copy per call).
func textPart(s *string) contentPart { return contentPart{Type: "text", Text: s} }

// params maps a request to the Chat Completions wire format.
func (p *Provider) params(req *provider.Request, model string) (*chatRequest, error) {
	if model == "" {
		return nil, p.errorf(model, errs.InvalidArgument, "no model: the request names none and no default model is configured")
	}
	params := &chatRequest{Model: model, Messages: make([]chatMessage, 0, len(req.Messages)+1)}
	if req.System != "" {
		params.Messages = append(params.Messages, chatMessage{Role: "system", Content: req.System})
	}
	for i, m := range req.Messages {
		var err error
		switch m.Role {
		case provider.User:
			params.Messages, err = p.userMessages(params.Messages, model, i, m.Parts)
		case provider.Assistant:
			params.Messages, err = p.assistantMessage(params.Messages, model, i, m.Parts)
		default:
			err = p.errorf(model, errs.InvalidArgument, "message %d: unknown role %d", i, int(m.Role))
		}
		if err != nil {
			return nil, err
		}
	}
	if len(params.Messages) == 0 {
		return nil, p.errorf(model, errs.InvalidArgument, "the request has no messages")
	}
	tools, err := p.toolsJSON(model, req.Tools)
	if err != nil {
		return nil, err
	}
	params.tools = tools
	maxTokens := req.MaxTokens
	if maxTokens == 0 {
		maxTokens = p.maxTokens
	}
	switch {
	case maxTokens < 0:
		return nil, p.errorf(model, errs.InvalidArgument, "max tokens %d is negative", maxTokens)
	case maxTokens == 0:
	case p.compatible:
		// Many compatible servers know only the older field.
		params.MaxTokens = maxTokens
	default:
		// OpenAI deprecated max_tokens; reasoning models reject it.
		params.MaxCompletionTokens = maxTokens
	}
	// Model parameters: Chat Completions takes them all. A compatible
	// server that does not know one ignores or refuses it; its refusal
	// comes back as the server's own error.
	params.Temperature = req.Temperature
	params.ReasoningEffort = req.ReasoningEffort
	if req.OutputSchema != nil {
		params.ResponseFormat = &responseFormat{Type: "json_schema", JSONSchema: jsonSchema{Name: "output", Schema: req.OutputSchema}}
	}
	return params, nil
}

// userMessages appends one user message: its tool results become "tool"
// messages, first and in order (they must directly follow the assistant
// message that asked for them); its text and images become one "user"
// message after them.
func (p *Provider) userMessages(out []chatMessage, model string, i int, parts []provider.Part) ([]chatMessage, error) {
	n := len(out)
	var content []contentPart
	for j := range parts {
		part := &parts[j]
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
			// Content is always sent, even empty: the API requires it.
			out = append(out, chatMessage{Role: "tool", ToolCallID: r.ToolUseID, Content: text})
		case part.Image != nil:
			u, err := p.imageURL(model, i, j, part.Image)
			if err != nil {
				return nil, err
			}
			content = append(content, contentPart{Type: "image_url", ImageURL: &imageURL{URL: u}})
		default:
			content = append(content, textPart(&part.Text))
		}
	}
	switch {
	case len(content) == 0:
	case len(content) == 1 && content[0].Text != nil:
		out = append(out, chatMessage{Role: "user", Content: *content[0].Text})
	default:
		out = append(out, chatMessage{Role: "user", Content: content})
	}
	if len(out) == n {
		return nil, p.errorf(model, errs.InvalidArgument, "message %d: empty user message", i)
	}
	return out, nil
}

// assistantMessage appends one assistant message: text as content (a
// string for one part, text parts for several), tool calls as tool_calls
// with the input as the arguments string.
func (p *Provider) assistantMessage(out []chatMessage, model string, i int, parts []provider.Part) ([]chatMessage, error) {
	var texts []contentPart
	var calls []chatToolCall
	for j := range parts {
		part := &parts[j]
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
			calls = append(calls, chatToolCall{ID: u.ID, Type: "function", Function: functionCall{Name: u.Name, Arguments: args}})
		default:
			texts = append(texts, textPart(&part.Text))
		}
	}
	msg := chatMessage{Role: "assistant", ToolCalls: calls}
	switch len(texts) {
	case 0:
		if len(calls) == 0 {
			return nil, p.errorf(model, errs.InvalidArgument, "message %d: empty assistant message", i)
		}
	case 1:
		msg.Content = *texts[0].Text
	default:
		msg.Content = texts
	}
	return append(out, msg), nil
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
// parameters. The schema is sent as written.
func (p *Provider) tool(model string, t provider.ToolSpec) (chatTool, error) {
	if t.Name == "" {
		return chatTool{}, p.errorf(model, errs.InvalidArgument, "tool without a name")
	}
	schema := emptySchema
	if s := bytes.TrimSpace(t.InputSchema); len(s) > 0 {
		if s[0] != '{' || !json.Valid(s) {
			return chatTool{}, p.errorf(model, errs.InvalidArgument, "tool %q: input schema is not a JSON object", t.Name)
		}
		schema = json.RawMessage(s)
	}
	return chatTool{Type: "function", Function: functionDef{Name: t.Name, Description: t.Description, Parameters: schema}}, nil
}
