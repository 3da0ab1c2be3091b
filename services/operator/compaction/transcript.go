package compaction

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/secbear/neuron/services/operator/provider"
)

// Abbreviation limits of the transcript, in bytes.
const (
	maxToolInputBytes  = 500
	maxToolResultBytes = 1000
	maxImageURLBytes   = 200
)

// transcript renders msgs as plain text, one entry per part, entries
// separated by blank lines:
//
//	User: <text>
//	Assistant: <text>
//	Assistant called tool <name> (id <id>): <input, abbreviated>
//	Tool result from <name> (id <id>): <content, abbreviated>
//	Tool error from <name> (id <id>): <content, abbreviated>
//	User: [image <media type or URL>]
//
// An entry longer than a quarter of maxBytes is abbreviated. When the
// entries still exceed maxBytes, the first entries up to a quarter of it
// and the last ones in the rest are kept, with a line counting the
// entries left out between them.
func transcript(msgs []provider.Message, maxBytes int) string {
	entries := render(msgs, maxBytes/4)
	const sep = "\n\n"
	total := 0
	for _, e := range entries {
		total += len(e) + len(sep)
	}
	if total <= maxBytes {
		return strings.Join(entries, sep)
	}
	marker := func(n int) string { return fmt.Sprintf("[... %d entries left out ...]", n) }
	room := maxBytes - len(marker(len(entries))) - len(sep)
	head, headRoom := 0, room/4
	for head < len(entries) && len(entries[head])+len(sep) <= headRoom {
		headRoom -= len(entries[head]) + len(sep)
		room -= len(entries[head]) + len(sep)
		head++
	}
	tail := len(entries)
	for tail > head && len(entries[tail-1])+len(sep) <= room {
		tail--
		room -= len(entries[tail]) + len(sep)
	}
	out := make([]string, 0, head+1+len(entries)-tail)
	out = append(out, entries[:head]...)
	out = append(out, marker(tail-head))
	out = append(out, entries[tail:]...)
	return strings.Join(out, sep)
}

func render(msgs []provider.Message, maxEntry int) []string {
	names := map[string]string{} // tool call id → tool name
	var out []string
	for _, m := range msgs {
		role := "User"
		if m.Role == provider.Assistant {
			role = "Assistant"
		}
		for _, p := range m.Parts {
			var e string
			switch {
			case p.ToolUse != nil:
				names[p.ToolUse.ID] = p.ToolUse.Name
				e = fmt.Sprintf("%s called tool %s (id %s): %s", role, p.ToolUse.Name, p.ToolUse.ID, abbreviate(string(p.ToolUse.Input), maxToolInputBytes))
			case p.ToolResult != nil:
				kind := "result"
				if p.ToolResult.IsError {
					kind = "error"
				}
				name := names[p.ToolResult.ToolUseID]
				if name == "" {
					name = "a tool"
				}
				e = fmt.Sprintf("Tool %s from %s (id %s): %s", kind, name, p.ToolResult.ToolUseID, abbreviate(p.ToolResult.Content, maxToolResultBytes))
			case p.Image != nil:
				what := p.Image.MediaType
				if p.Image.URL != "" {
					what = abbreviate(p.Image.URL, maxImageURLBytes)
				}
				e = fmt.Sprintf("%s: [image %s]", role, what)
			default:
				if strings.TrimSpace(p.Text) == "" {
					continue
				}
				e = role + ": " + p.Text
			}
			out = append(out, abbreviate(e, maxEntry))
		}
	}
	return out
}

// abbreviate cuts s to at most n bytes, at a rune boundary, followed by a
// note of how many bytes were left out.
func abbreviate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := max(n, 0)
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return fmt.Sprintf("%s… [%d more bytes]", s[:i], len(s)-i)
}
