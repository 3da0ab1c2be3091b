package openairesponses

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"

	"github.com/secbear/neuron/services/operator/provider"
)

// ErrorPrefix starts the output of a function_call_output item whose tool
// result is an error: the Responses API has no is_error flag.
const ErrorPrefix = "ERROR: "

// Limits of the API's metadata object; entries beyond them are not sent.
const (
	maxMetadataKeys     = 16
	maxMetadataKeyLen   = 64
	maxMetadataValueLen = 512
)

// inputItems maps each message to its input items, one slice per message,
// so that a chained call can send the items of the new messages only.
func inputItems(msgs []provider.Message) ([][]responses.ResponseInputItemUnionParam, error) {
	out := make([][]responses.ResponseInputItemUnionParam, len(msgs))
	for i, m := range msgs {
		items, err := messageItems(m)
		if err != nil {
			return nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
		out[i] = items
	}
	return out, nil
}

// messageItems maps one message to input items, keeping the order of its
// parts: runs of text and images become a message item (input_text and
// input_image for the user, output_text for the assistant), tool calls
// become function_call items and tool results function_call_output items.
func messageItems(m provider.Message) ([]responses.ResponseInputItemUnionParam, error) {
	if m.Role != provider.User && m.Role != provider.Assistant {
		return nil, fmt.Errorf("unknown role %d", int(m.Role))
	}
	var (
		items   []responses.ResponseInputItemUnionParam
		user    responses.ResponseInputMessageContentListParam
		written []responses.ResponseOutputMessageContentUnionParam
	)
	flush := func() {
		if len(user) > 0 {
			items = append(items, responses.ResponseInputItemUnionParam{OfMessage: &responses.EasyInputMessageParam{
				Type:    responses.EasyInputMessageTypeMessage,
				Role:    responses.EasyInputMessageRoleUser,
				Content: responses.EasyInputMessageContentUnionParam{OfInputItemContentList: user},
			}})
			user = nil
		}
		if len(written) > 0 {
			// No id and no status: the API accepts assistant history
			// without them. annotations is sent empty because strict
			// implementations of the API require it.
			items = append(items, responses.ResponseInputItemUnionParam{OfOutputMessage: &responses.ResponseOutputMessageParam{
				Content: written,
			}})
			written = nil
		}
	}
	for j, p := range m.Parts {
		switch {
		case p.ToolUse != nil:
			flush()
			items = append(items, responses.ResponseInputItemUnionParam{OfFunctionCall: &responses.ResponseFunctionToolCallParam{
				CallID:    p.ToolUse.ID,
				Name:      p.ToolUse.Name,
				Arguments: string(p.ToolUse.Input),
			}})
		case p.ToolResult != nil:
			flush()
			output := p.ToolResult.Content
			if p.ToolResult.IsError {
				output = ErrorPrefix + output
			}
			items = append(items, responses.ResponseInputItemUnionParam{OfFunctionCallOutput: &responses.ResponseInputItemFunctionCallOutputParam{
				CallID: openai.String(p.ToolResult.ToolUseID),
				Output: responses.ResponseInputItemFunctionCallOutputOutputUnionParam{OfString: openai.String(output)},
			}})
		case p.Image != nil:
			if m.Role == provider.Assistant {
				return nil, fmt.Errorf("parts[%d]: the Responses API takes no images in assistant messages", j)
			}
			url, err := imageURL(p.Image)
			if err != nil {
				return nil, fmt.Errorf("parts[%d]: %w", j, err)
			}
			user = append(user, responses.ResponseInputContentUnionParam{OfInputImage: &responses.ResponseInputImageParam{
				Detail:   responses.ResponseInputImageDetailAuto,
				ImageURL: openai.String(url),
			}})
		case p.Text == "":
			// The API rejects empty text content.
		case m.Role == provider.User:
			user = append(user, responses.ResponseInputContentUnionParam{OfInputText: &responses.ResponseInputTextParam{Text: p.Text}})
		default:
			written = append(written, responses.ResponseOutputMessageContentUnionParam{OfOutputText: &responses.ResponseOutputTextParam{
				Text:        p.Text,
				Annotations: []responses.ResponseOutputTextAnnotationUnionParam{},
			}})
		}
	}
	flush()
	return items, nil
}

// imageURL is the image's URL, or a base64 data URL for inline data (its
// media type sniffed when not given).
func imageURL(img *provider.Image) (string, error) {
	switch {
	case img.URL != "" && len(img.Data) > 0:
		return "", fmt.Errorf("image has both data and a URL")
	case img.URL != "":
		return img.URL, nil
	case len(img.Data) > 0:
		mt := img.MediaType
		if mt == "" {
			mt = http.DetectContentType(img.Data)
		}
		return "data:" + mt + ";base64," + base64.StdEncoding.EncodeToString(img.Data), nil
	}
	return "", fmt.Errorf("image has neither data nor a URL")
}

// tools maps tool specs to function tools. The schema is sent as is
// (strict mode off, so any JSON Schema object is accepted); an empty
// schema becomes an object schema without properties.
func tools(specs []provider.ToolSpec) ([]responses.ToolUnionParam, error) {
	var out []responses.ToolUnionParam
	for i, s := range specs {
		if s.Name == "" {
			return nil, fmt.Errorf("tools[%d]: empty name", i)
		}
		params, err := schemaObject(s.InputSchema)
		if err != nil {
			return nil, fmt.Errorf("tools[%d] (%s): input schema: %w", i, s.Name, err)
		}
		fn := &responses.FunctionToolParam{
			Name:       s.Name,
			Parameters: params,
			Strict:     openai.Bool(false),
		}
		if s.Description != "" {
			fn.Description = openai.String(s.Description)
		}
		out = append(out, responses.ToolUnionParam{OfFunction: fn})
	}
	return out, nil
}

// schemaObject splits a JSON Schema object into its members, each kept as
// raw JSON so the schema reaches the API byte for byte (numbers included).
func schemaObject(schema json.RawMessage) (map[string]any, error) {
	if len(bytes.TrimSpace(schema)) == 0 {
		return map[string]any{"type": "object", "properties": map[string]any{}}, nil
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(schema, &members); err != nil || members == nil {
		return nil, fmt.Errorf("not a JSON object")
	}
	out := make(map[string]any, len(members))
	for k, v := range members {
		out[k] = v
	}
	return out, nil
}

// metadata is the request's string-valued metadata that fits the API's
// limits (16 keys of at most 64 characters, values of at most 512), the
// first 16 keys in sorted order; other entries are not sent.
func metadata(md map[string]any) shared.Metadata {
	keys := make([]string, 0, len(md))
	for k, v := range md {
		if s, ok := v.(string); ok && k != "" && len(k) <= maxMetadataKeyLen && len(s) <= maxMetadataValueLen {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	slices.Sort(keys)
	if len(keys) > maxMetadataKeys {
		keys = keys[:maxMetadataKeys]
	}
	out := make(shared.Metadata, len(keys))
	for _, k := range keys {
		out[k] = md[k].(string)
	}
	return out
}
