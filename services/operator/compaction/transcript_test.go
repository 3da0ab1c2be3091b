package compaction

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/secbear/neuron/services/operator/provider"
)

func TestTranscript(t *testing.T) {
	long := strings.Repeat("x", 600)
	msgs := []provider.Message{
		user("Please fix main.go"),
		{Role: provider.Assistant, Parts: []provider.Part{
			{Text: "Reading it."},
			{ToolUse: &provider.ToolUse{ID: "c1", Name: "read", Input: json.RawMessage(`{"path":"main.go"}`)}},
		}},
		{Role: provider.User, Parts: []provider.Part{{ToolResult: &provider.ToolResult{ToolUseID: "c1", Content: "package main"}}}},
		{Role: provider.Assistant, Parts: []provider.Part{{ToolUse: &provider.ToolUse{ID: "c2", Name: "run", Input: json.RawMessage(long)}}}},
		{Role: provider.User, Parts: []provider.Part{{ToolResult: &provider.ToolResult{ToolUseID: "c2", Content: "exit 1", IsError: true}}}},
		{Role: provider.User, Parts: []provider.Part{
			{Image: &provider.Image{Data: []byte{1, 2}, MediaType: "image/png"}},
			{Image: &provider.Image{URL: "https://example.com/a.png"}},
		}},
		asst("  \n"),
		{Role: provider.User, Parts: []provider.Part{{ToolResult: &provider.ToolResult{ToolUseID: "zz", Content: "x"}}}},
		SummaryMessage("old facts"),
	}
	want := strings.Join([]string{
		"User: Please fix main.go",
		"Assistant: Reading it.",
		`Assistant called tool read (id c1): {"path":"main.go"}`,
		"Tool result from read (id c1): package main",
		"Assistant called tool run (id c2): " + long[:500] + "… [100 more bytes]",
		"Tool error from run (id c2): exit 1",
		"User: [image image/png]",
		"User: [image https://example.com/a.png]",
		"Tool result from a tool (id zz): x",
		"User: [Summary of the earlier conversation]\nold facts",
	}, "\n\n")
	if got := transcript(msgs, 1<<20); got != want {
		t.Errorf("transcript =\n%s\nwant\n%s", got, want)
	}
}

func TestTranscriptLeavesOutTheMiddle(t *testing.T) {
	var msgs []provider.Message
	var entries []string
	for i := range 20 {
		text := fmt.Sprintf("%02d", i) + strings.Repeat("-", 92) // "User: " + 94 = 100 bytes
		msgs = append(msgs, user(text))
		entries = append(entries, "User: "+text)
	}
	// 1000 bytes: the marker and its separator take 31, the head gets a
	// quarter of the remaining 969 (2 entries of 102 bytes), the tail the
	// rest (7 entries).
	want := strings.Join(append(append(entries[:2:2], "[... 11 entries left out ...]"), entries[13:]...), "\n\n")
	got := transcript(msgs, 1000)
	if got != want {
		t.Errorf("transcript =\n%s\nwant\n%s", got, want)
	}
	if len(got) > 1000 {
		t.Errorf("transcript is %d bytes, over 1000", len(got))
	}
}

func TestTranscriptAbbreviatesLongEntries(t *testing.T) {
	text := strings.Repeat("y", 1000)
	got := transcript([]provider.Message{user(text)}, 400)
	want := "User: " + strings.Repeat("y", 94) + "… [906 more bytes]"
	if got != want {
		t.Errorf("transcript = %q, want %q", got, want)
	}
}

func TestAbbreviate(t *testing.T) {
	tests := []struct {
		s    string
		n    int
		want string
	}{
		{"abc", 3, "abc"},
		{"abcd", 3, "abc… [1 more bytes]"},
		{"abcd", 0, "… [4 more bytes]"},
		{"日本語", 4, "日… [6 more bytes]"},
		{"日本語", 6, "日本… [3 more bytes]"},
		{"", 0, ""},
	}
	for _, tt := range tests {
		if got := abbreviate(tt.s, tt.n); got != tt.want {
			t.Errorf("abbreviate(%q, %d) = %q, want %q", tt.s, tt.n, got, tt.want)
		}
	}
}
