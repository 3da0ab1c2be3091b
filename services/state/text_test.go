package state

import (
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/structpb"
)

func TestValueText(t *testing.T) {
	v, err := structpb.NewValue(map[string]any{
		"b": []any{"second", 2.0, true, nil, map[string]any{"z": "fourth", "a": "third"}},
		"a": "first",
		"c": "",
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := valueText(v); got != "first\nsecond\nthird\nfourth" {
		t.Fatalf("valueText = %q", got)
	}
	if got := valueText(structpb.NewNumberValue(3)); got != "" {
		t.Fatalf("valueText(number) = %q", got)
	}
}

func TestSnippet(t *testing.T) {
	find := func(text, term string) []span {
		var out []span
		for i := 0; ; {
			j := strings.Index(text[i:], term)
			if j < 0 {
				return out
			}
			out = append(out, span{i + j, i + j + len(term)})
			i += j + len(term)
		}
	}
	short := "a short text\nwith two lines"
	if got := snippet(short, find(short, "two")); got != "a short text with two lines" {
		t.Fatalf("short snippet = %q", got)
	}
	if got := snippet(short, nil); got != "a short text with two lines" {
		t.Fatalf("no-match snippet = %q", got)
	}
	// The densest cluster wins over the first match.
	text := "needle " + strings.Repeat("hay ", 100) + "needle needle needle " + strings.Repeat("straw ", 100)
	got := snippet(text, find(text, "needle"))
	if strings.Count(got, "needle") != 3 || !strings.HasPrefix(got, "…") || !strings.HasSuffix(got, "…") {
		t.Fatalf("cluster snippet = %q", got)
	}
	// Multi-byte text is cut on rune boundaries.
	uni := strings.Repeat("日本語の文章です。", 40) + "目標" + strings.Repeat("もっと長い文章。", 40)
	got = snippet(uni, find(uni, "目標"))
	if !utf8.ValidString(got) || !strings.Contains(got, "目標") || len(got) > snippetBytes+2*len("…") {
		t.Fatalf("unicode snippet = %q", got)
	}
	// A match at the very end stays visible.
	tail := strings.Repeat("word ", 100) + "finale"
	if got := snippet(tail, find(tail, "finale")); !strings.HasSuffix(got, "finale") {
		t.Fatalf("tail snippet = %q", got)
	}
}

func TestTokenize(t *testing.T) {
	got := tokenize("Hello, wörld! 42x e\u0301t")
	var terms []string
	for _, tk := range got {
		terms = append(terms, tk.term)
	}
	if strings.Join(terms, "|") != "hello|wörld|42x|e\u0301t" {
		t.Fatalf("tokenize = %q", terms)
	}
	if got[1].start != 7 || got[1].end != 13 {
		t.Fatalf("span %+v", got[1])
	}
}
