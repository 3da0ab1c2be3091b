package operator

import (
	"encoding/json"
	"fmt"
	"log/slog"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/services/operator/provider"
)

// toParts maps layer0 content to the loop's parts. Custom blocks become
// text (their JSON), with a warning: the internal model has no custom part.
func toParts(c *typesv1.Content, log *slog.Logger) []provider.Part {
	parts := make([]provider.Part, 0, len(c.GetBlocks()))
	for _, b := range c.GetBlocks() {
		switch k := b.GetBlock().(type) {
		case *typesv1.ContentBlock_Text:
			parts = append(parts, provider.Part{Text: k.Text.GetText()})
		case *typesv1.ContentBlock_Image:
			img := k.Image
			parts = append(parts, provider.Part{Image: &provider.Image{
				Data: img.GetData(), URL: img.GetUrl(), MediaType: img.GetMediaType(),
			}})
		case *typesv1.ContentBlock_ToolUse:
			parts = append(parts, provider.Part{ToolUse: &provider.ToolUse{
				ID: k.ToolUse.GetId(), Name: k.ToolUse.GetName(), Input: valueJSON(k.ToolUse.GetInput()),
			}})
		case *typesv1.ContentBlock_ToolResult:
			r := k.ToolResult
			parts = append(parts, provider.Part{ToolResult: &provider.ToolResult{
				ToolUseID: r.GetToolUseId(), Content: r.GetContent(), IsError: r.GetIsError(),
			}})
		case *typesv1.ContentBlock_Custom:
			data := valueJSON(k.Custom.GetData())
			if log != nil {
				log.Warn("custom content block passed to the model as text", "content_type", k.Custom.GetContentType())
			}
			parts = append(parts, provider.Part{Text: fmt.Sprintf("[%s] %s", k.Custom.GetContentType(), data)})
		}
	}
	return parts
}

// toContent maps the loop's parts back to layer0 content. A tool input
// that is not a JSON object (the model may send anything) is kept as a
// string under "_raw" so the content stays valid.
func toContent(parts []provider.Part) *typesv1.Content {
	c := &typesv1.Content{}
	for _, p := range parts {
		switch {
		case p.ToolUse != nil:
			c.Blocks = append(c.Blocks, content.ToolUse(p.ToolUse.ID, p.ToolUse.Name, inputValue(p.ToolUse.Input)))
		case p.ToolResult != nil:
			c.Blocks = append(c.Blocks, content.ToolResult(p.ToolResult.ToolUseID, p.ToolResult.Content, p.ToolResult.IsError))
		case p.Image != nil:
			if p.Image.URL != "" {
				c.Blocks = append(c.Blocks, content.ImageURL(p.Image.URL))
			} else {
				c.Blocks = append(c.Blocks, content.ImageData(p.Image.MediaType, p.Image.Data))
			}
		default:
			if p.Text != "" {
				c.Blocks = append(c.Blocks, content.TextBlock(p.Text))
			}
		}
	}
	return c
}

// textContent keeps only the text of parts, for the output message.
func textContent(parts []provider.Part) *typesv1.Content {
	c := &typesv1.Content{}
	for _, p := range parts {
		if p.IsText() && p.Text != "" {
			c.Blocks = append(c.Blocks, content.TextBlock(p.Text))
		}
	}
	return c
}

// valueJSON encodes a structpb value as JSON; nil is the empty object.
func valueJSON(v *structpb.Value) json.RawMessage {
	if v == nil {
		return json.RawMessage(`{}`)
	}
	b, err := protojson.Marshal(v)
	if err != nil {
		return json.RawMessage(`{}`)
	}
	return b
}

// jsonValue decodes JSON into a structpb value.
func jsonValue(raw json.RawMessage) (*structpb.Value, error) {
	v := &structpb.Value{}
	if err := protojson.Unmarshal(raw, v); err != nil {
		return nil, err
	}
	return v, nil
}

// inputValue is a tool input as a structpb object, whatever the model sent.
func inputValue(raw json.RawMessage) *structpb.Value {
	if v, err := jsonValue(raw); err == nil {
		if _, ok := v.GetKind().(*structpb.Value_StructValue); ok {
			return v
		}
	}
	return structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
		"_raw": structpb.NewStringValue(string(raw)),
	}})
}
