package gemini

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"mime"
	"net/http"
	"net/url"
	"path"
	"strings"

	"google.golang.org/genai"

	"github.com/secbear/neuron/services/operator/provider"
)

// GeneratedIDPrefix starts the ids this package gives function calls that
// came without one: "gemini_call_<n>".
const GeneratedIDPrefix = "gemini_call_"

// RawArgsKey is the key under which a tool call whose stored input is not
// a JSON object is sent back to Gemini: {"_raw": "<input as a string>"}.
const RawArgsKey = "_raw"

// ThoughtSignatureSentinel is the thought signature sent on the first
// function call of each model turn replayed to Gemini. Gemini 3 models
// require the signature they returned with a function call to come back
// with it; the provider interface has nowhere to keep it, so the request
// carries the value Google documents for skipping that validation instead.
const ThoughtSignatureSentinel = "skip_thought_signature_validator"

// Wire roles of contents.
const (
	roleUser  = "user"
	roleModel = "model"
)

// buildContents maps the conversation to Gemini contents, merging
// consecutive messages of the same role into one content.
func buildContents(msgs []provider.Message) ([]*genai.Content, error) {
	var out []*genai.Content
	for i, m := range msgs {
		var role string
		switch m.Role {
		case provider.User:
			role = roleUser
		case provider.Assistant:
			role = roleModel
		default:
			return nil, fmt.Errorf("message %d has no valid role (%d)", i, m.Role)
		}
		var parts []*genai.Part
		for j, p := range m.Parts {
			part, err := buildPart(msgs, i, role, p)
			if err != nil {
				return nil, fmt.Errorf("message %d part %d: %w", i, j, err)
			}
			if part != nil {
				parts = append(parts, part)
			}
		}
		if len(parts) == 0 {
			continue
		}
		if n := len(out); n > 0 && out[n-1].Role == role {
			out[n-1].Parts = append(out[n-1].Parts, parts...)
			continue
		}
		out = append(out, &genai.Content{Role: role, Parts: parts})
	}
	if len(out) == 0 {
		return nil, errors.New("the request has no message content")
	}
	for _, c := range out {
		if c.Role != roleModel {
			continue
		}
		for _, p := range c.Parts {
			if p.FunctionCall != nil {
				p.ThoughtSignature = []byte(ThoughtSignatureSentinel)
				break
			}
		}
	}
	return out, nil
}

// buildPart maps part p of message i; nil for an empty text part.
func buildPart(msgs []provider.Message, i int, role string, p provider.Part) (*genai.Part, error) {
	switch {
	case p.ToolUse != nil:
		if role != roleModel {
			return nil, errors.New("a tool call in a user message")
		}
		return &genai.Part{FunctionCall: &genai.FunctionCall{
			ID:   wireID(p.ToolUse.ID),
			Name: p.ToolUse.Name,
			Args: callArgs(p.ToolUse.Input),
		}}, nil
	case p.ToolResult != nil:
		if role != roleUser {
			return nil, errors.New("a tool result in an assistant message")
		}
		r := p.ToolResult
		name, ok := toolName(msgs[:i], r.ToolUseID)
		if !ok {
			return nil, fmt.Errorf("tool result %q matches no earlier tool call", r.ToolUseID)
		}
		key := "output"
		if r.IsError {
			key = "error"
		}
		return &genai.Part{FunctionResponse: &genai.FunctionResponse{
			ID:       wireID(r.ToolUseID),
			Name:     name,
			Response: map[string]any{key: r.Content},
		}}, nil
	case p.Image != nil:
		return imagePart(p.Image)
	case p.Text == "":
		return nil, nil
	default:
		return &genai.Part{Text: p.Text}, nil
	}
}

// wireID is the id sent to Gemini for a call: none for the ids this
// package made up, since Gemini never saw them.
func wireID(id string) string {
	if strings.HasPrefix(id, GeneratedIDPrefix) {
		return ""
	}
	return id
}

// toolName finds the name of the tool call id in the assistant messages
// before a result, the latest first.
func toolName(before []provider.Message, id string) (string, bool) {
	if id == "" {
		return "", false
	}
	for i := len(before) - 1; i >= 0; i-- {
		if before[i].Role != provider.Assistant {
			continue
		}
		for _, p := range before[i].Parts {
			if p.ToolUse != nil && p.ToolUse.ID == id {
				return p.ToolUse.Name, true
			}
		}
	}
	return "", false
}

// callArgs decodes a stored tool input into Gemini's args object. Empty
// input is {}; input that is not a JSON object (malformed JSON the model
// once produced, or another JSON value) becomes {"_raw": "<input>"}.
func callArgs(raw json.RawMessage) map[string]any {
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 {
		return map[string]any{}
	}
	if trimmed[0] == '{' {
		dec := json.NewDecoder(bytes.NewReader(trimmed))
		dec.UseNumber()
		var m map[string]any
		if err := dec.Decode(&m); err == nil && m != nil && onlySpaceAfter(dec, trimmed) {
			return m
		}
	}
	return map[string]any{RawArgsKey: string(raw)}
}

// onlySpaceAfter reports whether nothing but white space follows the value
// dec decoded from data.
func onlySpaceAfter(dec *json.Decoder, data []byte) bool {
	return len(bytes.TrimSpace(data[dec.InputOffset():])) == 0
}

// imagePart maps an image: bytes (or a data: URL) inline, any other URL as
// file data.
func imagePart(img *provider.Image) (*genai.Part, error) {
	switch {
	case len(img.Data) > 0:
		mt := img.MediaType
		if mt == "" {
			mt = http.DetectContentType(img.Data)
		}
		return &genai.Part{InlineData: &genai.Blob{Data: img.Data, MIMEType: mt}}, nil
	case strings.HasPrefix(img.URL, "data:"):
		data, mt, err := parseDataURL(img.URL)
		if err != nil {
			return nil, err
		}
		if img.MediaType != "" {
			mt = img.MediaType
		}
		return &genai.Part{InlineData: &genai.Blob{Data: data, MIMEType: mt}}, nil
	case img.URL != "":
		mt := img.MediaType
		if mt == "" {
			mt = mediaTypeOfURL(img.URL)
		}
		return &genai.Part{FileData: &genai.FileData{FileURI: img.URL, MIMEType: mt}}, nil
	default:
		return nil, errors.New("an image with neither data nor URL")
	}
}

// parseDataURL decodes data:[<media type>][;base64],<data>.
func parseDataURL(u string) ([]byte, string, error) {
	meta, payload, ok := strings.Cut(strings.TrimPrefix(u, "data:"), ",")
	if !ok {
		return nil, "", errors.New("an image data URL without a comma")
	}
	mt, isBase64 := strings.CutSuffix(meta, ";base64")
	if mt == "" {
		mt = "text/plain"
	}
	if !isBase64 {
		s, err := url.PathUnescape(payload)
		if err != nil {
			return nil, "", fmt.Errorf("an image data URL: %w", err)
		}
		return []byte(s), mt, nil
	}
	data, err := base64.StdEncoding.DecodeString(payload)
	if err != nil {
		if data, err = base64.RawStdEncoding.DecodeString(payload); err != nil {
			return nil, "", fmt.Errorf("an image data URL: invalid base64: %w", err)
		}
	}
	return data, mt, nil
}

// mediaTypeOfURL guesses a media type from a URL's file extension; "" when
// it cannot.
func mediaTypeOfURL(u string) string {
	p := u
	if parsed, err := url.Parse(u); err == nil {
		p = parsed.Path
	}
	mt := mime.TypeByExtension(strings.ToLower(path.Ext(p)))
	mt, _, _ = strings.Cut(mt, ";")
	return mt
}

// buildConfig maps the system prompt, tools and output cap.
func (p *Provider) buildConfig(req *provider.Request) (*genai.GenerateContentConfig, error) {
	off := false
	cfg := &genai.GenerateContentConfig{
		// One request per call: automatic continuation would send more
		// (and reconnect dropped streams on its own).
		AutomaticContinuation: &off,
	}
	if req.System != "" {
		cfg.SystemInstruction = &genai.Content{Parts: []*genai.Part{{Text: req.System}}}
	}
	maxTokens := req.MaxTokens
	if maxTokens < 0 {
		return nil, fmt.Errorf("max tokens %d is negative", maxTokens)
	}
	if maxTokens == 0 {
		maxTokens = p.maxTokens
	}
	if maxTokens > 0 {
		cfg.MaxOutputTokens = int32(min(maxTokens, math.MaxInt32))
	}
	// Model parameters: temperature (0 to 2), the thinking level
	// (minimal, low, medium, high) and the output schema (a JSON
	// response conforming to responseJsonSchema).
	if t := req.Temperature; t != nil {
		f := float32(*t)
		cfg.Temperature = &f
	}
	switch req.ReasoningEffort {
	case "":
	case provider.EffortMinimal, provider.EffortLow, provider.EffortMedium, provider.EffortHigh:
		cfg.ThinkingConfig = &genai.ThinkingConfig{ThinkingLevel: genai.ThinkingLevel(strings.ToUpper(req.ReasoningEffort))}
	default:
		return nil, fmt.Errorf("model parameter reasoning_effort: %q is not supported; this provider accepts minimal, low, medium or high", req.ReasoningEffort)
	}
	if req.OutputSchema != nil {
		cfg.ResponseMIMEType = "application/json"
		cfg.ResponseJsonSchema = req.OutputSchema
	}
	if len(req.Tools) > 0 {
		decls := make([]*genai.FunctionDeclaration, 0, len(req.Tools))
		for _, t := range req.Tools {
			d := &genai.FunctionDeclaration{Name: t.Name, Description: t.Description}
			if s := bytes.TrimSpace(t.InputSchema); len(s) > 0 {
				dec := json.NewDecoder(bytes.NewReader(s))
				dec.UseNumber()
				var schema any
				if err := dec.Decode(&schema); err != nil {
					return nil, fmt.Errorf("tool %q: input schema is not valid JSON: %v", t.Name, err)
				}
				if !onlySpaceAfter(dec, s) {
					return nil, fmt.Errorf("tool %q: input schema has data after the JSON value", t.Name)
				}
				d.ParametersJsonSchema = schema
			}
			decls = append(decls, d)
		}
		cfg.Tools = []*genai.Tool{{FunctionDeclarations: decls}}
	}
	return cfg, nil
}

// countToolUses is the number of tool calls already in the conversation:
// generated ids continue from it, so they are unique in a conversation.
func countToolUses(msgs []provider.Message) int {
	n := 0
	for _, m := range msgs {
		for _, p := range m.Parts {
			if p.ToolUse != nil {
				n++
			}
		}
	}
	return n
}
