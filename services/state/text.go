package state

import (
	"maps"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/structpb"
)

// valueText is the searchable text of a JSON value: its string leaves in
// document order (object fields sorted by name), one per line. Numbers,
// booleans, nulls and field names are not indexed.
func valueText(v *structpb.Value) string {
	var b strings.Builder
	appendText(&b, v)
	return b.String()
}

func appendText(b *strings.Builder, v *structpb.Value) {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		if k.StringValue == "" {
			return
		}
		if b.Len() > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(k.StringValue)
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			appendText(b, e)
		}
	case *structpb.Value_StructValue:
		fields := k.StructValue.GetFields()
		for _, name := range slices.Sorted(maps.Keys(fields)) {
			appendText(b, fields[name])
		}
	}
}

// span is a byte range [start, end) of a text.
type span struct{ start, end int }

// snippetBytes is the target length of a snippet; snippetLead is how much
// text precedes the first match shown.
const (
	snippetBytes = 200
	snippetLead  = 40
)

// snippet returns a plain-text fragment of text of about snippetBytes
// around the densest cluster of matches (the start of the text when there
// are none), cut on UTF-8 boundaries, preferably at spaces, with "…"
// where text was cut and line breaks shown as spaces.
func snippet(text string, matches []span) string {
	if text == "" {
		return ""
	}
	matches = slices.Clone(matches)
	slices.SortFunc(matches, func(a, b span) int { return a.start - b.start })
	from := 0
	if len(matches) > 0 {
		best, bestCount := 0, 0
		j := 0
		for i := range matches {
			if j < i {
				j = i
			}
			for j < len(matches) && matches[j].end <= matches[i].start-snippetLead+snippetBytes {
				j++
			}
			if n := j - i; n > bestCount {
				best, bestCount = i, n
			}
		}
		from = max(0, matches[best].start-snippetLead)
	}
	to := min(len(text), from+snippetBytes)
	if to == len(text) {
		from = max(0, to-snippetBytes)
	}
	from = alignStart(text, from, matches)
	to = alignEnd(text, to)
	out := strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' || r == '\t' {
			return ' '
		}
		return r
	}, text[from:to])
	if from > 0 {
		out = "…" + out
	}
	if to < len(text) {
		out += "…"
	}
	return out
}

// alignStart moves from forward to a rune boundary, then past a partial
// word when a space is near (never past the first match at or after it).
func alignStart(text string, from int, matches []span) int {
	for from < len(text) && !utf8.RuneStart(text[from]) {
		from++
	}
	if from == 0 {
		return 0
	}
	limit := min(len(text), from+15)
	for _, m := range matches {
		if m.start >= from {
			limit = min(limit, m.start)
			break
		}
	}
	if i := strings.IndexByte(text[from:limit], ' '); i >= 0 {
		return from + i + 1
	}
	return from
}

// alignEnd moves to back to a rune boundary, then back to a space when
// one is near, so the last word is whole.
func alignEnd(text string, to int) int {
	if to >= len(text) {
		return len(text)
	}
	for to > 0 && !utf8.RuneStart(text[to]) {
		to--
	}
	lo := max(0, to-15)
	if i := strings.LastIndexByte(text[lo:to], ' '); i >= 0 {
		return lo + i
	}
	return to
}

// token is a word of a text with its byte range, for the memory
// backend's search.
type token struct {
	term string
	span
}

// tokenize splits text into lower-cased runs of letters and digits.
func tokenize(text string) []token {
	var out []token
	start := -1
	for i, r := range text {
		word := unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r)
		switch {
		case word && start < 0:
			start = i
		case !word && start >= 0:
			out = append(out, token{strings.ToLower(text[start:i]), span{start, i}})
			start = -1
		}
	}
	if start >= 0 {
		out = append(out, token{strings.ToLower(text[start:]), span{start, len(text)}})
	}
	return out
}
