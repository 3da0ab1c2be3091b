package content

import (
	"strings"

	"google.golang.org/protobuf/types/known/structpb"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
)

// Text returns content holding one text block. Text("") is a Content with
// one empty text block, not empty content.
func Text(s string) *typesv1.Content {
	return FromBlocks(TextBlock(s))
}

// FromBlocks returns content holding the blocks, in order. With no blocks
// it returns empty content (never nil).
func FromBlocks(blocks ...*typesv1.ContentBlock) *typesv1.Content {
	return &typesv1.Content{Blocks: blocks}
}

// TextBlock returns a plain-text block.
func TextBlock(s string) *typesv1.ContentBlock {
	return &typesv1.ContentBlock{Block: &typesv1.ContentBlock_Text{
		Text: &typesv1.TextBlock{Text: s},
	}}
}

// ImageURL returns an image block that the model provider fetches from an
// http(s) or data URL.
func ImageURL(url string) *typesv1.ContentBlock {
	return &typesv1.ContentBlock{Block: &typesv1.ContentBlock_Image{
		Image: &typesv1.ImageBlock{Source: &typesv1.ImageBlock_Url{Url: url}},
	}}
}

// ImageData returns an inline image block. mediaType, such as
// "image/png", is required for inline data.
func ImageData(mediaType string, data []byte) *typesv1.ContentBlock {
	return &typesv1.ContentBlock{Block: &typesv1.ContentBlock_Image{
		Image: &typesv1.ImageBlock{
			Source:    &typesv1.ImageBlock_Data{Data: data},
			MediaType: mediaType,
		},
	}}
}

// ToolUse returns a tool call block. input holds the arguments, normally a
// JSON object built with structpb.NewStructValue or structpb.NewValue; nil
// means no arguments.
func ToolUse(id, name string, input *structpb.Value) *typesv1.ContentBlock {
	return &typesv1.ContentBlock{Block: &typesv1.ContentBlock_ToolUse{
		ToolUse: &typesv1.ToolUseBlock{Id: id, Name: name, Input: input},
	}}
}

// ToolResult returns the result of the tool call toolUseID. When isError
// is true, content explains the failure.
func ToolResult(toolUseID, content string, isError bool) *typesv1.ContentBlock {
	return &typesv1.ContentBlock{Block: &typesv1.ContentBlock_ToolResult{
		ToolResult: &typesv1.ToolResultBlock{
			ToolUseId: toolUseID,
			Content:   content,
			IsError:   isError,
		},
	}}
}

// Custom returns an extension block. contentType is a namespaced type
// name such as "acme.audio/v1"; data is any JSON value.
func Custom(contentType string, data *structpb.Value) *typesv1.ContentBlock {
	return &typesv1.ContentBlock{Block: &typesv1.ContentBlock_Custom{
		Custom: &typesv1.CustomBlock{ContentType: contentType, Data: data},
	}}
}

// TextOf returns the text blocks of c joined with no separator, in order;
// other blocks are skipped. Text streamed as deltas and stored as several
// blocks thus reads back as it was produced. TextOf(nil) is "".
func TextOf(c *typesv1.Content) string {
	var b strings.Builder
	for _, block := range c.GetBlocks() {
		if t := block.GetText(); t != nil {
			b.WriteString(t.GetText())
		}
	}
	return b.String()
}

// ToolUses returns the tool-use blocks of c, in order, or nil when there
// are none. The blocks are shared with c, not copied.
func ToolUses(c *typesv1.Content) []*typesv1.ToolUseBlock {
	var uses []*typesv1.ToolUseBlock
	for _, block := range c.GetBlocks() {
		if u := block.GetToolUse(); u != nil {
			uses = append(uses, u)
		}
	}
	return uses
}
