package content_test

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
)

func TestConstructors(t *testing.T) {
	args, err := structpb.NewValue(map[string]any{"path": "/tmp/a"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		got  *typesv1.ContentBlock
		want *typesv1.ContentBlock
	}{
		{
			name: "text",
			got:  content.TextBlock("hi"),
			want: &typesv1.ContentBlock{Block: &typesv1.ContentBlock_Text{Text: &typesv1.TextBlock{Text: "hi"}}},
		},
		{
			name: "image url",
			got:  content.ImageURL("https://example.com/a.png"),
			want: &typesv1.ContentBlock{Block: &typesv1.ContentBlock_Image{Image: &typesv1.ImageBlock{
				Source: &typesv1.ImageBlock_Url{Url: "https://example.com/a.png"},
			}}},
		},
		{
			name: "image data",
			got:  content.ImageData("image/png", []byte{0x89, 'P', 'N', 'G'}),
			want: &typesv1.ContentBlock{Block: &typesv1.ContentBlock_Image{Image: &typesv1.ImageBlock{
				Source:    &typesv1.ImageBlock_Data{Data: []byte{0x89, 'P', 'N', 'G'}},
				MediaType: "image/png",
			}}},
		},
		{
			name: "tool use",
			got:  content.ToolUse("call_1", "read_file", args),
			want: &typesv1.ContentBlock{Block: &typesv1.ContentBlock_ToolUse{ToolUse: &typesv1.ToolUseBlock{
				Id: "call_1", Name: "read_file", Input: args,
			}}},
		},
		{
			name: "tool result error",
			got:  content.ToolResult("call_1", "no such file", true),
			want: &typesv1.ContentBlock{Block: &typesv1.ContentBlock_ToolResult{ToolResult: &typesv1.ToolResultBlock{
				ToolUseId: "call_1", Content: "no such file", IsError: true,
			}}},
		},
		{
			name: "custom",
			got:  content.Custom("acme.audio/v1", structpb.NewStringValue("AAAA")),
			want: &typesv1.ContentBlock{Block: &typesv1.ContentBlock_Custom{Custom: &typesv1.CustomBlock{
				ContentType: "acme.audio/v1", Data: structpb.NewStringValue("AAAA"),
			}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !proto.Equal(tt.got, tt.want) {
				t.Errorf("got %v, want %v", tt.got, tt.want)
			}
		})
	}
}

func TestTextAndFromBlocks(t *testing.T) {
	if got := content.Text("hello"); len(got.GetBlocks()) != 1 || got.GetBlocks()[0].GetText().GetText() != "hello" {
		t.Errorf("Text(hello) = %v, want one text block", got)
	}
	if got := content.FromBlocks(); got == nil || len(got.GetBlocks()) != 0 {
		t.Errorf("FromBlocks() = %v, want empty non-nil content", got)
	}
}

func TestTextOf(t *testing.T) {
	tests := []struct {
		name string
		in   *typesv1.Content
		want string
	}{
		{"nil", nil, ""},
		{"empty", content.FromBlocks(), ""},
		{"one block", content.Text("hello"), "hello"},
		{"deltas concatenate", content.FromBlocks(content.TextBlock("hel"), content.TextBlock("lo")), "hello"},
		{
			name: "other blocks skipped",
			in: content.FromBlocks(
				content.TextBlock("a"),
				content.ToolUse("1", "t", nil),
				content.ImageURL("https://example.com/x.png"),
				content.TextBlock("b"),
				content.ToolResult("1", "not text", false),
				content.Custom("x/v1", nil),
			),
			want: "ab",
		},
		{"nil block", &typesv1.Content{Blocks: []*typesv1.ContentBlock{nil, content.TextBlock("x")}}, "x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := content.TextOf(tt.in); got != tt.want {
				t.Errorf("TextOf = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestToolUses(t *testing.T) {
	tests := []struct {
		name    string
		in      *typesv1.Content
		wantIDs []string
	}{
		{"nil", nil, nil},
		{"text only", content.Text("hi"), nil},
		{
			name: "in order",
			in: content.FromBlocks(
				content.ToolUse("a", "x", nil),
				content.TextBlock("between"),
				content.ToolResult("a", "done", false),
				content.ToolUse("b", "y", structpb.NewNullValue()),
			),
			wantIDs: []string{"a", "b"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := content.ToolUses(tt.in)
			if len(got) != len(tt.wantIDs) {
				t.Fatalf("ToolUses returned %d blocks, want %d", len(got), len(tt.wantIDs))
			}
			for i, u := range got {
				if u.GetId() != tt.wantIDs[i] {
					t.Errorf("block %d id = %q, want %q", i, u.GetId(), tt.wantIDs[i])
				}
			}
		})
	}
}
